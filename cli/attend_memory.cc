#include "attend_memory.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "attention/forward_scratch.h"
#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "common/memory.h"
#include "input_files.h"
#include "io/npy_header.h"
#ifdef ATTNSCALE_HAVE_MPI
#include "distributed/ring_memory.h"
#endif

namespace attnscale::cli {
namespace {

// One array the call will hold: its flag, its file (inputs only) and what it holds.
struct HeldArray {
  std::string flag, path;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;

  // A view of the shape, no data: what output_shapes() reads.
  TensorView view() const {
    TensorView v;
    v.dtype = dtype;
    v.rank = static_cast<int>(shape.size());  // 1 to 4 (parse_npy_header, output_shapes())
    for (int d = 0; d < v.rank && d < kMaxRank; ++d) v.shape[d] = shape[d];
    return v;
  }
  // "[4, 1048576, 64] float32", as Tensor's allocation error spells a tensor.
  std::string text() const { return view().shape_str() + " " + std::string(dtype_name(dtype)); }
  double bytes() const {
    double n = static_cast<double>(dtype_size(dtype));
    for (const auto d : shape) n *= static_cast<double>(d);
    return n;
  }
};

HeldArray input(const char* flag, const std::string& path, InputDtypes accepted) {
  detail::NpyHeader h = read_input_header(flag, path, accepted);
  return {flag, path, h.dtype, std::move(h.shape)};
}

// Everything a call holds: its arrays, each checked alone in the order the call allocates them
// (read_input() names an input's allocation "--q: q.npy: tensor ...", attend an output's
// "--probs: tensor ..."), then what the library allocates beside them, each part named with its
// size ("the kernels' scratch 170.0 KiB").
struct Held {
  std::string named;
  double total = 0;

