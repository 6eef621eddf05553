// stream_row_strided (kv_kernels.h): one query row streamed over a contiguous cache's keys, K and
// V rows side by side. The scalar target goes key by key (StreamRowT); vector targets in pipelined
// tiles of 16 keys: StreamKeys, the output row in registers, where dv is 4, 8 or 16 vectors (but
// not for int8 rows with dk != dv), else StreamTiles (both below); rows off a line are read line by
// line on AVX-512.
// Why K and V side by side: a path that reads a tile's K rows, then (after the softmax) its V
// rows, makes its arithmetic and its memory traffic add up rather than overlap; reading K rows
// beside V rows keeps both streams moving together (measured in docs/performance.md).
// Compiled once per Highway target like kernels.cc.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kv_stream_row.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attention/kv_kernels.h"
#include "attention/kv_row_stream-inl.h"
#include "attention/kv_rows-inl.h"
#include "common/prefetch.h"

HWY_BEFORE_NAMESPACE();
namespace attnscale::detail::kv::HWY_NAMESPACE {

#if HWY_TARGET != HWY_SCALAR
// acc (dv = CB vectors) += Σ_x p_x·V_x over the tile's keys [x0, x1): each V row loaded and
// widened once, its vectors multiplied into CB independent sums; an int8 row goes block by block
// of 32 values, its coefficient p_x·scale_b formed once per block.
template <int kType, size_t CB, class R, class S>
HWY_INLINE void TileUpdate(DF d, size_t x0, size_t x1, R vrow, S vsc,
                           const float* p, RawF (&acc)[CB]) {
  constexpr size_t kL = hn::MaxLanes(DF());
  constexpr size_t kPer = kType == kI8 ? 32 / kL : CB;  // vectors of one coefficient per row
  static_assert(CB % kPer == 0);
  for (size_t x = x0; x < x1; ++x)
#pragma GCC unroll 16
    for (size_t b0 = 0; b0 < CB; b0 += kPer) {
      const VF cf = hn::Set(d, kType == kI8 ? p[x] * vsc[x][b0 / kPer] : p[x]);
#pragma GCC unroll 16
      for (size_t b = b0; b < b0 + kPer; ++b)
        acc[b] = ToRaw(hn::MulAdd(cf, LoadRaw<kType>(d, vrow[x], b * kL), FromRaw(acc[b])));
    }
}

// The same for any dv, the row in O: O = alpha·O + Σ_x p_x·V_x over the tile's nk keys, a vector
// of O at a time.
template <int kType, class R, class S>
HWY_INLINE void TileUpdateRow(DF d, size_t nk, size_t dv, R vrow, S vsc,
                              const float* p, float alpha, float* O) {
  constexpr size_t kL = hn::MaxLanes(DF());
  const size_t fullv = dv / kL * kL;
  if constexpr (kType == kI8 && kL == 8) {
    // int8 on 8 lanes: a block of 32 values (4 vectors) at a time, p_x·scale_b formed once a key and
    // block rather than once a vector: the same coefficient, so the same sums (H = 8, d = 128,
    // Nkv = 65536, two threads, alternated: 0.76 of the time; docs/performance.md).
    for (size_t e = 0; e < dv; e += 32) {
      VF o[4];
      for (size_t i = 0; i < 4; ++i) {
        o[i] = hn::LoadU(d, O + e + i * kL);
        if (alpha != 1.0f) o[i] = hn::Mul(o[i], hn::Set(d, alpha));
      }
      for (size_t x = 0; x < nk; ++x) {
        const VF cf = hn::Set(d, p[x] * vsc[x][e / 32]);
        for (size_t i = 0; i < 4; ++i) o[i] = hn::MulAdd(cf, LoadRaw<kType>(d, vrow[x], e + i * kL), o[i]);
      }
      for (size_t i = 0; i < 4; ++i) hn::StoreU(o[i], d, O + e + i * kL);
    }
    return;
  }
  for (size_t e = 0; e < fullv; e += kL) {
    VF o = hn::LoadU(d, O + e);
    if (alpha != 1.0f) o = hn::Mul(o, hn::Set(d, alpha));
    for (size_t x = 0; x < nk; ++x)
      o = hn::MulAdd(hn::Set(d, kType == kI8 ? p[x] * vsc[x][e / 32] : p[x]), LoadRaw<kType>(d, vrow[x], e), o);
    hn::StoreU(o, d, O + e);
  }
  for (size_t e = fullv; e < dv; ++e) {  // float32 / bf16 rows only (int8 dv is a multiple of 32)
    float o = O[e] * alpha;
    for (size_t x = 0; x < nk; ++x) o += p[x] * Element<kType>(vrow[x], nullptr, e);
    O[e] = o;
  }
}

// Rows 0, 1, 2, .. of a contiguous cache (StridedRows, StridedScales) in turn, walked by a pointer
// stepped by the stride: with row x formed as base + x·stride for every key (a multiply on each
// row's address) the same loop read K and V from DRAM at 0.78-0.88 of a copy's rate, stepped at
// 0.93-1.0 (float32, H = 8, d = 128, Nkv = 65536, alternated call by call; docs/performance.md).
template <class R>
struct RowCursor {
  decltype(R::base) p;  // const char* (stride in bytes) or const float* (in floats)
  std::ptrdiff_t stride;
  explicit RowCursor(R r) : p(r.base), stride(r.stride) {}
  auto operator*() const { return p; }
  void operator++() { p += stride; }
};

// Rows that all lie the same o words (4 bytes) past a 64-byte line: a contiguous cache whose base
// is not line-aligned (numpy and malloc align large blocks to 16 bytes). Read where they lie, every
// 64-byte load spans two lines; read line by line (AVX-512), a row costs one load more, its first
// line keeping lanes o.. and its last lanes ..o (masked loads: nothing read outside the row).
// - K (each): vector v of the row's words is lanes o.. of line v joined with line v + 1, one
//   two-source permute, so that a score sums the same products in the same lanes as in place.
// - V (lines): the output row is kept shifted by o lanes, line by line (one accumulator more), and
//   each line goes in as loaded: every element still sums its own products in key order.
// Both give the bits of rows read in place. Time 16 bytes off a line over time aligned, one thread,
// calls alternated (docs/performance.md), in place -> from lines: float32 d = 128 1.13 -> 1.09 in
// L3, 1.08 -> 1.03 from DRAM; bfloat16 d = 128 1.26 -> 1.16 and 1.26 -> 1.03, d = 256 1.31 -> 1.12
// and 1.54 -> 0.94. Taken by StreamKeysFor.
struct NoLines {};
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
class WordsFromLines {
 public:
  // Rows at `base` + j·stride: one offset for all when the stride is whole lines.
  static bool fits(const void* base, std::ptrdiff_t stride) {
    return reinterpret_cast<std::uintptr_t>(base) % 4 == 0 && stride % 64 == 0;
  }
  static bool off_line(const void* base) { return reinterpret_cast<std::uintptr_t>(base) % 64 != 0; }
  explicit WordsFromLines(const void* base)
      : o_(static_cast<int>(reinterpret_cast<std::uintptr_t>(base) % 64 / 4)),
        idx_(_mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                              _mm512_set1_epi32(o_))),
        first_(static_cast<__mmask16>(0xFFFFu << o_)), last_(static_cast<__mmask16>((1u << o_) - 1)) {}
  // The output row into and out of the lines' frame, N vectors of words `stride` floats apart
  // (lines likewise, N + 1 of them): line u holds words [16u − o, 16u + 16 − o), zero outside the
  // row, one permute a vector each way.
  template <size_t N>
  HWY_INLINE void to_lines(const float* words, float* lines, size_t stride) const {
    const __m512i back = _mm512_add_epi32(idx_, _mm512_set1_epi32(16 - 2 * o_));  // lanes 16 − o..
    for (size_t u = 0; u <= N; ++u) {
      const __m512 prev = u > 0 ? _mm512_loadu_ps(words + (u - 1) * stride) : _mm512_setzero_ps();
      const __m512 next = u < N ? _mm512_loadu_ps(words + u * stride) : _mm512_setzero_ps();
      _mm512_storeu_ps(lines + u * stride, _mm512_permutex2var_ps(prev, back, next));
    }
  }
  template <size_t N>
  HWY_INLINE void from_lines(const float* lines, float* words, size_t stride) const {
    for (size_t v = 0; v < N; ++v)
      _mm512_storeu_ps(words + v * stride, _mm512_permutex2var_ps(_mm512_loadu_ps(lines + v * stride), idx_,
                                                                  _mm512_loadu_ps(lines + (v + 1) * stride)));
  }
  // f(u, line u) for the N + 1 lines of a row of N vectors of words.
  template <size_t N, class F>
  HWY_INLINE void lines(const void* row, F&& f) const {
    const float* line = reinterpret_cast<const float*>(static_cast<const char*>(row) - 4 * o_);
    f(0, VF{_mm512_maskz_load_ps(first_, line)});
#pragma GCC unroll 16
    for (size_t u = 1; u < N; ++u) f(u, VF{_mm512_load_ps(line + 16 * u)});
    f(N, VF{_mm512_maskz_load_ps(last_, line + 16 * N)});
  }
  // f(v, words [16v, 16v + 16) of the row) for v < N.
  template <size_t N, class F>
  HWY_INLINE void each(const void* row, F&& f) const {
    const float* line = reinterpret_cast<const float*>(static_cast<const char*>(row) - 4 * o_);
    __m512 prev = _mm512_maskz_load_ps(first_, line);
#pragma GCC unroll 16
    for (size_t v = 0; v < N; ++v) {
      const __m512 next = v + 1 < N ? _mm512_load_ps(line + 16 * (v + 1)) : _mm512_maskz_load_ps(last_, line + 16 * N);
      f(v, VF{_mm512_permutex2var_ps(prev, idx_, next)});
      prev = next;
    }
  }

