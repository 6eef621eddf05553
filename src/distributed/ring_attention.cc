// Ring attention: forward and backward over a sequence sharded across the ranks of a communicator
// (see attnscale/distributed.h).
//
// Forward, on rank r of K: at step s = 0..K−1 the rank holds the K/V shard of rank src = r − s (mod K)
// and, while it computes attention of its queries over those keys, already receives the next shard
// from r − 1 and sends the current one on to r + 1 (two buffers). Each block's (out_b, lse_b) is merged
// into the running result with the LSE merge (decode.h), in step order:
//   lse = log(e^lse + e^lse_b),  out = e^(lse_old − lse)·out + e^(lse_b − lse)·out_b.
// Backward: with the global out and lse, P_ij = exp(s·q_i·k_j − lse_i) and D_i = Σ dout_i∘out_i
// (− dlse_i when the loss reads lse: Options::dlse, each block given its rows' part), so
// each block's gradients are the public backward's on that block; dQ sums over steps locally, and the
// dK/dV accumulator of shard src travels with it: rank r adds its block to the sum received from
// r − 1 and passes it on; after K steps it is back home. The sums run in ring order, so the result
// is bitwise the same from run to run.
//
// A block's causal/window mask is the global one seen from the block's corner: query i (local) sees
// key j (local) when i + A <= j <= i + C, with A = off − left, C = off (causal) or off + right, and
// off = q_begin + D − k_begin (D = Nkv − Nq for bottom-right alignment, else 0). The block is cut so
// that this becomes a top-left window (left, right >= 0): rows i < −C see no key (dropped, they keep
// their running result), keys j < A are seen by no row (dropped).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <charconv>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attention/forward_scratch.h"
#include "attention/params.h"
#include "attnscale/decode.h"
#include "attnscale/distributed.h"
#include "attnscale/error.h"
#include "distributed/agreement.h"
#include "distributed/ring_memory.h"

