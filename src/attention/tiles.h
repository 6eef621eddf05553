// Tiles: the pieces the fast forward, backward and decode share — blocks of query rows, their
// key ranges, mask application on a score tile, operand packing, per-thread scratch, and the
// tile kernels for each compute type (float32: SIMD dispatch; float64: portable loops).
//
// Shape legend: B batch, Hq/Hkv query/key-value heads, Nq/Nkv queries/keys, dk/dv head dims.
// A block is up to kBr query rows (b, h, i) that share a KV head; keys go by in tiles of kBc.
// Score tiles are transposed, St[key][query], so each query owns one SIMD lane (kernels-inl.h).
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "attention/kernels.h"
#include "attention/params.h"
#include "common/bfloat_rows.h"
#include "common/memory.h"

namespace attnscale::detail {

inline constexpr std::int64_t kBr = 64;  // query rows per block (a multiple of kColumnPad)
inline constexpr std::int64_t kBc = 64;  // keys per tile

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// A 64-byte aligned array (a cache line; also what the widest SIMD loads like); from 4 MiB on
// in huge pages (allocate_block).
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(std::int64_t n) : n_(n) {
    data_.reset(static_cast<T*>(allocate_block(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T))));
    if (!data_) throw std::bad_alloc();
  }
  T* get() const { return data_.get(); }
  T& operator[](std::int64_t i) const { return data_.get()[i]; }
  void fill(T x) const { std::fill(data_.get(), data_.get() + n_, x); }

 private:
  struct Free {
    void operator()(T* p) const { release_block(p); }
  };
  std::unique_ptr<T, Free> data_;
  std::int64_t n_ = 0;
};

// The keys each group of kColumnPad consecutive rows of a block sees: [lo[g], hi[g]), the union
// of its rows' runs (lo > hi where no row of the group sees a key). Outside it every pair of the
// group's rows is masked (apply_mask writes -inf there, the softmax then P = 0), so a partial
// tile's products need not compute those pairs (flash_forward.h, backward.cc).
struct GroupRuns {
  static constexpr std::int64_t kRows = static_cast<std::int64_t>(simd::kColumnPad);
  std::int64_t n = 0, lo[kBr / kRows], hi[kBr / kRows];

  // Row `row` of the block (rows added in order) sees keys [rlo, rhi).
  void add(std::int64_t row, std::int64_t rlo, std::int64_t rhi) {
    const std::int64_t g = row / kRows;
    if (g == n) lo[n] = std::numeric_limits<std::int64_t>::max(), hi[n] = std::numeric_limits<std::int64_t>::min(), ++n;
    if (rlo < rhi) lo[g] = std::min(lo[g], rlo), hi[g] = std::max(hi[g], rhi);
  }
  // fn(r0, r1, a, e) for each group of a block of `rows` rows: its rows [r0, r1) and the keys of
  // [j0, j1) it sees, [a, e) (a == e when none).
  template <class Fn>
  void each_group(std::int64_t rows, std::int64_t j0, std::int64_t j1, Fn fn) const {
    for (std::int64_t g = 0; g < n; ++g) {
      const std::int64_t a = std::clamp(lo[g], j0, j1);
      fn(g * kRows, std::min(rows, (g + 1) * kRows), a, std::clamp(hi[g], a, j1));
    }
  }
  // fn(ja, jb, r0, r1) for each strip [ja, jb) of kRows keys of [j0, j1) that some group sees, with
  // the rows [r0, r1) of the groups from the first that sees one of its keys to the last.
  template <class Fn>
  void each_strip(std::int64_t j0, std::int64_t j1, Fn fn) const {
    for (std::int64_t ja = j0; ja < j1; ja += kRows) {
      const std::int64_t jb = std::min(ja + kRows, j1);
      std::int64_t ga = 0, gb = n;
      while (ga < gb && !meets(ga, ja, jb)) ++ga;
      while (gb > ga && !meets(gb - 1, ja, jb)) --gb;
      if (ga < gb) fn(ja, jb, ga * kRows, gb * kRows);
    }
  }

 private:
  bool meets(std::int64_t g, std::int64_t j0, std::int64_t j1) const { return lo[g] < j1 && hi[g] > j0 && lo[g] < hi[g]; }
};

// Query rows of one block and the keys their causal/window masks allow.
struct RowBlock {
  std::int64_t b = 0, kh = 0, n = 0;
  std::int64_t h[kBr], i[kBr], lo[kBr], hi[kBr];
  std::int64_t lo_min = 0, hi_max = 0;  // union of the rows' key ranges
  std::int64_t lo_max = 0, hi_min = 0;  // intersection of every row's key range, empty ones too
  bool sorted = true;                   // lo and hi never decrease from a row to the next
  GroupRuns groups;                     // the union of the runs of each kColumnPad rows