 private:
  int o_;
  __m512i idx_;
  __mmask16 first_, last_;
};
#endif

// stream_row_strided with dv = CB vectors (the output row in registers): tiles of kStreamKeys keys
// as StreamTiles, but key by key: tile t's scores are in, then for each x the score of tile
// t + 1's key x (one K row) and the update by tile t's key x (one V row), so that K and V are read
// a row each in turn, kStreamKeys keys apart. StreamTiles' four keys a step (four K rows, then
// four V rows) read at 0.73-0.76 of a copy's rate where a loop of this shape read at 0.93-1.0,
// alternated call by call (float32, H = 8, d = 128, Nkv = 65536; docs/performance.md).
// A key's score is KeyScore's arithmetic (even and odd vectors, then their lane sum); an int8
// key's is Σ_b scale_b·(Q·K)_b over its blocks b of 32 values, even and odd blocks in two sums,
// and its V row goes in through TileUpdate, one coefficient p·scale_b a block. bfloat16 rows with
// dk = dv go in pair order (kPairs, PairLow above), Q and the output row reordered around the keys.
// dk is kDk (= dv, CB vectors, a constant for the compiler), or with kDk = 0 the dk given.
// W: NoLines, or (float32 and bfloat16 rows with dk = kDk) WordsFromLines, K's (wk) and V's (wv).
template <int kType, size_t CB, size_t kDk, class R, class S, class W = NoLines>
HWY_INLINE void StreamKeys(size_t nk, size_t dk_given, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                           float* l, float* O, size_t ahead, const RowTransform* tf,
                           const W& wk = W(), const W& wv = W()) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  constexpr size_t L = hn::MaxLanes(DF());
  constexpr size_t esize = kType == kF32 ? 4 : kType == kI8 ? 1 : 2, v_bytes = CB * L * esize;
  constexpr size_t kPer = kType == kI8 ? 32 / L : 1;  // vectors of one int8 block
  constexpr bool kPairs = PairScores<kType, kDk>();
  static_assert(CB % kPer == 0 && (kDk == 0 || kDk == CB * L));
  const size_t dk = kDk ? kDk : dk_given, k_bytes = dk * esize;
  constexpr bool kLines = !std::is_same_v<W, NoLines>;
  static_assert(!kLines || (kDk > 0 && (kType == kF32 || kPairs)));
  // Raw vectors: as Highway's vector structs GCC kept them on the stack (see StreamTiles).
  // From lines, the output row shifted by V's offset: a line more (one more for each of a
  // bfloat16 row's even and odd elements).
  constexpr size_t kAcc = CB + (kLines ? (kPairs ? 2 : 1) : 0);
  RawF acc[kAcc];
  HWY_ALIGN float qp[kPairs ? kDk : 1], op[kPairs ? CB * L : 1];  // Q and O in pair order
  if constexpr (kPairs) {
    PairOrder(L, Q, kDk, qp);
    PairOrder(L, O, CB * L, op);
  }
  float* const row_out = kPairs ? op : O;
  // From lines: the output row's words (float32 elements; bfloat16 in pair order, its even elements
  // and its odd ones, two halves a vector apart) in the lines' frame, for each half.
  HWY_ALIGN float ol[kLines ? kAcc * L : 1];
  constexpr size_t kHalves = kPairs ? 2 : 1, kWordVectors = CB / kHalves;
  if constexpr (kLines)
    for (size_t h = 0; h < kHalves; ++h) wv.template to_lines<kWordVectors>(row_out + h * L, ol + h * L, kHalves * L);
