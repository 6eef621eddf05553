// forward(): the public entry point of the fast path.
//
// Work items are blocks of kBr query rows of one (batch, head); threads take them from an atomic
// counter (parallel_for), costliest first for causal masks, each with its own scratch tiles.
// A block's result depends only on its rows and the inputs, so any thread count gives the same
// bits. Each block runs the tiled online softmax of flash_forward.h; few-row, long-key problems
// go to decode.cc instead: the KV-cache decode where the rows are new tokens of a cache, else
// split keys.
#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attention/bf16_as_float.h"
#include "attention/bf16_kernels.h"
#include "attention/flash_forward.h"
#include "attention/forward_scratch.h"
#include "attention/kernels.h"
#include "attention/params.h"
#include "attention/score_transforms.h"
#include "attention/varlen.h"
#include "attnscale/error.h"
#include "common/parallel.h"

namespace attnscale {
namespace detail {
namespace {

// The tiled forward's work items: blocks of kBr query rows of each (batch, head).
std::int64_t query_blocks(const ForwardShape& s) { return (s.Nq + kBr - 1) / kBr; }

// V rows off 64-byte boundaries, and gapped K and V rows (AlignedRows::wanted and gapped_for; K is
// read by broadcasts, for which a boundary does not matter): an aligned copy of each head per thread
// (within AlignedRows::kBudgetBytes, V first) when several query blocks read all of it (no sliding
// window, whose blocks read a band of it each). The bytes of the copies all threads hold, of K's
// rows (`keys`) and V's (`values`), or -1 where they would pass the budget.
template <class T>
std::int64_t copies_bytes(const ForwardShape& s, int threads, bool keys, bool values) {
  const std::int64_t row = (keys ? AlignedRows<T>::stride(s.dk) : 0) + (values ? AlignedRows<T>::stride(s.dv) : 0);
  const std::int64_t bytes = threads * s.Nkv * row * std::int64_t{sizeof(T)};
  return bytes <= AlignedRows<T>::kBudgetBytes ? bytes : -1;
}
bool several_blocks_read_all(const ForwardShape& s) { return query_blocks(s) > 1 && !s.window; }

template <class T>
double tiled_scratch_bytes(const ForwardShape& s) {
  const int threads = resolve_threads(s.threads, s.B * s.Hq * query_blocks(s));
  // V as a contiguous array on a 64-byte boundary (as Tensor allocates it): copied where its rows
  // are not (AlignedRows::wanted); its rows are never gapped, nor K's.
  const bool off_lines = std::is_same_v<T, float> && s.dtype == DType::f32 && (s.dv * 4) % 64 != 0;
  const std::int64_t copies = several_blocks_read_all(s) && off_lines ? copies_bytes<T>(s, threads, false, true) : -1;
  return static_cast<double>(threads) * static_cast<double>(ForwardScratch<T>::bytes(s.dk, s.dv)) +
         static_cast<double>(std::max<std::int64_t>(copies, 0));
}

template <class T>
void forward_all(const Params& p) {
  if constexpr (std::is_same_v<T, float>)
    if (cache_decode(p)) return;
  if (use_decode(p)) return decode_all<T>(p);
  const ForwardShape shape = forward_shape(p);
  const std::int64_t nqb = query_blocks(shape), items = p.B * p.Hq * nqb;
  const int threads = resolve_threads(p.threads, items);
  PerThread<ForwardScratch<T>> scratch(threads);
  const bool several = several_blocks_read_all(shape);
  const bool copy_values =
      several && AlignedRows<T>::wanted(p.v, nqb) && copies_bytes<T>(shape, threads, false, true) >= 0;
  const bool copy_keys = several && AlignedRows<T>::gapped_for(p.k, nqb) &&
                         copies_bytes<T>(shape, threads, true, copy_values) >= 0;
  PerThread<AlignedRows<T>> keys(copy_keys ? threads : 0), values(copy_values ? threads : 0);
  parallel_for(items, 1, threads, [&](std::int64_t i0, std::int64_t i1, int t) {
    ForwardScratch<T>& s = scratch.get(t, p);
    for (std::int64_t item = i0; item < i1; ++item) {
      const RowBlock rb = query_block(p, item, nqb);
      if (copy_values) {
        AlignedRows<T>& v = values.get(t);
        s.v_rows = v.hold(p.v, rb.b, rb.kh, rb.kh + 1, p.Nkv, p.dv);
        s.v_ld = v.ld;
      }
      if (copy_keys) {
        AlignedRows<T>& k = keys.get(t);
        s.k_rows = k.hold(p.k, rb.b, rb.kh, rb.kh + 1, p.Nkv, p.dk);
        s.k_ld = k.ld;
      }
      attend(p, rb, 0, p.Nkv, s);
      s.k_rows = s.v_rows = nullptr;  // the scratch outlives this call (PerThread recycles it)
      if (!p.sinks.empty()) fold_sinks(p, rb, s.o.get(), s.m.get(), s.l.get());
      write_rows(p, rb, s.o.get(), s.m.get(), s.l.get());
      // attend() leaves the last tile's 2^(t − m) unless a sink moved m or dropout changed it.
      if (!p.probs.empty()) write_probs(p, rb, s, /*scores_left=*/p.sinks.empty() && !p.has_dropout());
    }
  });
}

}  // namespace

double tiled_forward_scratch_bytes(const ForwardShape& s) {
  return s.dtype == DType::f64 ? tiled_scratch_bytes<double>(s) : tiled_scratch_bytes<float>(s);
}

}  // namespace detail

void detail::run_forward(const Params& p, Compute compute) {
  if (runs_as_float(p, compute)) {  // bf16 products widened anyway: the float32 kernels (bf16_as_float.h)
    std::vector<Tensor> copies;
    return forward_all<float>(float_params(p, copies));
  }
  switch (p.dtype) {
    case DType::f32:
      if (compute == Compute::bf16) return bfdot::forward(p);
      return forward_all<float>(p);
    case DType::f64: return forward_all<double>(p);
    case DType::bf16:
      if (detail::cache_decode(p)) return;  // few rows over long keys: the bf16 cache read as stored
      return bfdot::forward(p);
    default: throw Error("q: dtype " + std::string(dtype_name(p.dtype)) + " is not supported by forward");
  }
}

void forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
             const Options& options) {
  detail::simd::init_target_from_env();
  if (detail::is_varlen(options)) return detail::varlen_forward(q, k, v, outputs, options, detail::Kernel::fast);
  detail::run_forward(detail::make_forward_params(q, k, v, outputs, options, detail::Kernel::fast), options.compute);
}

}  // namespace attnscale