  void add(const Params& p, std::int64_t head, std::int64_t row) {
    const KeyRange r = key_range(p, row);
    if (n > 0 && (r.lo < lo[n - 1] || r.hi < hi[n - 1])) sorted = false;
    h[n] = head;
    i[n] = row;
    lo[n] = r.lo;
    hi[n] = r.hi;
    groups.add(n, r.lo, r.hi);
    lo_max = n > 0 ? std::max(lo_max, r.lo) : r.lo;
    hi_min = n > 0 ? std::min(hi_min, r.hi) : r.hi;
    if (r.lo < r.hi) {
      lo_min = any_ ? std::min(lo_min, r.lo) : r.lo;
      hi_max = any_ ? std::max(hi_max, r.hi) : r.hi;
      any_ = true;
    }
    ++n;
  }
  bool empty() const { return !any_; }

 private:
  bool any_ = false;
};

// Work item `item` of the forward pass over B·Hq·nqb query blocks of kBr rows: the block's rows.
// Items run last query block first, since under a causal mask those see the most keys.
inline RowBlock query_block(const Params& p, std::int64_t item, std::int64_t nqb) {
  const std::int64_t qb = nqb - 1 - item % nqb, bh = item / nqb, h = bh % p.Hq;
  RowBlock rb;
  rb.b = bh / p.Hq;
  rb.kh = p.kv_head(h);
  for (std::int64_t i = qb * kBr; i < std::min(p.Nq, (qb + 1) * kBr); ++i) rb.add(p, h, i);
  return rb;
}

// How a key tile [j0, j1) meets a block: no visible pair, every pair visible, or some of each.
enum class TileKind { skip, full, partial };
inline TileKind classify(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t j1) {
  // The tile within every row's key range: each row meets it, so the loop below would say full
  // (it took ~0.6% of the forward's samples, d = 128, N = 4096, once per tile and block).
  if (p.mask.empty() && rb.n > 0 && j0 < j1 && rb.lo_max <= j0 && rb.hi_min >= j1) return TileKind::full;
  bool any = false, all = p.mask.empty();
  for (std::int64_t r = 0; r < rb.n; ++r) {
    const bool meets = rb.lo[r] < j1 && rb.hi[r] > j0 && rb.lo[r] < rb.hi[r];
    any |= meets;
    all &= rb.lo[r] <= j0 && rb.hi[r] >= j1;
  }
  return !any ? TileKind::skip : all ? TileKind::full : TileKind::partial;
}

// Without an explicit mask a row sees one run of keys, [lo, hi): the masks below write only the
// entries outside it, where a test of every pair took a 64 × 64 diagonal tile about 4 µs, 23% of
// a small causal call's samples (N = 64, d = 64, H = 8, one thread; docs/performance.md).
// [a, e): row r's visible keys within [j0, j1).
inline void visible_run(const RowBlock& rb, std::int64_t r, std::int64_t j0, std::int64_t j1, std::int64_t& a,
                        std::int64_t& e) {
  a = std::clamp(rb.lo[r], j0, j1);
  e = std::clamp(rb.hi[r], a, j1);
}