#pragma GCC unroll 16
  for (size_t c = 0; c < kAcc; ++c) acc[c] = ToRaw(hn::LoadU(d, (kLines ? ol : row_out) + c * L));
  // A key's score (StreamScore), its rows from lines as their words in place.
  const auto score = [&](const void* row, const float* sc) HWY_ATTR {
    if constexpr (kLines && kPairs) {
      (void)sc;
      VF a0 = hn::Zero(d), a1 = hn::Zero(d);
      wk.template each<kDk / (2 * L)>(row, [&](size_t v, VF x) HWY_ATTR {  // elements [2Lv, 2Lv + 2L)
        const VU w = hn::BitCast(du, x);
        a0 = hn::MulAdd(PairLow(d, w), hn::Load(d, qp + 2 * L * v), a0);
        a1 = hn::MulAdd(PairHigh(d, w), hn::Load(d, qp + 2 * L * v + L), a1);
      });
      return LaneSum(d, hn::Add(a0, a1));
    } else if constexpr (kLines) {  // float32: KeyScore's sums, even vectors and odd vectors
      (void)sc;
      VF a0 = hn::Zero(d), a1 = hn::Zero(d);
      wk.template each<CB>(row, [&](size_t v, VF x) HWY_ATTR {
        if (v % 2 == 0) a0 = hn::MulAdd(x, hn::LoadU(d, Q + v * L), a0);
        else a1 = hn::MulAdd(x, hn::LoadU(d, Q + v * L), a1);
      });
      return LaneSum(d, hn::Add(a0, a1));
    } else {
      return StreamScore<kType, kDk>(d, dk, row, sc, kPairs ? qp : Q);
    }
  };
  // int8 rows `ahead` keys past those read, a line at a time: K rows are read a
  // tile before their V rows, so one prefetch serves both when ahead >= kStreamKeys; short of
  // that, K's own rows `ahead` past them (as StreamTiles). Walked by cursors as the rows read. The
  // other types go without: read a row at a time they were faster left to the hardware prefetcher
  // (calls alternated in one process, H = 8, Nkv = 65536, 8 KiB ahead against none: without, bf16
  // d = 128 took 0.83-0.89 of the time, float32 d = 64 0.89-0.90, bf16 d = 64 0.96-0.97; int8
  // d = 128 took 0.94-0.97 of the time with it, d = 64 1.05). The scales of a contiguous int8
  // cache are left to the hardware too: a line of them serves 4 keys (d = 128) or 8 (d = 64), and
  // a prefetch of it on every key cost more than it saved (H = 8, Nkv = 65536, two threads,
  // alternated, four runs: d = 128 0.92-0.94 of a copy without against 0.85-0.88 with; d = 64
  // 0.76-0.78 against 0.72; one thread, K and V in L2: 8.4 ns a key against 8.8;
  // docs/performance.md).
  if constexpr (kType != kI8) ahead = 0;
  const size_t k_ahead = ahead >= kStreamKeys ? ahead : kStreamKeys + ahead;
  RowCursor<R> kp{krow + k_ahead}, kc{krow}, vc{vrow};
  const std::ptrdiff_t v_ahead = static_cast<std::ptrdiff_t>(ahead) * vrow.stride;  // from a V row to `ahead` on
  RowCursor<S> ksr{ksc}, vsr{vsc};  // int8 scales as their rows (other types: null, never read or stepped)
  const auto next_k = [&] {  // the next K row (and its scales) to score
    ++kc;
    if constexpr (kType == kI8) ++ksr;
  };
  float mm = *m, ll = *l;
  HWY_ALIGN float s[2][kStreamKeys] = {};  // defined lanes past a short first tile (transforms read them)
  // int8 keys on AVX-512: each key's score vector kept before its lane sum, and the tile's 16 sums
  // taken together (LaneSums16, the same bits as LaneSum).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  constexpr bool kSums16 = kType == kI8 && L == 16 && kStreamKeys == 16;