namespace attnscale::distributed {
namespace {

constexpr int kKvTag = 7201, kGradTag = 7202;

struct Ring {
  MPI_Comm comm;
  int rank = 0, size = 1, left = 0, right = 0;
  explicit Ring(MPI_Comm c) : comm(c) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    left = (rank + size - 1) % size;
    right = (rank + 1) % size;
  }
};

void check(int code, const char* what) {
  if (code != MPI_SUCCESS) throw Error(std::string("MPI: ") + what + " failed");
}

// Rows [begin, begin + n) of a view whose dimension 2 is the sequence (rank 3 or 4).
TensorView rows(TensorView t, std::int64_t begin, std::int64_t n) {
  t.data = static_cast<char*>(t.data) + begin * t.strides[2] * static_cast<std::int64_t>(dtype_size(t.dtype));
  t.shape[2] = n;
  return t;
}

// Calls fn(offset in a, offset in b) for every element of two rank-3/4 views of the same shape.
template <class F>
void each(const TensorView& a, const TensorView& b, F&& fn) {
  const std::int64_t d3 = a.rank == 4 ? a.shape[3] : 1;
  const std::int64_t a3 = a.rank == 4 ? a.strides[3] : 0, b3 = b.rank == 4 ? b.strides[3] : 0;
  for (std::int64_t i0 = 0; i0 < a.shape[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < a.shape[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < a.shape[2]; ++i2) {
        const std::int64_t oa = i0 * a.strides[0] + i1 * a.strides[1] + i2 * a.strides[2];
        const std::int64_t ob = i0 * b.strides[0] + i1 * b.strides[1] + i2 * b.strides[2];
        for (std::int64_t i3 = 0; i3 < d3; ++i3) fn(oa + i3 * a3, ob + i3 * b3);
      }
}

double get(const TensorView& t, std::int64_t off) {
  return t.dtype == DType::f32 ? static_cast<const float*>(t.data)[off] : static_cast<const double*>(t.data)[off];
}
void put(const TensorView& t, std::int64_t off, double x) {
  if (t.dtype == DType::f32) static_cast<float*>(t.data)[off] = static_cast<float>(x);
  else static_cast<double*>(t.data)[off] = x;
}
void copy(const TensorView& to, const TensorView& from) {
  each(to, from, [&](std::int64_t a, std::int64_t b) { put(to, a, get(from, b)); });
}
void add(const TensorView& to, const TensorView& from) {  // to is float64
  double* t = static_cast<double*>(to.data);
  each(to, from, [&](std::int64_t a, std::int64_t b) { t[a] += get(from, b); });
}

// A contiguous buffer of float64-aligned storage.
struct Buffer {
  std::vector<double> mem;
  void reserve_bytes(std::size_t bytes) { mem.assign((bytes + 7) / 8, 0.0); }
  void* data() { return mem.data(); }
};

// What every rank holds, agreed on by all: global lengths and every rank's segments.
struct Layout {
  std::int64_t nq = 0, nkv = 0, diag = 0;  // totals; the global diagonal offset D
  std::vector<std::vector<Segment>> q, kv;  // per rank
  std::vector<std::int64_t> kv_rows;        // per rank
  std::int64_t max_kv_rows = 0;
};

// Field i of what each rank was given (agree_layout's list), in the user's terms.
std::string field_text(std::size_t i, std::int64_t v) {
  switch (i) {
    case 5: return std::string(dtype_name(static_cast<DType>(v)));
    case 6: return v ? "yes" : "no";
    case 7: return static_cast<Align>(v) == Align::bottom_right ? "bottom-right" : "top-left";
    case 10: {
      double scale = 0;
      std::memcpy(&scale, &v, sizeof scale);
      char text[32];
      const auto end = std::to_chars(text, text + sizeof text, scale).ptr;  // the shortest exact form
      return std::string(text, end);
    }
    case 11: return static_cast<Compute>(v) == Compute::bf16 ? "bf16" : "native";
    case 12: return static_cast<Sharding>(v) == Sharding::zigzag ? "zigzag" : "contiguous";
    default: return std::to_string(v);
  }
}

// "causal: yes on rank 0, no on rank 1": the first field two ranks' lists differ in.
std::string first_difference(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b, int rank) {
  static const char* names[] = {"batch",  "query heads", "key/value heads", "dk",    "dv",      "dtype",   "causal",
                                "align", "window left", "window right",    "scale", "compute", "sharding"};
  for (std::size_t i = 0; i < a.size() && i < std::size(names); ++i)
    if (a[i] != b[i])
      return std::string(names[i]) + ": " + field_text(i, a[i]) + " on rank 0, " + field_text(i, b[i]) + " on rank " +
             std::to_string(rank);
  return "rank " + std::to_string(rank) + " differs from rank 0";
}

// Compares what the ranks were given; an Error on every rank if they differ.
Layout agree_layout(const Ring& ring, const detail::Params& p, const Options& o, Sharding sharding) {
  double scale = p.scale;
  std::int64_t scale_bits = 0;
  std::memcpy(&scale_bits, &scale, sizeof scale);
  const std::vector<std::int64_t> mine = {p.B, p.Hq, p.Hkv, p.dk, p.dv, static_cast<std::int64_t>(p.dtype),
                                          p.causal, static_cast<std::int64_t>(p.align), p.window_left,
                                          p.window_right, scale_bits, static_cast<std::int64_t>(o.compute),
                                          static_cast<std::int64_t>(sharding), p.Nq, p.Nkv};
  const int w = static_cast<int>(mine.size());
  std::vector<std::int64_t> all(static_cast<std::size_t>(w) * ring.size);
  check(MPI_Allgather(mine.data(), w, MPI_INT64_T, all.data(), w, MPI_INT64_T, ring.comm), "MPI_Allgather");
  Layout L;
  const auto of = [&](int r) { return std::vector<std::int64_t>(all.begin() + r * w, all.begin() + r * w + w - 2); };
  for (int r = 0; r < ring.size; ++r) {
    if (of(r) != of(0))
      throw AgreedError("the ranks disagree on the attention: " + first_difference(of(0), of(r), r));
    L.nq += all[r * w + w - 2];
    L.nkv += all[r * w + w - 1];
  }
  const char* kind = sharding == Sharding::zigzag ? "zigzag" : "contiguous";
  for (int r = 0; r < ring.size; ++r) {
    const std::int64_t want_q = shard_rows(L.nq, ring.size, r, sharding), want_kv = shard_rows(L.nkv, ring.size, r, sharding);
    if (all[r * w + w - 2] != want_q || all[r * w + w - 1] != want_kv)
      throw AgreedError("rank " + std::to_string(r) + " holds " + std::to_string(all[r * w + w - 2]) + " query and " +
                  std::to_string(all[r * w + w - 1]) + " key rows; a " + kind + " shard of Nq = " +
                  std::to_string(L.nq) + ", Nkv = " + std::to_string(L.nkv) + " over " + std::to_string(ring.size) +
                  " ranks has " + std::to_string(want_q) + " and " + std::to_string(want_kv) +
                  " (distributed::shard gives the rows)");
    L.q.push_back(shard(L.nq, ring.size, r, sharding));
    L.kv.push_back(shard(L.nkv, ring.size, r, sharding));
    L.kv_rows.push_back(want_kv);
    L.max_kv_rows = std::max(L.max_kv_rows, want_kv);
  }
  L.diag = p.align == Align::bottom_right ? L.nkv - L.nq : 0;
  return L;
}

// One block: query segment × key segment, cut to a top-left window (see the comment at the top).
struct Block {
  bool skip = false;
  std::int64_t a = 0, b = 0, nq = 0, nk = 0;  // rows/keys dropped at the front; what is left
  Options options;
};

Block plan_block(const Options& base, const detail::Params& p, std::int64_t diag, const Segment& qs, const Segment& ks) {
  Block blk;
  blk.options = base;
  blk.options.mask.causal = false;
  blk.options.mask.align = Align::top_left;
  const std::int64_t off = qs.begin + diag - ks.begin;
  const bool has_upper = p.causal || p.window_right >= 0, has_lower = p.window_left >= 0;
  std::int64_t upper = INT64_MAX;
  if (p.causal) upper = off;
  if (p.window_right >= 0) upper = std::min(upper, off + p.window_right);
  const std::int64_t lower = has_lower ? off - p.window_left : INT64_MIN;
  blk.a = has_upper ? std::max<std::int64_t>(0, -upper) : 0;
  blk.b = has_lower ? std::max<std::int64_t>(0, lower) : 0;
  blk.nq = qs.length - blk.a;
  blk.nk = ks.length - blk.b;
  if (blk.nq <= 0 || blk.nk <= 0) {
    blk.skip = true;
    return blk;
  }
  std::int64_t right = has_upper ? upper + blk.a - blk.b : -1;    // >= 0
  std::int64_t left = has_lower ? blk.b - lower - blk.a : -1;     // >= 0
  if (right >= blk.nk - 1) right = -1;                           // every key of the block: no bound
  if (left >= blk.nq - 1) left = -1;
  blk.options.mask.window_left = left;
  blk.options.mask.window_right = right;
  return blk;
}

// The K/V shard of rank r in a ring buffer: k [B, Hkv, n, dk] then v [B, Hkv, n, dv], contiguous.
struct KvViews {
  TensorView k, v;
};
KvViews kv_views(void* data, DType dtype, const detail::Params& p, std::int64_t n) {
  const std::int64_t k_elems = p.B * p.Hkv * n * p.dk;
  KvViews out;
  out.k = TensorView::contiguous(data, dtype, {p.B, p.Hkv, n, p.dk});
  out.v = TensorView::contiguous(static_cast<char*>(data) + k_elems * static_cast<std::int64_t>(dtype_size(dtype)),
                                 dtype, {p.B, p.Hkv, n, p.dv});
  return out;
}

int message_count(std::int64_t elements) {
  if (elements > INT_MAX)
    throw Error("ring attention: a shard of " + std::to_string(elements) + " values is too large for one message");
  return static_cast<int>(elements);
}

// Drives the transfers in flight while this thread computes. Open MPI moves a large message only
// inside MPI calls on both ends (the shared-memory and TCP transports send it in fragments, each
// acknowledged by the receiver), so without calls during the compute an Isend/Irecv pair started
// before it moves in the MPI_Wait after it, and nothing is hidden. When the MPI library allows
// calls from another thread while this one makes none (MPI_THREAD_SERIALIZED or better: the CLI
// asks for it, mpi4py gets MPI_THREAD_MULTIPLE), a thread tests the requests every ~50 µs until they
// complete and is joined before this thread calls MPI again; otherwise (MPI_THREAD_SINGLE or
// FUNNELED) `poll()` between blocks is the only progress.
class TransferProgress {
 public:
  explicit TransferProgress(std::vector<MPI_Request*> requests) : requests_(std::move(requests)) {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED) return;
    thread_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed) && !complete())
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
  }
  ~TransferProgress() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void poll() {
    if (!thread_.joinable()) complete();
  }
  TransferProgress(const TransferProgress&) = delete;
  TransferProgress& operator=(const TransferProgress&) = delete;