// The explicit mask's entries for a block's rows, of mask dtype M (uint8: keep or not; float or
// double: added): row r's entry for key j at row[r] + j·step bytes. A pair's score s becomes, as
// mask_bias (params.h) makes it, -inf where the entry hides the pair (or the pair lies outside
// the row's run of keys), else s + bias in the scores' type (a kept uint8 pair adds 0, as a bias
// of 0 does): the same operations. Looked up once a tile rather than per entry through
// mask_bias (its dtype and four strides), a boolean entry chosen by the bits rather than by a
// branch (a random mask's entries follow no pattern a predictor learns): a forward with a [N, N]
// boolean mask took 3.7x the time of one without (docs/performance.md).
template <class M>
struct MaskRows {
  const char* row[kBr];
  std::int64_t step;
  bool shared = true;  // every row reads the same entries (a padding mask [B, 1, 1, Nkv])
  MaskRows(const Params& p, const RowBlock& rb) : step(p.mask.strides[3] * static_cast<std::int64_t>(sizeof(M))) {
    for (std::int64_t r = 0; r < rb.n; ++r) {
      row[r] = static_cast<const char*>(element(p.mask, rb.b, rb.h[r], rb.i[r], 0));
      shared &= row[r] == row[0];
    }
  }
  template <class T>
  struct Entry {
    bool hide;
    T bias;
  };
  template <class T>
  Entry<T> entry(std::int64_t r, std::int64_t j) const {
    const M m = *reinterpret_cast<const M*>(row[r] + j * step);
    if constexpr (std::is_same_v<M, std::uint8_t>) return {m == 0, T(0)};
    else return {static_cast<double>(m) == -INFINITY, static_cast<T>(static_cast<double>(m))};
  }
  // -inf if hide, else x.
  template <class T>
  static T hide_or(bool hide, T x) {
    using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    const U keep = U(hide) - U(1);  // all ones to keep x, zero to hide it
    return std::bit_cast<T>((std::bit_cast<U>(x) & keep) | (std::bit_cast<U>(-std::numeric_limits<T>::infinity()) & ~keep));
  }
  // Pair (r, j) of score s. A boolean mask by the bits; an additive one by a branch, whose -inf
  // entries come in runs (a causal or padding pattern) and whose other entries cost an add either
  // way (by the bits its backward took 1.10x the time).
  template <class T>
  T apply(const RowBlock& rb, T s, std::int64_t r, std::int64_t j) const {
    return combine(entry<T>(r, j), j < rb.lo[r] || j >= rb.hi[r], s);
  }
  template <class T>
  static T combine(const Entry<T>& e, bool outside, T s) {
    const bool hide = outside || e.hide;
    if constexpr (std::is_same_v<M, std::uint8_t>) return hide_or(hide, s + e.bias);
    else return hide ? -std::numeric_limits<T>::infinity() : s + e.bias;
  }
  // Row r's scores s[j] for the keys [a, e) of its run (apply without the run's test), reading
  // the entries as an array where they are contiguous, so that the loop can run by vectors.
  template <class T>
  void apply_run(T* s, std::int64_t r, std::int64_t a, std::int64_t e) const {
    if (step == static_cast<std::int64_t>(sizeof(M))) {
      const M* m = reinterpret_cast<const M*>(row[r]);
      // entry()'s arithmetic spelt out: through an Entry, GCC 12 no longer vectorised the float32
      // mask's loop (a masked backward 67-72 against 46-47 ms, B = 2, H = 8, N = 1024, d = 64).
      for (std::int64_t j = a; j < e; ++j) {
        if constexpr (std::is_same_v<M, std::uint8_t>) s[j] = hide_or(m[j] == 0, s[j] + T(0));
        else s[j] = hide_or(static_cast<double>(m[j]) == -INFINITY, s[j] + static_cast<T>(static_cast<double>(m[j])));
      }
    } else {
      for (std::int64_t j = a; j < e; ++j) s[j] = combine(entry<T>(r, j), false, s[j]);
    }
  }
};
// fn(MaskRows<M>) for the mask's dtype (validate.cc admits uint8, float32 and float64).
template <class Fn>
void with_mask_rows(const Params& p, const RowBlock& rb, Fn fn) {
  switch (p.mask.dtype) {
    case DType::u8: return fn(MaskRows<std::uint8_t>(p, rb));
    case DType::f32: return fn(MaskRows<float>(p, rb));
    default: return fn(MaskRows<double>(p, rb));
  }
}

// Applies the mask to a score tile St[j - j0][r] (natural units, x = s·q·k): hidden pairs become
// -inf (assigned, not added, so a NaN score of a hidden key never reaches the row), additive
// biases are added.
template <class T>
void apply_mask(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t j1, T* St, std::int64_t lds) {
  if (p.mask.empty() && rb.sorted) {
    // Runs that never go back (one head's consecutive rows): the rows with hi <= j and those with
    // lo <= j are prefixes, [0, a) and [0, b), so key j is seen by rows [a, b) and its line of the
    // tile takes -inf over [0, a) and [max(a, b), n): runs of the line (vectors) instead of one
    // column per row (a store a line; the same entries written).
    std::int64_t a = 0, b = 0;
    for (std::int64_t j = j0; j < j1; ++j) {
      while (a < rb.n && rb.hi[a] <= j) ++a;
      while (b < rb.n && rb.lo[b] <= j) ++b;
      T* s = St + (j - j0) * lds;
      std::fill(s, s + a, -std::numeric_limits<T>::infinity());
      std::fill(s + std::max(a, b), s + rb.n, -std::numeric_limits<T>::infinity());
    }
    return;
  }
  if (p.mask.empty()) {
    for (std::int64_t r = 0; r < rb.n; ++r) {
      std::int64_t a, e;
      visible_run(rb, r, j0, j1, a, e);
      for (std::int64_t j = j0; j < a; ++j) St[(j - j0) * lds + r] = -std::numeric_limits<T>::infinity();
      for (std::int64_t j = e; j < j1; ++j) St[(j - j0) * lds + r] = -std::numeric_limits<T>::infinity();
    }
    return;
  }
  const bool inside = rb.lo_max <= j0 && rb.hi_min >= j1;
  with_mask_rows(p, rb, [&](const auto& mask) {
    // Each row sees every key of the tile by its run, and reads the same entries: one entry a key.
    const bool one_entry = inside && mask.shared && rb.n > 0;
    for (std::int64_t j = j0; j < j1; ++j) {
      T* s = St + (j - j0) * lds;
      if (one_entry) {
        const auto e = mask.template entry<T>(0, j);
        for (std::int64_t r = 0; r < rb.n; ++r) s[r] = mask.hide_or(e.hide, s[r] + e.bias);
      } else {
        for (std::int64_t r = 0; r < rb.n; ++r) s[r] = mask.apply(rb, s[r], r, j);
      }
    }
  });
}