#else
  constexpr bool kSums16 = false;
#endif
  HWY_ALIGN float lanes[kSums16 ? 2 : 1][kSums16 ? 256 : 1] = {};
  const auto score_into = [&](size_t t, size_t x) HWY_ATTR {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (kSums16) {
      hn::Store(Int8ScoreLanes<kDk>(d, dk, *kc, *ksr, Q), d, lanes[t] + 16 * Lane16Row(x));
      return;
    }
#endif
    s[t][x] = score(*kc, kType == kI8 ? *ksr : nullptr);
  };
  const size_t first = nk < kStreamKeys ? nk : kStreamKeys;
  for (size_t x = 0; x < first; ++x, next_k()) score_into(0, x);
  for (size_t j = 0, t = 0; j < nk; j += kStreamKeys, t ^= 1) {
    const size_t n = nk - j < kStreamKeys ? nk - j : kStreamKeys;
    const size_t rest = nk - j - n, next = rest < kStreamKeys ? rest : kStreamKeys;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (kSums16) hn::Store(LaneSums16(lanes[t]), d, s[t]);
#endif
    if (tf) TransformScores(d, s[t], j, kStreamKeys, *tf);
    const float alpha = TileSoftmax(d, n, s[t], mm, ll);
    if (alpha != 1.0f)
#pragma GCC unroll 16
      for (size_t c = 0; c < kAcc; ++c) acc[c] = ToRaw(hn::Mul(FromRaw(acc[c]), hn::Set(d, alpha)));
    for (size_t x = 0; x < n; ++x, ++vc) {
      if (ahead) {
        // V's rows at a fixed distance from the row read, no cursor of their own, and no bound:
        // past the cache's end a prefetch asks for a line no one reads (it never faults). One
        // cursor and two tests a key fewer: 7.81 against 8.04 ns a key in L2 (one thread, int8,
        // d = 128), from DRAM 1.00-1.06x the rate (docs/performance.md).
        prefetch_bytes(*kp, k_bytes, CacheLevel::near);
        prefetch_bytes(static_cast<const char*>(*vc) + v_ahead, v_bytes, CacheLevel::near);
        ++kp;
      }
      if (x < next) {
        score_into(t ^ 1, x);
        next_k();
      }
      const void* row = *vc;
      const float* sc = kType == kI8 ? *vsr : nullptr;
      if constexpr (kLines) {  // this key's V row, line by line (in pair order for bfloat16)
        const VF p = hn::Set(d, s[t][x]);
        wv.template lines<kPairs ? CB / 2 : CB>(row, [&](size_t u, VF x) HWY_ATTR {
          if constexpr (kPairs) {
            const VU w = hn::BitCast(du, x);
            acc[2 * u] = ToRaw(hn::MulAdd(p, PairLow(d, w), FromRaw(acc[2 * u])));
            acc[2 * u + 1] = ToRaw(hn::MulAdd(p, PairHigh(d, w), FromRaw(acc[2 * u + 1])));
          } else {
            acc[u] = ToRaw(hn::MulAdd(p, x, FromRaw(acc[u])));
          }
        });
      } else if constexpr (kPairs) {  // this key's V row, in pair order
        const VF p = hn::Set(d, s[t][x]);
#pragma GCC unroll 16
        for (size_t c = 0; c < CB; c += 2) {
          const auto w = LoadPairs(row, c * L);
          acc[c] = ToRaw(hn::MulAdd(p, PairLow(d, w), FromRaw(acc[c])));
          acc[c + 1] = ToRaw(hn::MulAdd(p, PairHigh(d, w), FromRaw(acc[c + 1])));
        }
      } else {
        TileUpdate<kType, CB>(d, 0, 1, &row, &sc, s[t] + x, acc);  // this key's V row
      }
      if constexpr (kType == kI8) ++vsr;
    }
  }