 private:
  bool complete() {  // a completed request becomes MPI_REQUEST_NULL, which later waits skip
    bool all = true;
    for (MPI_Request* r : requests_) {
      int done = 1;
      if (*r != MPI_REQUEST_NULL) MPI_Test(r, &done, MPI_STATUS_IGNORE);
      all = all && done;
    }
    return all;
  }
  std::vector<MPI_Request*> requests_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

MPI_Datatype mpi_type(DType t) { return t == DType::f32 ? MPI_FLOAT : MPI_DOUBLE; }

// Double-buffered K/V shards travelling r → r + 1.
class KvRing {
 public:
  KvRing(const Ring& ring, const Layout& L, const detail::Params& p) : ring_(ring), L_(L), p_(p) {
    const std::size_t bytes = static_cast<std::size_t>(p.B * p.Hkv * L.max_kv_rows * (p.dk + p.dv)) * dtype_size(p.dtype);
    buf_[0].reserve_bytes(bytes);
    buf_[1].reserve_bytes(bytes);
    const KvViews mine = views(0, ring.rank);
    copy(mine.k, p.k);
    copy(mine.v, p.v);
  }
  KvViews views(int which, int owner) { return kv_views(buf_[which].data(), p_.dtype, p_, L_.kv_rows[owner]); }
  KvViews current(int step) { return views(cur_, source(step)); }
  int source(int step) const { return (ring_.rank - step + ring_.size) % ring_.size; }
  MPI_Request* requests() { return req_; }
  // Starts sending the current shard on and receiving the next (before the compute of `step`).
  void start(int step) {
    if (step + 1 >= ring_.size) return;
    const std::int64_t per_row = p_.B * p_.Hkv * (p_.dk + p_.dv);
    check(MPI_Irecv(buf_[1 - cur_].data(), message_count(per_row * L_.kv_rows[source(step + 1)]), mpi_type(p_.dtype),
                    ring_.left, kKvTag, ring_.comm, &req_[0]), "MPI_Irecv");
    check(MPI_Isend(buf_[cur_].data(), message_count(per_row * L_.kv_rows[source(step)]), mpi_type(p_.dtype),
                    ring_.right, kKvTag, ring_.comm, &req_[1]), "MPI_Isend");
    pending_ = true;
  }
  void finish() {
    if (!pending_) return;
    check(MPI_Waitall(2, req_, MPI_STATUSES_IGNORE), "MPI_Waitall");
    pending_ = false;
    cur_ = 1 - cur_;
  }