// apply_mask for a tile in row layout, S[r][j - j0] (one query per row).
template <class T>
void apply_mask_rows(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t j1, T* S, std::int64_t lds) {
  // Each row: -inf outside its run, then, with a mask tensor, its entries over the run.
  const auto rows = [&](const auto* mask) {
    for (std::int64_t r = 0; r < rb.n; ++r) {
      std::int64_t a, e;
      visible_run(rb, r, j0, j1, a, e);
      T* s = S + r * lds - j0;
      std::fill(s + j0, s + a, -std::numeric_limits<T>::infinity());
      std::fill(s + e, s + j1, -std::numeric_limits<T>::infinity());
      if (mask) mask->apply_run(s, r, a, e);
    }
  };
  if (p.mask.empty()) return rows(static_cast<const MaskRows<std::uint8_t>*>(nullptr));
  with_mask_rows(p, rb, [&](const auto& mask) { rows(&mask); });
}

// True when query row r of the block may see key j: inside its causal/window range and not
// hidden by the explicit mask.
inline bool pair_visible(const Params& p, const RowBlock& rb, std::int64_t r, std::int64_t j) {
  if (j < rb.lo[r] || j >= rb.hi[r]) return false;
  return p.mask.empty() || mask_bias(p, rb.b, rb.h[r], rb.i[r], j) != -INFINITY;
}

// Sets the hidden pairs of a tile over keys [j0, j0 + nk) to zero; W(r, j) is W[r·rs + j·cs].
// A product with a hidden key's (or row's) non-finite value gives NaN even with weight zero, so
// a gradient tile is cleared there before it meets such a value.
template <class T>
void zero_hidden(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t nk, T* W, std::int64_t rs,
                 std::int64_t cs) {
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t j = 0; j < nk; ++j)
      if (!pair_visible(p, rb, r, j0 + j)) W[r * rs + j * cs] = T(0);
}

// The products of a partial tile with operands that hold a non-finite value, over the visible
// pairs only (the GEMM would multiply the hidden ones by zero, and 0 · NaN = NaN). W(r, j) is
// W[r·rs + j·cs] for the block's row r and key j0 + j.
//   into_rows: C[r][c] += Σ_j W(r, j)·X[j][c]   (X: the tile's key rows, C: query rows)
//   else:      C[j][c] += Σ_r W(r, j)·X[r][c]   (X: the block's query rows, C: key rows)
template <class T>
void visible_product(const Params& p, const RowBlock& rb, std::int64_t j0, std::int64_t nk, const T* W,
                     std::int64_t rs, std::int64_t cs, const T* X, std::int64_t ldx, std::int64_t d, T* C,
                     std::int64_t ldc, bool into_rows) {
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t j = 0; j < nk; ++j) {
      if (!pair_visible(p, rb, r, j0 + j)) continue;
      const T w = W[r * rs + j * cs];
      const T* x = X + (into_rows ? j : r) * ldx;
      T* c = C + (into_rows ? r : j) * ldc;
      for (std::int64_t e = 0; e < d; ++e) c[e] += w * x[e];
    }
}

// Rows [j0, j0 + n) of a [B, H, N, d] view at (b, h) as a row-major operand of T: the view itself
// when it already is one (dtype T, unit column stride), else a converted copy in `pack`.
struct Operand {
  const void* ptr;
  std::int64_t ld;
};
template <class T>
Operand rows_operand(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t n,
                     std::int64_t d, T* pack) {
  // The kernels take strides as size_t: a reversed (negative-stride) view goes through the copy.
  const bool direct = (std::is_same_v<T, float> ? t.dtype == DType::f32 : t.dtype == DType::f64) &&
                      t.strides[3] == 1 && t.strides[2] >= 0;
  if (direct) return {at<const T>(t, b, h, j0), t.strides[2]};
  if constexpr (std::is_same_v<T, float>)
    if (t.dtype == DType::bf16 && t.strides[3] == 1) {  // bfloat16 rows widened a row at a time
      for (std::int64_t j = 0; j < n; ++j)
        f32_row(static_cast<const std::uint16_t*>(element(t, b, h, j0 + j, 0)), d, pack + j * d);
      return {pack, d};
    }
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t c = 0; c < d; ++c) pack[j * d + c] = value<T>(t, b, h, j0 + j, c);
  return {pack, d};
}