#pragma GCC unroll 16
  for (size_t c = 0; c < kAcc; ++c) hn::StoreU(FromRaw(acc[c]), d, (kLines ? ol : row_out) + c * L);
  if constexpr (kLines)
    for (size_t h = 0; h < kHalves; ++h) wv.template from_lines<kWordVectors>(ol + h * L, row_out + h * L, kHalves * L);
  if constexpr (kPairs) RowOrder(L, op, CB * L, O);
  *m = mm;
  *l = ll;
}

// stream_row_strided on vector targets: the keys in tiles of kStreamKeys (the last one partial), for rows
// StreamKeys does not take (int8 with dk != dv; dv not 4, 8 or 16 vectors). With the output row
// in registers (CB > 0) the tiles are pipelined: while tile t's V rows update the row,
// kStep keys at a time, tile t + 1's scores are computed kStep keys at a time between them, so that
// its K rows are read beside tile t's V rows (from DRAM both streams then move together, as key
// by key) and the softmax's chain of dependent steps overlaps the next tile's arithmetic.
template <int kType, size_t CB, size_t kStep, class R, class S>
HWY_INLINE void StreamTiles(size_t nk, size_t dk, size_t dv, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                            float* l, float* O, size_t ahead, const RowTransform* tf) {
  const DF d;
  const size_t L = hn::Lanes(d);
  float mm = *m, ll = *l;
  const size_t esize = kType == kF32 ? 4 : kType == kI8 ? 1 : 2;
  // The K rows (with k) and V rows (with v), and their int8 scales, of the n keys `ahead` keys past
  // key j within the call, a line at a time.
  auto prefetch = [&](size_t j, size_t n, bool k = true, bool v = true) {
    if (!ahead || j + ahead >= nk) return;
    const size_t x0 = j + ahead, x1 = j + ahead + n < nk ? j + ahead + n : nk;
    if constexpr (kType == kI8 && std::is_same_v<R, StridedRows>) {
      // int8 rows that follow each other (a contiguous cache): the keys' K rows as one run, then
      // their V rows, then each stream's scales. Against key by key (each key's K row, V row and
      // scale lines), alternated in one process, H = 8, d = 128, two threads, time: Nkv = 65536
      // 0.94-1.00 (median 0.96 over seven runs), 262144 0.94-0.98; bf16 rows lost that way
      // (1.02-1.05), and so did int8 rows key by key without the repeated scale lines (1.03-1.04).
      if (krow.stride == static_cast<std::ptrdiff_t>(dk) && vrow.stride == static_cast<std::ptrdiff_t>(dv)) {
        const auto run = [](const void* first, const void* end) {  // the lines of [first, end)
          const auto* p = reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(first) & ~std::uintptr_t{63});
          for (; p < static_cast<const char*>(end); p += 64) prefetch_line(p, CacheLevel::near);
        };
        if (k) run(krow[x0], krow[x1]);
        if (v) run(vrow[x0], vrow[x1]);
        if (k) run(ksc[x0], ksc[x1]);
        if (v) run(vsc[x0], vsc[x1]);
        return;
      }
    }
    for (size_t x = x0; x < x1; ++x) {
      if (k) prefetch_bytes(krow[x], dk * esize, CacheLevel::near);
      if (v) prefetch_bytes(vrow[x], dv * esize, CacheLevel::near);
      if (kType == kI8 && k) prefetch_line(ksc[x], CacheLevel::near);
      if (kType == kI8 && v) prefetch_line(vsc[x], CacheLevel::near);
    }
  };
  // The prefetches of a pipelined step of `step` keys from key j + x, whose V rows it reads beside
  // the K rows of the next tile. K rows are read a tile ahead of the V rows, so rows `ahead` keys
  // past the V rows lie ahead - kStreamKeys keys past the K rows read. Short of a tile (rows of more
  // than 512 bytes of K and V a key) that is behind them, and K rows are prefetched `ahead` keys past
  // their own reads instead (bf16, d = 256: 6.3 -> 4.8 ms; docs/performance.md). Longer, the one
  // prefetch serves both (moving K's further ahead was faster in some memory states and slower in
  // others).
  auto prefetch_step = [&](size_t j, size_t x, size_t step) {
    if (ahead >= kStreamKeys) {
      prefetch(j + x, step);
    } else {
      prefetch(j + kStreamKeys + x, step, true, false);
      prefetch(j + x, step, false, true);
    }
  };
  HWY_ALIGN float s[2][kStreamKeys] = {};  // defined lanes past a short first tile (transforms read them)
  auto keys = [&](size_t j) { return j < nk ? (nk - j < kStreamKeys ? nk - j : kStreamKeys) : 0; };
  // The end of the step of `step` keys from key x < n of a tile of n keys.
  auto step_end = [](size_t x, size_t step, size_t n) { return n - x < step ? n : x + step; };
  auto kr = [&](size_t j) { return krow + j; };
  auto ks = [&](size_t j) { return ksc ? ksc + j : S(); };
  if constexpr (CB > 0) {
    // Raw vectors: as Highway's vector structs GCC kept them on the stack, loaded and stored
    // around every four keys (one thread, rows in L3: int8 0.93, bf16 0.96-0.99 of the time).
    RawF acc[CB];
#pragma GCC unroll 16
    for (size_t b = 0; b < CB; ++b) acc[b] = ToRaw(hn::LoadU(d, O + b * L));
    if (nk) TileScores<kType>(d, 0, keys(0), dk, kr(0), ks(0), Q, s[0]);
    for (size_t j = 0, t = 0; j < nk; j += kStreamKeys, t ^= 1) {
      const size_t n = keys(j), next = keys(j + kStreamKeys);
      if (tf) TransformScores(d, s[t], j, kStreamKeys, *tf);
      const float alpha = TileSoftmax(d, n, s[t], mm, ll);
      if (alpha != 1.0f)
#pragma GCC unroll 16
        for (size_t b = 0; b < CB; ++b) acc[b] = ToRaw(hn::Mul(FromRaw(acc[b]), hn::Set(d, alpha)));
      const R vr = vrow + j;
      const S vs = vsc ? vsc + j : S();
      for (size_t x = 0; x < kStreamKeys; x += kStep) {
        prefetch_step(j, x, kStep);
        if (x < next) {
          TileScores<kType>(d, x, step_end(x, kStep, next), dk, kr(j + kStreamKeys), ks(j + kStreamKeys), Q, s[t ^ 1]);
        }
        if (x < n) TileUpdate<kType, CB>(d, x, step_end(x, kStep, n), vr, vs, s[t], acc);
      }
    }
#pragma GCC unroll 16
    for (size_t b = 0; b < CB; ++b) hn::StoreU(FromRaw(acc[b]), d, O + b * L);
  } else if constexpr (hn::MaxLanes(DF()) == 8) {
    // The output row in memory (AVX2 at dv = 16 vectors: its 16 registers cannot hold the row),
    // pipelined as above: tile t + 1's scores between tile t's V rows, row_step keys at a time,
    // float32 one key at a time (KeyScore), the others four (Scores4, the bits of the tile at
    // once). H = 8, d = 128, Nkv = 65536, two threads, alternated, time against the tile at once:
    // float32 0.76 (four keys 1.10), bf16 0.75 (one key 1.10), int8 0.86 (docs/performance.md).
    // int8 rows of up to 16 vectors go eight keys a step (each output vector loaded and stored
    // once per eight keys; the same bits). Against four, alternated in one process, H = 8,
    // d = 128, time: two threads, Nkv = 65536, 0.93-0.97 in six runs of seven (1.10 in one slow
    // phase), 262144 0.96-0.97; one thread in cache (Nkv = 2048) 0.93. bf16 and float16 rows
    // lost that way (1.09-1.11), and int8 rows of 32 vectors (d = 256: 1.5; docs/performance.md).
    const size_t row_step = kType == kF32 ? 1 : kType == kI8 && dv <= 16 * L ? 8 : 4;
    const size_t n0 = keys(0);
    for (size_t x = 0; x < n0; x += row_step) TileScores<kType>(d, x, step_end(x, row_step, n0), dk, kr(0), ks(0), Q, s[0]);
    for (size_t j = 0, t = 0; j < nk; j += kStreamKeys, t ^= 1) {
      const size_t n = keys(j), next = keys(j + kStreamKeys);
      if (tf) TransformScores(d, s[t], j, kStreamKeys, *tf);
      const float alpha = TileSoftmax(d, n, s[t], mm, ll);
      const R vr = vrow + j;
      const S vs = vsc ? vsc + j : S();
      for (size_t x = 0; x < kStreamKeys; x += row_step) {
        prefetch_step(j, x, row_step);
        if (x < next)
          TileScores<kType>(d, x, step_end(x, row_step, next), dk, kr(j + kStreamKeys), ks(j + kStreamKeys), Q,
                            s[t ^ 1]);
        // alpha with the first keys, then 1 (an exact multiply): the sums of the tile at once.
        if (x < n)
          TileUpdateRow<kType>(d, step_end(x, row_step, n) - x, dv, vr + x, vs ? vs + x : S(), s[t] + x,
                               x == 0 ? alpha : 1.0f, O);
      }
    }
  } else {
    for (size_t j = 0; j < nk; j += kStreamKeys) {
      const size_t n = keys(j);
      prefetch(j, kStreamKeys);
      TileScores<kType>(d, 0, n, dk, kr(j), ks(j), Q, s[0]);
      if (tf) TransformScores(d, s[0], j, kStreamKeys, *tf);
      const float alpha = TileSoftmax(d, n, s[0], mm, ll);
      TileUpdateRow<kType>(d, n, dv, vrow + j, vsc ? vsc + j : S(), s[0], alpha, O);
    }
  }
  *m = mm;
  *l = ll;
}
#endif