 private:
  const Ring& ring_;
  const Layout& L_;
  const detail::Params& p_;
  Buffer buf_[2];
  int cur_ = 0;
  bool pending_ = false;
  MPI_Request req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// Calls fn(block, query offset, key offset (in the source's shard)) for every block of this step.
template <class F>
void for_blocks(const Ring& ring, const Layout& L, const detail::Params& p, const Options& o, int src, F&& fn) {
  std::int64_t qo = 0;
  for (const Segment& qs : L.q[ring.rank]) {
    std::int64_t ko = 0;
    for (const Segment& ks : L.kv[src]) {
      const Block blk = plan_block(o, p, L.diag, qs, ks);
      if (!blk.skip) fn(blk, qo + blk.a, ko + blk.b);
      ko += ks.length;
    }
    qo += qs.length;
  }
}

template <class F>
void timed(double* total, F&& fn) {
  const double t0 = MPI_Wtime();
  fn();
  if (total) *total += MPI_Wtime() - t0;
}

void check_supported(const Options& options, DType dtype) {
  check_ring_options(options);
  if (dtype != DType::f32 && dtype != DType::f64)
    throw Error("q: ring attention takes float32 or float64, got " + std::string(dtype_name(dtype)));
}

}  // namespace

void check_ring_options(const Options& options) {
  if (!options.mask.explicit_mask.empty())
    throw Error("mask: not supported by ring attention (causal and window masks are)");
  if (!options.alibi_slopes.empty())
    throw Error("alibi_slopes: not supported by ring attention (its distances are global; softcap is supported)");
  if (!options.sinks.empty()) throw Error("sinks: not supported by ring attention (a sink joins each row once)");
  if (options.dropout.p > 0)
    throw Error("dropout: not supported by ring attention (its mask is keyed by global positions)");
  if (!options.cu_seqlens_q.empty() || !options.cu_seqlens_k.empty())
    throw Error("cu_seqlens_q: not supported by ring attention (packed sequences)");
}

// The arrays ring_forward allocates below (ring_memory.h).
double ring_forward_scratch_bytes(const RingShare& s) {
  const double rows = static_cast<double>(s.B * s.Hq), size = static_cast<double>(dtype_size(s.dtype));
  const double acc = rows * static_cast<double>(s.q_rows) * static_cast<double>(s.dv + 1) * 8;
  const double seg = static_cast<double>(std::max<std::int64_t>(s.q_segment, 1));
  const double part = rows * seg * (static_cast<double>(s.dv) * (size + 8) + 16);
  const double buffers = 2 * static_cast<double>(s.B * s.Hkv) * static_cast<double>(s.max_kv_rows) *
                         static_cast<double>(s.dk + s.dv) * size;
  detail::ForwardShape block;
  block.dtype = s.dtype;
  block.B = s.B, block.Hq = s.Hq, block.Hkv = s.Hkv, block.dk = s.dk, block.dv = s.dv;
  block.Nq = std::max<std::int64_t>(s.q_segment, 1), block.Nkv = std::max<std::int64_t>(s.kv_segment, 1);
  block.threads = s.threads;
  block.window = true;  // a block's cut may be a window: its V copies are not counted
  return acc + part + buffers + detail::forward_scratch_bytes(block, detail::Kernel::fast);
}

void ring_forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
                  const Options& options, MPI_Comm comm, Sharding sharding, RingTimes* times) {
  const Ring ring(comm);
  detail::Params p;
  agreed(comm, [&] {
    if (outputs.probs.data) throw Error("outputs.probs: not supported by ring attention");
    p = detail::make_forward_params(q, k, v, outputs, options, detail::Kernel::fast);
    check_supported(options, p.dtype);
  });
  const Layout L = agree_layout(ring, p, options, sharding);
  RingTimes local;

  // The running result in float64: out [B, Hq, nq, dv], lse [B, Hq, nq] (−inf: nothing seen yet).
  Tensor acc_out(DType::f64, {p.B, p.Hq, p.Nq, p.dv}), acc_lse(DType::f64, {p.B, p.Hq, p.Nq});
  std::fill_n(acc_out.as<double>(), acc_out.numel(), 0.0);  // rows no key reaches stay 0
  std::fill_n(acc_lse.as<double>(), acc_lse.numel(), -INFINITY);
  std::int64_t max_seg = 1;
  for (const Segment& s : L.q[ring.rank]) max_seg = std::max(max_seg, s.length);
  Tensor part_out(p.dtype, {p.B, p.Hq, max_seg, p.dv}), part_lse(DType::f64, {p.B, p.Hq, max_seg});
  Tensor new_out(DType::f64, {p.B, p.Hq, max_seg, p.dv}), new_lse(DType::f64, {p.B, p.Hq, max_seg});

  KvRing kv(ring, L, p);
  for (int step = 0; step < ring.size; ++step) {
    kv.start(step);
    const KvViews held = kv.current(step);
    timed(&local.compute_seconds, [&] {
      TransferProgress transfers({&kv.requests()[0], &kv.requests()[1]});
      for_blocks(ring, L, p, options, kv.source(step), [&](const Block& blk, std::int64_t qo, std::int64_t ko) {
        transfers.poll();
        const TensorView po = rows(part_out.view(), 0, blk.nq), pl = rows(part_lse.view(), 0, blk.nq);
        forward(rows(p.q, qo, blk.nq), rows(held.k, ko, blk.nk), rows(held.v, ko, blk.nk), {po, pl}, blk.options);
        const TensorView ao = rows(acc_out.view(), qo, blk.nq), al = rows(acc_lse.view(), qo, blk.nq);
        const TensorView no = rows(new_out.view(), 0, blk.nq), nl = rows(new_lse.view(), 0, blk.nq);
        merge_partials({ao, po}, {al, pl}, no, nl);
        copy(ao, no);
        copy(al, nl);
      });
    });
    timed(&local.wait_seconds, [&] { kv.finish(); });
  }
  copy(p.out, acc_out.view());
  if (!p.lse.empty()) copy(p.lse, acc_lse.view());
  if (times) *times = local;
}