// The rows of heads [h0, h1) of batch b of a [B, H, N, d] view of dtype T, copied 64-byte aligned
// (row stride d rounded up to 64 bytes), for a GEMM that reads them as its B operand many times.
// numpy aligns arrays to 16 bytes; every vector load of a row off a 64-byte boundary spans two
// cache lines, and the products that read such rows in place ran 5-15% slower (float32 forward
// and backward, d = 128, N = 4096; docs/performance.md). Rows farther apart than a copy would lay
// them (FlashAttention's and PyTorch's [B, N, H, d] layout: a head's rows H·d apart, so that each
// row of a tile falls in the same few sets of the first-level cache) are copied too (gapped()).
// hold() copies only when asked for other heads than the last ones, so a thread that takes a
// head's work items in order copies it once.
template <class T>
struct AlignedRows {
  // The most a call copies, over all its threads' copies: the memory goal allows 64 MiB above a
  // call's inputs and outputs (docs/performance.md), of which the backward's dQ partials may take
  // 64 MiB already. Past it the rows are read misaligned (5-15% slower; at 2 threads and d = 128,
  // past N = 16384 in the backward, 32768 in the forward).
  static constexpr std::int64_t kBudgetBytes = std::int64_t{32} << 20;
  Buffer<T> data;
  std::int64_t ld = 0, n = 0, b = -1, h0 = -1, h1 = -1;
  // Worth a copy, for rows that `readers` blocks of the call read: float32 rows (the SIMD kernels';
  // float64 runs portable loops), unit column stride, that do not all start on 64-byte boundaries,
  // or gapped_for(t, readers).
  static bool wanted(const TensorView& t, std::int64_t readers) {
    if (!rows_of_floats(t)) return false;
    return reinterpret_cast<std::uintptr_t>(t.data) % 64 != 0 || (t.strides[2] * sizeof(T)) % 64 != 0 ||
           gapped_for(t, readers);
  }
  // gapped() rows that `readers` blocks read, enough to repay their copy (kGappedReaders).
  static bool gapped_for(const TensorView& t, std::int64_t readers) { return readers >= kGappedReaders && gapped(t); }
  // Rows (of d = shape[3] values) farther apart than stride(d). Measured on [B, N, H, d] views
  // (H = 8, two threads, causal and not; bench/library_builds.cc, the two builds' calls alternated):
  // at N = 4096 the float32 forward with K and V copied took 0.88-0.90 of the time of reading them
  // in place at d = 64 and 0.97-1.01 at d = 128, the backward with Q and dO copied 0.94-0.95 and
  // 0.96-0.97; at N = 1024-2048 0.98-1.01. Copied at any size, they cost the forward 1.09-1.15 at
  // N = 128-256 and the backward 1.07-1.08 at N = 64-128 (at 256, 0.98 at d = 128 but 1.06 at
  // d = 64), hence kGappedReaders (docs/performance.md).
  static constexpr std::int64_t kGappedReaders = 16;
  static bool gapped(const TensorView& t) { return rows_of_floats(t) && t.strides[2] > stride(t.shape[3]); }
  static bool rows_of_floats(const TensorView& t) {
    return std::is_same_v<T, float> && t.dtype == DType::f32 && t.strides[3] == 1 && t.strides[2] >= 0;
  }
  static std::int64_t stride(std::int64_t d) { return round_up(d, 64 / static_cast<std::int64_t>(sizeof(T))); }
  // Row (h, i), h in [h0, h1), of the copy of (batch, heads [first, last)), N rows of d each.
  const T* hold(const TensorView& t, std::int64_t batch, std::int64_t first, std::int64_t last, std::int64_t N,
                std::int64_t d) {
    if (batch != b || first != h0 || last != h1) {
      if ((last - first) * N * stride(d) > n) {
        n = (last - first) * N * stride(d);
        data = Buffer<T>(n);
      }
      ld = stride(d);
      for (std::int64_t h = first; h < last; ++h) copy(t, batch, h, 0, N, d, data.get() + (h - first) * N * ld);
      b = batch;
      h0 = first;
      h1 = last;
    }
    return data.get();
  }
  const T* row(std::int64_t h, std::int64_t i, std::int64_t N) const { return data.get() + ((h - h0) * N + i) * ld; }
  // rows_operand with the same care for one tile of n rows that `readers` blocks read: copied into
  // `pack` (at least n·stride(d) elements) when wanted(t, readers).
  static Operand tile(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t n,
                      std::int64_t d, T* pack, std::int64_t readers) {
    if (!wanted(t, readers)) return rows_operand<T>(t, b, h, j0, n, d, pack);
    copy(t, b, h, j0, n, d, pack);
    return {pack, stride(d)};
  }
  // Rows [j0, j0 + n) of (b, h) into dst, row stride stride(d).
  static void copy(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t j0, std::int64_t n,
                   std::int64_t d, T* dst) {
    for (std::int64_t j = 0; j < n; ++j) {
      const T* src = at<const T>(t, b, h, j0 + j);
      std::copy(src, src + d, dst + j * stride(d));
    }
  }
};

// Row strides of a [B, H, N, d] view at (b, h), rows j0.. as an element-wise A operand: the view
// itself for dtype T with any strides, else a converted row-major copy.
struct StridedOperand {
  const void* ptr;
  std::int64_t rs, cs;
};
template <class T>
StridedOperand strided_operand(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t j0,
                               std::int64_t n, std::int64_t d, T* pack) {
  const bool same = std::is_same_v<T, float> ? t.dtype == DType::f32 : t.dtype == DType::f64;
  if (same && t.strides[2] >= 0 && t.strides[3] >= 0) return {at<const T>(t, b, h, j0), t.strides[2], t.strides[3]};
  const Operand o = rows_operand<T>(t, b, h, j0, n, d, pack);
  return {o.ptr, o.ld, 1};
}