#if HWY_TARGET != HWY_SCALAR
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// StreamKeys from lines, a function of its own: inlined beside the other paths, it made GCC
// compile them slower (rows in place, one thread, in L2: 1.06-1.09x the time).
template <int kType, size_t CB, class R, class S>
HWY_NOINLINE void StreamKeysFromLines(size_t nk, R krow, S ksc, R vrow, S vsc, const float* Q, float* m, float* l,
                                      float* O, size_t ahead, const RowTransform* tf) {
  constexpr size_t kDv = CB * hn::MaxLanes(DF());
  StreamKeys<kType, CB, kDv>(nk, kDv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf, WordsFromLines(krow[0]),
                             WordsFromLines(vrow[0]));
}
#endif
// StreamKeys with dv = CB vectors, dk = dv a constant for the compiler (int8 rows: the only dk).
template <int kType, size_t CB, class R, class S>
HWY_INLINE void StreamKeysFor(size_t nk, size_t dk, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                              float* l, float* O, size_t ahead, const RowTransform* tf) {
  constexpr size_t kDv = CB * hn::MaxLanes(DF());
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // Float32 and bfloat16 rows of a contiguous cache off a line (rows a whole number of lines
  // apart) go in from whole lines (WordsFromLines), but rows of under four lines (bfloat16,
  // d = 64), where the line more is a quarter more loads and sums: against aligned rows, in L3
  // 1.15-1.18 of the time (in place 1.03-1.13), from DRAM 0.90-1.10 (in place 0.98-1.55;
  // docs/performance.md).
  if constexpr ((kType == kF32 || kType == kBF16) && kDv * (kType == kF32 ? 4 : 2) >= 256) {
    using WL = WordsFromLines;
    if (dk == kDv && (WL::off_line(krow.base) || WL::off_line(vrow.base)) && WL::fits(krow.base, krow.stride) &&
        WL::fits(vrow.base, vrow.stride))
      return StreamKeysFromLines<kType, CB>(nk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
  }
#endif
  if (kType == kI8 || dk == kDv) return StreamKeys<kType, CB, kDv>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
  if constexpr (kType != kI8) StreamKeys<kType, CB, 0>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
}

// The output row in registers when it is 4, 8 or (16-lane targets) 16 whole vectors.
template <int kType, size_t kStep, class R, class S>
HWY_INLINE void StreamRowSteps(size_t nk, size_t dk, size_t dv, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                               float* l, float* O, size_t ahead, size_t L,
                               const RowTransform* tf) {
  // Key by key (StreamKeys), but int8 rows with dk != dv, which stay on StreamTiles: dk = 192,
  // dv = 128, H = 8, two threads, alternated in one process against StreamTiles (fractions of a
  // copy beside them; docs/performance.md): float32 from DRAM (Nkv = 32768) 1.042 against 0.767,
  // cache-resident (H = 4, Nkv = 1024) 3.21 against 2.53 of the DRAM copy; bf16 1.130 against
  // 0.712, cached 1.755 against 1.458; float16 1.148 / 1.232 against 0.955 / 1.021, cached
  // 1.653 / 1.723 against 1.458 / 1.626; int8 0.809 / 0.736 / 0.826 against 0.792 / 0.824 /
  // 0.832, cached (Nkv = 2048) 0.866 / 0.950 / 0.886 against 0.954 / 0.964 / 1.085.
  if (dk == dv || kType != kI8) {
    if constexpr (kAccumulators >= 16)
      if (dv == 16 * L) return StreamKeysFor<kType, 16>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
    if (dv == 8 * L) return StreamKeysFor<kType, 8>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
    if (dv == 4 * L) return StreamKeysFor<kType, 4>(nk, dk, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
  }
  if constexpr (kType == kI8) {
    if constexpr (kAccumulators >= 16)
      if (dv == 16 * L) return StreamTiles<kType, 16, kStep>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
    if (dv == 8 * L) return StreamTiles<kType, 8, kStep>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
    if (dv == 4 * L) return StreamTiles<kType, 4, kStep>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);
  }
  return StreamTiles<kType, 0, 4>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, tf);  // kStep unused
}
#endif