void ring_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& lse, const TensorView& dout, const Gradients& grads, const Options& options,
                   MPI_Comm comm, Sharding sharding, RingTimes* times) {
  const Ring ring(comm);
  detail::BackwardParams p;
  agreed(comm, [&] {
    p = detail::make_backward_params(q, k, v, out, lse, dout, grads, options, detail::Kernel::fast);
    check_supported(options, p.dtype);
  });
  const Layout L = agree_layout(ring, p, options, sharding);
  RingTimes local;

  Tensor dq_acc(DType::f64, {p.B, p.Hq, p.Nq, p.dk});
  std::fill_n(dq_acc.as<double>(), dq_acc.numel(), 0.0);
  std::int64_t max_seg = 1, max_kseg = 1;
  for (const Segment& s : L.q[ring.rank]) max_seg = std::max(max_seg, s.length);
  for (const auto& segs : L.kv)
    for (const Segment& s : segs) max_kseg = std::max(max_kseg, s.length);
  Tensor dq_part(p.dtype, {p.B, p.Hq, max_seg, p.dk});
  Tensor dk_part(p.dtype, {p.B, p.Hkv, max_kseg, p.dk}), dv_part(p.dtype, {p.B, p.Hkv, max_kseg, p.dv});

  // dK/dV accumulators in float64, laid out as the K/V ring buffers: this step's own block sum
  // (mine), the sum received from the left (in), and two outgoing buffers (one may still be in flight).
  const std::size_t acc_bytes = static_cast<std::size_t>(p.B * p.Hkv * L.max_kv_rows * (p.dk + p.dv)) * sizeof(double);
  Buffer mine, in, outgoing[2];
  mine.reserve_bytes(acc_bytes);
  in.reserve_bytes(acc_bytes);
  outgoing[0].reserve_bytes(acc_bytes);
  outgoing[1].reserve_bytes(acc_bytes);
  MPI_Request recv_req = MPI_REQUEST_NULL, send_req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  const std::int64_t per_row = p.B * p.Hkv * (p.dk + p.dv);

  KvRing kv(ring, L, p);
  for (int step = 0; step < ring.size; ++step) {
    const int src = kv.source(step);
    kv.start(step);
    const KvViews held = kv.current(step);
    const std::int64_t n_src = L.kv_rows[src];
    const KvViews sum = kv_views(mine.data(), DType::f64, p, n_src);
    timed(&local.compute_seconds, [&] {
      TransferProgress transfers({&kv.requests()[0], &kv.requests()[1], &recv_req, &send_req[0], &send_req[1]});
      std::fill(mine.mem.begin(), mine.mem.end(), 0.0);
      for_blocks(ring, L, p, options, src, [&](const Block& blk, std::int64_t qo, std::int64_t ko) {
        transfers.poll();
        const TensorView dqp = rows(dq_part.view(), 0, blk.nq), dkp = rows(dk_part.view(), 0, blk.nk),
                         dvp = rows(dv_part.view(), 0, blk.nk);
        Options shard = blk.options;
        shard.lse_covers_keys = false;  // the global lse: this block's keys are one shard of the row's
        if (!p.dLse.empty()) shard.dlse = rows(p.dLse, qo, blk.nq);  // its rows' dlse (Options::dlse)
        backward(rows(p.q, qo, blk.nq), rows(held.k, ko, blk.nk), rows(held.v, ko, blk.nk), rows(p.out, qo, blk.nq),
                 rows(p.lse, qo, blk.nq), rows(p.dO, qo, blk.nq), {dqp, dkp, dvp}, shard);
        add(rows(dq_acc.view(), qo, blk.nq), dqp);
        add(rows(sum.k, ko, blk.nk), dkp);
        add(rows(sum.v, ko, blk.nk), dvp);
      });
    });
    // The accumulator of shard src: the sum from the ranks before this one, plus this rank's block.
    Buffer& send = outgoing[step % 2];
    timed(&local.wait_seconds, [&] {
      check(MPI_Wait(&send_req[step % 2], MPI_STATUS_IGNORE), "MPI_Wait");
      if (step > 0) check(MPI_Wait(&recv_req, MPI_STATUS_IGNORE), "MPI_Wait");
    });
    const std::size_t n_values = static_cast<std::size_t>(per_row * n_src);
    for (std::size_t i = 0; i < n_values; ++i) send.mem[i] = (step > 0 ? in.mem[i] : 0.0) + mine.mem[i];
    if (ring.size > 1) {
      // The next accumulator to come from the left: shard src − 1's, or after the last step our own.
      const int next_src = (src + ring.size - 1) % ring.size;
      check(MPI_Irecv(in.data(), message_count(per_row * L.kv_rows[next_src]), MPI_DOUBLE, ring.left, kGradTag,
                      ring.comm, &recv_req), "MPI_Irecv");
      check(MPI_Isend(send.data(), message_count(static_cast<std::int64_t>(n_values)), MPI_DOUBLE, ring.right,
                      kGradTag, ring.comm, &send_req[step % 2]), "MPI_Isend");
    }
    timed(&local.wait_seconds, [&] { kv.finish(); });
  }
  Buffer& home = ring.size > 1 ? in : outgoing[(ring.size - 1) % 2];
  timed(&local.wait_seconds, [&] {
    if (ring.size > 1) check(MPI_Wait(&recv_req, MPI_STATUS_IGNORE), "MPI_Wait");
    check(MPI_Waitall(2, send_req, MPI_STATUSES_IGNORE), "MPI_Waitall");
  });
  const KvViews done = kv_views(home.data(), DType::f64, p, L.kv_rows[ring.rank]);
  copy(p.dQ, dq_acc.view());
  copy(p.dK, done.k);
  copy(p.dV, done.v);
  if (times) *times = local;
}

}  // namespace attnscale::distributed