// n <= kBr bfloat16 rows of d values, `row_at(r, c0)` pointing at row r's column c0, times f,
// transposed into Xt[c][r] (ld columns): widened kChunk columns at a time into a block of float32
// rows, which is then transposed as float32 rows are (the same values and products: the same bits).
template <class RowAt>
void transpose_bf16_rows(RowAt row_at, std::int64_t n, std::int64_t d, float f, float* Xt, std::int64_t ld) {
  static_assert(kBc <= kBr, "tiles of keys go through it too");
  constexpr std::int64_t kChunk = 128;
  alignas(64) float block[kBr * kChunk];
  const float* rows[kBr];
  for (std::int64_t c0 = 0; c0 < d; c0 += kChunk) {
    const std::int64_t w = std::min(kChunk, d - c0);
    for (std::int64_t r = 0; r < n; ++r) {
      f32_row(row_at(r, c0), w, block + r * kChunk);
      rows[r] = block + r * kChunk;
    }
    simd::transpose_scaled(rows, static_cast<std::size_t>(n), static_cast<std::size_t>(w), f, Xt + c0 * ld,
                           static_cast<std::size_t>(ld));
  }
}

// The block's rows of a [B, H, N, d] view, transposed into Xt[c][r] (ld columns), times `mul`;
// padding columns [n, ld) are zero.
template <class T>
void pack_transposed(const TensorView& t, const RowBlock& rb, std::int64_t d, double mul, T* Xt, std::int64_t ld) {
  for (std::int64_t c = 0; c < d; ++c) std::fill(Xt + c * ld + rb.n, Xt + (c + 1) * ld, T(0));
  const T f = static_cast<T>(mul);
  if (std::is_same_v<T, float> ? t.dtype == DType::f32 : t.dtype == DType::f64) {
    // The view's own type: row pointers once, then each Xt row written contiguously.
    const T* rows[kBr];
    for (std::int64_t r = 0; r < rb.n; ++r) rows[r] = at<const T>(t, rb.b, rb.h[r], rb.i[r]);
    const std::int64_t cs = t.strides[3];
    bool runs = rb.n > 0;  // a column-major view (rows adjacent): each Xt row is one contiguous run
    for (std::int64_t r = 0; r < rb.n; ++r) runs = runs && rows[r] == rows[0] + r;
    if (runs) {
      for (std::int64_t c = 0; c < d; ++c) {
        const T* src = rows[0] + c * cs;
        T* dst = Xt + c * ld;
        for (std::int64_t r = 0; r < rb.n; ++r) dst[r] = src[r] * f;
      }
      return;
    }
    // float32 rows of unit stride: by 16 × 16 blocks in registers (simd::transpose_scaled; one at a
    // time, the 64 × 64 block of a small call took 10% of its samples: N = 64–128, d = 64, H = 8).
    if constexpr (std::is_same_v<T, float>)
      if (cs == 1) {
        simd::transpose_scaled(rows, static_cast<std::size_t>(rb.n), static_cast<std::size_t>(d), f, Xt,
                               static_cast<std::size_t>(ld));
        return;
      }
    // Row by row: each query row read front to back (a column at a time went across all rows for
    // every column: 1.2% of the forward's samples at d = 128, N = 4096, one thread).
    for (std::int64_t r = 0; r < rb.n; ++r) {
      const T* src = rows[r];
      for (std::int64_t c = 0; c < d; ++c) Xt[c * ld + r] = src[c * cs] * f;
    }
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    if (t.dtype == DType::bf16 && t.strides[3] == 1) {
      transpose_bf16_rows(
          [&](std::int64_t r, std::int64_t c0) {
            return static_cast<const std::uint16_t*>(element(t, rb.b, rb.h[r], rb.i[r], c0));
          },
          rb.n, d, f, Xt, ld);
      return;
    }
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t c = 0; c < d; ++c) Xt[c * ld + r] = value<T>(t, rb.b, rb.h[r], rb.i[r], c) * f;
}

// The block's rows of a [B, H, N, d] view, row-major into X[r][c], times `mul`.
template <class T>
void pack_scaled_rows(const TensorView& t, const RowBlock& rb, std::int64_t d, double mul, T* X) {
  const T f = static_cast<T>(mul);
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t c = 0; c < d; ++c) X[r * d + c] = value<T>(t, rb.b, rb.h[r], rb.i[r], c) * f;
}

// The block's rows of a [B, H, N, d] view, row-major into X[r][c].
template <class T>
void pack_rows(const TensorView& t, const RowBlock& rb, std::int64_t d, T* X) {
  for (std::int64_t r = 0; r < rb.n; ++r)
    for (std::int64_t c = 0; c < d; ++c) X[r * d + c] = value<T>(t, rb.b, rb.h[r], rb.i[r], c);
}