  void add(const HeldArray& a) {
    detail::check_allocation(
        [&] { return a.flag + ": " + (a.path.empty() ? "" : a.path + ": ") + "tensor " + a.text(); }, a.bytes());
    add_named(a.flag + " " + a.text(), a.bytes());
  }
  void add_scratch(const std::string& what, double bytes) {
    if (bytes > 0) add_named(what + " " + detail::format_bytes(bytes), bytes);
  }
  void add_named(const std::string& what, double bytes) {
    named += (named.empty() ? "" : ", ") + what;
    total += bytes;
  }
};

// [B, H, N, d]: the last dimensions of a shape of rank 2 to 4, the leading ones 1 where it has none
// (the library's rank padding). Dimensions of 0 or less give 0 (refused later by forward()).
std::array<std::int64_t, 4> padded(const std::vector<std::int64_t>& shape) {
  std::array<std::int64_t, 4> p{1, 1, 1, 1};
  const int n = static_cast<int>(std::min<std::size_t>(shape.size(), 4));
  for (int d = 0; d < n; ++d) p[4 - n + d] = shape[shape.size() - n + d];
  return p;
}

// The library's shape of the call from q's, k's and v's headers.
detail::ForwardShape forward_shape(const HeldArray& q, const HeldArray& k, const HeldArray& v) {
  const auto qs = padded(q.shape), ks = padded(k.shape), vs = padded(v.shape);
  detail::ForwardShape s;
  s.dtype = q.dtype;
  s.B = qs[0], s.Hq = qs[1], s.Nq = qs[2], s.dk = qs[3];
  s.Hkv = ks[1], s.Nkv = ks[2];
  s.dv = vs[3];
  return s;
}
bool positive(const detail::ForwardShape& s) {
  return std::min({s.B, s.Hq, s.Hkv, s.Nq, s.Nkv, s.dk, s.dv}) > 0 && s.Hq % s.Hkv == 0;
}

// The library's scratch for the call (each packed sequence runs alone: the largest), and the
// sequence's rows and keys whose reference score matrices are the largest.
struct Scratch {
  double bytes = 0;
  std::int64_t Nq = 0, Nkv = 0;
};
Scratch library_scratch(detail::ForwardShape s, const AttendCall& call) {
  const detail::Kernel kernel = call.reference ? detail::Kernel::reference : detail::Kernel::fast;
  if (!positive(s)) return {};
  const auto& cq = call.cu_seqlens_q;
  const auto& ck = call.cu_seqlens_k;
  if (cq.empty() && ck.empty()) return {detail::forward_scratch_bytes(s, kernel), s.Nq, s.Nkv};
  if (cq.size() != ck.size()) return {};  // refused by forward() before it allocates
  Scratch most;
  for (std::size_t i = 0; i + 1 < cq.size(); ++i) {
    detail::ForwardShape one = s;
    one.B = 1;
    one.Nq = std::clamp<std::int64_t>(cq[i + 1] - cq[i], 0, s.Nq);
    one.Nkv = std::clamp<std::int64_t>(ck[i + 1] - ck[i], 0, s.Nkv);
    if (one.Nq == 0 || one.Nkv == 0) continue;  // such a sequence runs no kernel
    const double bytes = detail::forward_scratch_bytes(one, kernel);
    if (bytes > most.bytes) most = {bytes, one.Nq, one.Nkv};
  }
  return most;
}

}  // namespace

void check_attend_memory(const AttendCall& call) {
  // In the order the call reads and allocates them (the mask, slopes and sinks with the other flags
  // first), so that an array too large alone is refused with the message its allocation gives.
  Held held;
  if (!call.mask.empty()) held.add(input("--mask", call.mask, InputDtypes::mask));
  if (!call.alibi_slopes.empty()) held.add(input("--alibi-slopes", call.alibi_slopes, InputDtypes::floats));
  if (!call.sinks.empty()) held.add(input("--sinks", call.sinks, InputDtypes::floats));
  const HeldArray q = input("--q", call.q, InputDtypes::floats), k = input("--k", call.k, InputDtypes::floats),
                  v = input("--v", call.v, InputDtypes::floats);
  held.add(q);
  held.add(k);
  held.add(v);
  const OutputShapes shapes = output_shapes(q.view(), k.view(), v.view(), {"--q", "--k", "--v"});
  const DType out_dtype = q.dtype;  // outputs take q's dtype
  held.add({"--out", "", out_dtype, shapes.out});
  if (!call.lse.empty()) held.add({"--lse", "", out_dtype, shapes.lse});
  if (!call.probs.empty()) held.add({"--probs", "", out_dtype, shapes.probs});

  detail::ForwardShape shape = forward_shape(q, k, v);
  shape.threads = call.threads;
  shape.probs = !call.probs.empty(), shape.mask = !call.mask.empty(), shape.sinks = !call.sinks.empty();
  shape.dropout = call.dropout, shape.window = call.window;
  const Scratch scratch = library_scratch(shape, call);
  if (call.reference) {
    if (scratch.Nq > 0) detail::check_reference_scratch(scratch.Nq, scratch.Nkv);  // as reference::forward does
    held.add_scratch("--reference's scores of one head [" + std::to_string(scratch.Nq) + ", " +
                         std::to_string(scratch.Nkv) + "]",
                     scratch.bytes);
  } else {
    held.add_scratch("the kernels' scratch", scratch.bytes);
  }
  std::string advice = "smaller arrays";
  if (!call.probs.empty() && !call.reference) advice += ", or no --probs,";
  else if (call.probs.empty() && call.reference) advice += ", or no --reference,";
  else if (!call.probs.empty() && call.reference) advice += ", or no --probs or --reference,";
  detail::check_estimate(held.named + ": the call", held.total, advice + " need less");
}

#ifdef ATTNSCALE_HAVE_MPI
HeldSum check_context_parallel_share(const ContextParallelShare& share) {
  const auto rows = [](const detail::NpyHeader& h, std::int64_t n) {
    HeldArray a{"", "", h.dtype, h.shape};
    a.shape[a.shape.size() - 2] = n;  // rank 2 to 4 (read_header)
    return a;
  };
  HeldArray q = rows(*share.q, share.q_rows), k = rows(*share.k, share.kv_rows), v = rows(*share.v, share.kv_rows);
  q.flag = "--q", k.flag = "--k", v.flag = "--v";
  Held held;
  held.add(q);
  held.add(k);
  held.add(v);
  HeldArray out = q;  // q's shape with dv last; lse without its last dimension
  out.flag = "--out";
  out.shape.back() = share.v->shape.back();
  held.add(out);
  if (share.lse) {
    HeldArray lse = q;
    lse.flag = "--lse";
    lse.shape.pop_back();
    held.add(lse);
  }
  const detail::ForwardShape s = forward_shape(q, k, v);
  if (positive(s)) {
    distributed::RingShare ring;
    ring.dtype = s.dtype;
    ring.B = s.B, ring.Hq = s.Hq, ring.Hkv = s.Hkv, ring.dk = s.dk, ring.dv = s.dv;
    ring.q_rows = share.q_rows, ring.q_segment = share.q_segment;
    ring.max_kv_rows = share.max_kv_rows, ring.kv_segment = share.kv_segment;
    ring.threads = share.threads;
    held.add_scratch("ring attention's buffers and scratch", distributed::ring_forward_scratch_bytes(ring));
  }
  detail::check_estimate(held.named + ": this rank", held.total, "more ranks or smaller arrays need less");
  return {held.named, held.total};
}

void check_machine_share(const HeldSum& rank, int local_ranks, double local_bytes) {
  if (local_ranks <= 1) return;  // checked alone already
  detail::check_estimate(rank.named + " on this rank, the others' alike: what the " + std::to_string(local_ranks) +
                             " ranks on this machine hold",
                         local_bytes, "ranks on more machines or smaller arrays need less");
}
#endif

}  // namespace attnscale::cli