template <int kType, class R, class S>
void StreamRowDispatch(size_t nk, size_t dk, size_t dv, R krow, S ksc, R vrow, S vsc, const float* Q, float* m,
                       float* l, float* O, size_t ahead, const RowTransform* tf) {
#if HWY_TARGET != HWY_SCALAR
  const size_t L = hn::Lanes(DF());
  // StreamTiles' step with the output row in registers, which only int8 rows with dk != dv take
  // (StreamRowSteps): rows of up to 128 values go 16 keys a step (a tile), longer ones 4. Against 4,
  // alternated in one process when every int8 row went this way (dk = dv, H = 8, Nkv = 65536,
  // 2 threads, 9 rounds, two runs): d = 64 0.81-0.84 of the time, d = 128 0.91-0.92, d = 256 1.11.
  if constexpr (kType == kI8)
    if (dk <= 128) return StreamRowSteps<kType, 16>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, L, tf);
  return StreamRowSteps<kType, 4>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, ahead, L, tf);
#else
  (void)ahead;
  StreamRowT<kType>(nk, dk, dv, krow, ksc, vrow, vsc, Q, m, l, O, tf);
#endif
}

void StreamRowStrided(int type, size_t nk, size_t dk, size_t dv, const void* k, std::ptrdiff_t k_stride,
                      const float* ksc, std::ptrdiff_t ksc_stride, const void* v, std::ptrdiff_t v_stride,
                      const float* vsc, std::ptrdiff_t vsc_stride, const float* Q, float* m, float* l, float* O,
                      size_t ahead, const RowTransform* tf) {
  const StridedRows kr{static_cast<const char*>(k), k_stride}, vr{static_cast<const char*>(v), v_stride};
  const StridedScales ks(ksc, ksc_stride), vs(vsc, vsc_stride);
  WithType(type, [&](auto t) {
    StreamRowDispatch<decltype(t)::value>(nk, dk, dv, kr, ks, vr, vs, Q, m, l, O, ahead, tf);
  });
}

}  // namespace attnscale::detail::kv::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnscale::detail::kv {
HWY_EXPORT(StreamRowStrided);

void stream_row_strided(int type, std::size_t nk, std::size_t dk, std::size_t dv, const void* k,
                        std::ptrdiff_t k_stride, const float* ksc, std::ptrdiff_t ksc_stride, const void* v,
                        std::ptrdiff_t v_stride, const float* vsc, std::ptrdiff_t vsc_stride, const float* Q, float* m,
                        float* l, float* O, std::size_t ahead, const RowTransform* tf) {
  HWY_DYNAMIC_DISPATCH(StreamRowStrided)
  (type, nk, dk, dv, k, k_stride, ksc, ksc_stride, v, v_stride, vsc, vsc_stride, Q, m, l, O, ahead, tf);
}
}  // namespace attnscale::detail::kv
#endif  // HWY_ONCE