// Whether any of n float32 (U = uint32) or bfloat16 (uint16) bit patterns is inf or NaN, i.e. has
// an exponent field of all ones: exactly then does the field plus one unit of its lowest bit carry
// into the sign bit's place. An OR of such sums over the row, tested once, is a loop of integer
// adds and ORs that vectorises: the bf16 backward's check of q, k, v and dO went from 1.8% of its
// samples to 0.6% (a flag set per element compared each one; docs/performance.md).
template <class U>
bool any_nonfinite_bits(const U* x, std::int64_t n) {
  constexpr std::uint32_t exp = sizeof(U) == 4 ? 0x7f800000u : 0x7f80u, unit = sizeof(U) == 4 ? 0x00800000u : 0x0080u;
  U acc = 0;
  for (std::int64_t c = 0; c < n; ++c) acc |= static_cast<U>((x[c] & exp) + unit);
  return (acc & (exp + unit)) != 0;
}

// float32 bit patterns read through a type that may alias float (GCC and Clang), so that reading a
// row's bits right after writing it as float is well defined.
using FloatBits = std::uint32_t __attribute__((may_alias));

// True when rows [0, n) x [0, d) of an operand (row stride ld, column stride cs) are all finite;
// float32 rows with unit column stride by their exponent bits (any_nonfinite_bits).
template <class T>
bool all_finite(const T* x, std::int64_t ld, std::int64_t n, std::int64_t d, std::int64_t cs = 1) {
  if constexpr (std::is_same_v<T, float>) {
    if (cs == 1) {
      for (std::int64_t j = 0; j < n; ++j)
        if (any_nonfinite_bits(reinterpret_cast<const FloatBits*>(x + j * ld), d)) return false;
      return true;
    }
  }
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t c = 0; c < d; ++c)
      if (!std::isfinite(x[j * ld + c * cs])) return false;
  return true;
}

// The tile kernels for one compute type. float: the SIMD kernels of kernels.h. double: the same
// contracts in portable loops (the float64 fast path keeps float64 accuracy).
template <class T>
struct Ops;

template <>
struct Ops<float> {
  static void gemm(std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t ars,
                   std::int64_t acs, const float* B, std::int64_t ldb, float* C, std::int64_t ldc,
                   simd::GemmMode mode, const float* row_scale = nullptr) {
    simd::gemm(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale);
  }
  static void forward_gemm(std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t ars,
                           std::int64_t acs, const float* B, std::int64_t ldb, float* C, std::int64_t ldc,
                           simd::GemmMode mode, const float* row_scale = nullptr) {
    simd::forward_gemm(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale);
  }
  static void forward_pv(std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t ars,
                         std::int64_t acs, const float* B, std::int64_t ldb, float* C, std::int64_t ldc,
                         const float* row_scale) {
    simd::forward_pv(M, N, K, A, ars, acs, B, ldb, C, ldc, row_scale);
  }
  static void accumulate_tile(std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t ars,
                              std::int64_t acs, const float* B, std::int64_t ldb, float* C, std::int64_t ldc) {
    simd::accumulate_tile(M, N, K, A, ars, acs, B, ldb, C, ldc);
  }
  static void softmax_update(float* St, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* m,
                             float* l, float* alpha) {
    simd::softmax_update(St, lds, rows, cols, m, l, alpha);
  }
  static void exp2_columns(float* St, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                           const float* sub, const float* mul) {
    simd::exp2_columns(St, lds, rows, cols, sub, mul);
  }
  static void softmax_grad(const float* Pt, float* dPt, std::int64_t ld, std::int64_t rows, std::int64_t cols,
                           const float* D, float scale) {
    simd::softmax_grad(Pt, dPt, ld, rows, cols, D, scale);
  }
  static void dot_tile(std::int64_t nk, std::int64_t rows, std::int64_t dk, const float* K, std::int64_t ldk,
                       const float* Q, std::int64_t ldq, float* St, std::int64_t lds) {
    simd::dot_tile(nk, rows, dk, K, ldk, Q, ldq, St, lds);
  }
  static void softmax_update_rows(float* S, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* m,
                                  float* l, float* alpha) {
    simd::softmax_update_rows(S, lds, rows, cols, m, l, alpha);
  }
  static void exp2_rows(float* S, std::int64_t lds, std::int64_t rows, std::int64_t cols, const float* sub,
                        const float* mul = nullptr) {
    simd::exp2_rows(S, lds, rows, cols, sub, mul);
  }
  static void softmax_grad_rows(const float* P, float* dP, std::int64_t ld, std::int64_t rows, std::int64_t cols,
                                const float* D, float scale) {
    simd::softmax_grad_rows(P, dP, ld, rows, cols, D, scale);
  }
  static void softcap(float* x, std::int64_t n, float c, float* dcap) { simd::softcap(x, n, c, dcap); }
};

