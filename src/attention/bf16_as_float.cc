#include "attention/bf16_as_float.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention/bf16_kernels.h"
#include "attention/flash_forward.h"
#include "attention/tiles.h"
#include "common/bfloat_rows.h"
#include "common/elements.h"
#include "common/memory.h"
#include "common/parallel.h"

namespace attnscale::detail {
namespace {

// The copies take at most this share of the machine's memory (RAM + swap); beyond, the bf16
// kernels read the inputs as they are.
constexpr std::int64_t kMemoryShare = 8;

// Fewer query rows a head take the route from kFewRows on: the backward always (its bf16 kernels
// took 1.3-2.4x the float32 call's time at 16-63 rows, their copies less), the forward where the
// copies hold at most kSmallCopies values (over long keys its bf16 kernels read K and V as stored
// at the float32 call's pace: 16 rows over 4096 keys 1.01x, 32 over 1024 1.06x, where copying them
// would cost more; over short keys they took 1.4-2.2x). docs/performance.md.
constexpr std::int64_t kFewRows = 16;
constexpr std::int64_t kSmallCopies = std::int64_t{1} << 18;

// What the forward and the backward share: bfloat16 inputs or bf16 products asked of float32 ones,
// on the widened path, enough query rows (above), and copies of `elements` values that fit.
bool wanted(const Params& p, Compute compute, std::int64_t elements, bool backward) {
  if (p.dtype != DType::bf16 && !(p.dtype == DType::f32 && compute == Compute::bf16)) return false;
  if (bfdot::path() != bfdot::Path::widened) return false;
  const bool rows = p.Nq >= kBr || (p.Nq >= kFewRows && (backward || elements <= kSmallCopies));
  return rows && elements * std::int64_t{sizeof(float)} <= memory_limit_bytes() / kMemoryShare;
}

// A float32 value x as the bf16 kernels take it, given r, x rounded to bfloat16: r, except for a
// finite x beyond bfloat16's range (above 3.39e38), which they take by its float32 value (a tile of
// V that holds one is multiplied in float32, so that 0 · inf never reaches the pairs a mask hides).
inline float as_bf16(float x, float r) { return std::isfinite(r) || !std::isfinite(x) ? r : x; }

// n consecutive values from src (bfloat16 or float32 `dtype`) into dst as float32, float32 values
// (a float32 call with Compute::bf16) taken as as_bf16 takes them. Every copied view has the call's
// dtype: the validation refuses a dout of another one.
void float_run(DType dtype, const void* src, std::int64_t n, float* dst) {
  if (dtype == DType::bf16) return f32_row(static_cast<const std::uint16_t*>(src), n, dst);
  const float* x = static_cast<const float*>(src);
  std::uint16_t bits[1024];
  for (std::int64_t e0 = 0; e0 < n; e0 += 1024) {  // float32 -> bfloat16 bits -> float32
    const std::int64_t m = std::min<std::int64_t>(1024, n - e0);
    bf16_row(x + e0, m, bits);
    f32_row(bits, m, dst + e0);
    for (std::int64_t e = e0; e < e0 + m; ++e) dst[e] = as_bf16(x[e], dst[e]);
  }
}

// Rows [r0, r1) of the rank-4 view t (bfloat16 or float32; row r is element (a, b, c) in C order
// of the first three dimensions), d = t.shape[3] values each, into dst as float32: one run where
// the view is contiguous (a small call's rows of 64 values, one conversion call each, took a
// quarter of its copies' time), else row by row.
void float_rows(const TensorView& t, std::int64_t r0, std::int64_t r1, float* dst) {
  const std::int64_t d = t.shape[3], size = static_cast<std::int64_t>(dtype_size(t.dtype));
  if (t.is_contiguous()) return float_run(t.dtype, static_cast<const char*>(t.data) + r0 * d * size, (r1 - r0) * d, dst);
  for (std::int64_t r = r0; r < r1; ++r, dst += d) {
    const std::int64_t c = r % t.shape[2], b = r / t.shape[2] % t.shape[1], a = r / t.shape[2] / t.shape[1];
    if (t.strides[3] == 1) {
      float_run(t.dtype, element(t, a, b, c, 0), d, dst);
      continue;
    }
    for (std::int64_t e = 0; e < d; ++e) {
      const float x = static_cast<float>(load_element(t.dtype, element(t, a, b, c, e)));
      dst[e] = t.dtype == DType::bf16 ? x : as_bf16(x, from_bf16(to_bf16(x)));
    }
  }
}

// p with the views `views` names replaced by contiguous float32 copies, made in one parallel pass
// over all their rows (one start of the thread pool, not one a view). The copies lie in one block,
// each from a 64-byte boundary: a call's copies of 2 MiB or more then reuse the pages of the call
// before it (allocate_block keeps such blocks); copies in separate blocks of 1 MiB each took new
// pages every call (glibc returned them), whose faults took about 5% of a bf16 forward of 256 rows.
template <class P>
P with_copies(const P& p, std::vector<Tensor>& copies, std::initializer_list<TensorView P::*> views) {
  P f = p;
  std::vector<const TensorView*> from;
  std::vector<std::int64_t> first{0};  // the copies' first rows in the pass
  std::vector<std::int64_t> offset{0};  // and their first values in the block
  std::int64_t elements = 0;
  for (TensorView P::*v : views) {
    const TensorView& t = p.*v;
    from.push_back(&t);
    first.push_back(first.back() + t.shape[0] * t.shape[1] * t.shape[2]);
    offset.push_back(offset.back() + (t.numel() + 15) / 16 * 16);
    elements += t.numel();
  }
  copies.emplace_back(DType::f32, std::initializer_list<std::int64_t>{offset.back()});
  float* block = copies.back().template as<float>();
  for (std::size_t i = 0; i < from.size(); ++i) {
    const TensorView& t = *from[i];
    f.*(views.begin()[i]) = TensorView::contiguous(block + offset[i], DType::f32, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
  }
  f.dtype = DType::f32;
  // Small copies (under 64 K values, 256 KiB of float32) on the calling thread alone.
  const int threads = elements < (std::int64_t{1} << 16) ? 1 : resolve_threads(p.threads, first.back());
  parallel_for(first.back(), 64, threads, [&](std::int64_t r0, std::int64_t r1, int) {
    while (r0 < r1) {  // the chunk's rows, a run of each copy's at a time
      const auto i = static_cast<std::size_t>(std::upper_bound(first.begin(), first.end(), r0) - first.begin() - 1);
      const std::int64_t a = r0 - first[i], e = std::min(r1, first[i + 1]) - first[i];
      float_rows(*from[i], a, e, block + offset[i] + a * from[i]->shape[3]);
      r0 = first[i] + e;
    }
  });
  return f;
}

// A forward of bfloat16 q, k, v of unit column stride that the tiles take (not a decode), whose
// K and V tiles are each read by at most kStoredReaders query blocks (the blocks of a head times
// the query heads of a KV head): the float32 kernels read them as stored, their packing widening
// each tile's K and V rows and each block's Q rows (rows_operand, pack_transposed), instead of
// reading float32 copies. The copies' pass writes twice the bytes it reads, and at 64-512 rows
// took more than widening a tile for each block that reads it; past about eight readers a tile
// the widening costs more (H = 8, d = 128, bf16 over float32 call time, copies / as stored: 128
// rows causal 1.50 / 1.17, 256 causal 1.27 / 1.15, 512 causal 1.14 / 1.06, 512 1.11 / 1.11, 768
// 1.08 / 1.12, 2048 1.02 / 1.09; docs/performance.md).
constexpr std::int64_t kStoredReaders = 8;

}  // namespace

bool reads_as_stored(const Params& p) {
  if (p.dtype != DType::bf16 || p.q.strides[3] != 1 || p.k.strides[3] != 1 || p.v.strides[3] != 1) return false;
  if (p.group() * ((p.Nq + kBr - 1) / kBr) > kStoredReaders) return false;
  Params f = p;
  f.dtype = DType::f32;
  return !may_decode(f);
}

// A backward of bfloat16 q, k, v and dO of unit column stride over at most kStoredKeyBlocks blocks
// of kBc keys: the float32 kernels read them as stored, their packing widening each tile's rows
// (rows_operand, pack_transposed, pack_keys_transposed), instead of reading float32 copies. Each
// query block's Q and dO rows are widened once per pair of key blocks that reads them, K and V
// about once; the copies' pass writes twice the bytes it reads, and over few keys cost more
// (H = 8, causal, Nq = Nkv, time as stored / with copies, medians of 15 processes alternated:
// d = 128, 16-256 rows 0.85-0.95; d = 64 0.94-0.98; 384 rows 0.97-1.06; docs/performance.md).
constexpr std::int64_t kStoredKeyBlocks = 4;

bool reads_as_stored(const BackwardParams& p) {
  for (const TensorView* t : {&p.q, &p.k, &p.v, &p.dO})
    if (t->dtype != DType::bf16 || t->strides[3] != 1) return false;
  return p.dtype == DType::bf16 && (p.Nkv + kBc - 1) / kBc <= kStoredKeyBlocks;
}

bool runs_as_float(const Params& p, Compute compute) {
  return wanted(p, compute, p.q.numel() + p.k.numel() + p.v.numel(), false);
}

// Float32 inputs whose bfloat16 roundings are not all finite (a value beyond bfloat16's range), or
// that ask for dbias, take the float32 backward on their own values, as the bf16 backward leaves
// them to it (its backward_handles); bfloat16 inputs go there too, whose copies hold the same values.
bool runs_as_float(const BackwardParams& p, Compute compute) {
  return wanted(p, compute, p.q.numel() + p.k.numel() + p.v.numel() + p.dO.numel(), true) &&
         (p.dtype == DType::bf16 || bfdot::backward_handles(p));
}

Params float_params(const Params& p, std::vector<Tensor>& copies) {
  if (reads_as_stored(p)) {
    Params f = p;
    f.dtype = DType::f32;
    return f;
  }
  return with_copies<Params>(p, copies, {&Params::q, &Params::k, &Params::v});
}

BackwardParams float_params(const BackwardParams& p, std::vector<Tensor>& copies) {
  if (reads_as_stored(p)) {
    BackwardParams f = p;
    f.dtype = DType::f32;
    return f;
  }
  return with_copies<BackwardParams>(p, copies,
                                     {&BackwardParams::q, &BackwardParams::k, &BackwardParams::v, &BackwardParams::dO});
}

}  // namespace attnscale::detail