template <>
struct Ops<double> {
  static void gemm(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, std::int64_t ars,
                   std::int64_t acs, const double* B, std::int64_t ldb, double* C, std::int64_t ldc,
                   simd::GemmMode mode, const double* row_scale = nullptr) {
    for (std::int64_t m = 0; m < M; ++m) {
      double* c = C + m * ldc;
      for (std::int64_t n = 0; n < N; ++n)
        c[n] = mode == simd::kOverwrite ? 0.0 : mode == simd::kAccumulate ? c[n] : row_scale[m] * c[n];
      for (std::int64_t k = 0; k < K; ++k) {
        const double a = A[m * ars + k * acs];
        for (std::int64_t n = 0; n < N; ++n) c[n] += a * B[k * ldb + n];
      }
    }
  }
  static void forward_gemm(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, std::int64_t ars,
                           std::int64_t acs, const double* B, std::int64_t ldb, double* C, std::int64_t ldc,
                           simd::GemmMode mode, const double* row_scale = nullptr) {
    gemm(M, N, K, A, ars, acs, B, ldb, C, ldc, mode, row_scale);
  }
  static void forward_pv(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, std::int64_t ars,
                         std::int64_t acs, const double* B, std::int64_t ldb, double* C, std::int64_t ldc,
                         const double* row_scale) {
    gemm(M, N, K, A, ars, acs, B, ldb, C, ldc, simd::kRescaleAccumulate, row_scale);
  }
  static void accumulate_tile(std::int64_t M, std::int64_t N, std::int64_t K, const double* A, std::int64_t ars,
                              std::int64_t acs, const double* B, std::int64_t ldb, double* C, std::int64_t ldc) {
    gemm(M, N, K, A, ars, acs, B, ldb, C, ldc, simd::kAccumulate);
  }
  static void softmax_update(double* St, std::int64_t lds, std::int64_t rows, std::int64_t cols, double* m,
                             double* l, double* alpha) {
    for (std::int64_t c = 0; c < cols; ++c) {
      double mx = m[c];
      for (std::int64_t j = 0; j < rows; ++j) mx = std::max(mx, St[j * lds + c]);
      const double use = mx == -INFINITY ? 0.0 : mx;  // fully-masked guard, see kernels-inl.h
      double sum = 0;
      for (std::int64_t j = 0; j < rows; ++j) sum += St[j * lds + c] = std::exp(St[j * lds + c] - use);
      alpha[c] = std::exp(m[c] - use);
      l[c] = alpha[c] * l[c] + sum;
      m[c] = mx;
    }
  }
  static void exp2_columns(double* St, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                           const double* sub, const double* mul) {
    for (std::int64_t j = 0; j < rows; ++j)
      for (std::int64_t c = 0; c < cols; ++c) St[j * lds + c] = std::exp(St[j * lds + c] - sub[c]) * mul[c];
  }
  static void softmax_grad(const double* Pt, double* dPt, std::int64_t ld, std::int64_t rows,
                           std::int64_t cols, const double* D, double scale) {
    for (std::int64_t j = 0; j < rows; ++j)
      for (std::int64_t c = 0; c < cols; ++c)
        dPt[j * ld + c] = Pt[j * ld + c] * (dPt[j * ld + c] - D[c]) * scale;
  }
  static void dot_tile(std::int64_t nk, std::int64_t rows, std::int64_t dk, const double* K, std::int64_t ldk,
                       const double* Q, std::int64_t ldq, double* St, std::int64_t lds) {
    for (std::int64_t j = 0; j < nk; ++j)
      for (std::int64_t r = 0; r < rows; ++r) {
        double acc = 0;
        for (std::int64_t c = 0; c < dk; ++c) acc += K[j * ldk + c] * Q[r * ldq + c];
        St[r * lds + j] = acc;
      }
  }
  static void softmax_update_rows(double* S, std::int64_t lds, std::int64_t rows, std::int64_t cols, double* m,
                                  double* l, double* alpha) {
    for (std::int64_t r = 0; r < rows; ++r) {
      double* row = S + r * lds;
      double mx = m[r];
      for (std::int64_t j = 0; j < cols; ++j) mx = std::max(mx, row[j]);
      const double use = mx == -INFINITY ? 0.0 : mx;  // fully-masked guard, see kernels-inl.h
      double sum = 0;
      for (std::int64_t j = 0; j < cols; ++j) sum += row[j] = std::exp(row[j] - use);
      alpha[r] = std::exp(m[r] - use);
      l[r] = alpha[r] * l[r] + sum;
      m[r] = mx;
    }
  }
  static void exp2_rows(double* S, std::int64_t lds, std::int64_t rows, std::int64_t cols, const double* sub,
                        const double* mul = nullptr) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) S[r * lds + c] = std::exp(S[r * lds + c] - sub[r]) * (mul ? mul[r] : 1.0);
  }
  static void softmax_grad_rows(const double* P, double* dP, std::int64_t ld, std::int64_t rows, std::int64_t cols,
                                const double* D, double scale) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) dP[r * ld + c] = P[r * ld + c] * (dP[r * ld + c] - D[r]) * scale;
  }
  static void softcap(double* x, std::int64_t n, double c, double* dcap) {
    for (std::int64_t i = 0; i < n; ++i) {
      const double t = std::tanh(x[i] / c);
      x[i] = c * t;
      if (dcap) dcap[i] = 1.0 - t * t;
    }
  }
};

}  // namespace attnscale::detail
