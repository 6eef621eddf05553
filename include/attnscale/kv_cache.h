// attnscale/kv_cache.h: decode (the new query tokens of each sequence) over an inference KV cache.
//
// A cache holds keys and values in one of four element types, read as stored (no conversion
// pass before the call):
//   float32;  bfloat16;  float16 (IEEE half, llama.cpp's default cache type);
//   int8 with one float32 scale per block of 32 consecutive values of a row
//   (x ≈ scale · q, q in [-127, 127]: the scheme of ggml's q8_0, with a float32 scale). Products
//   and sums are float32 in every case.
// and in one of two layouts:
//   contiguous  k [B, Hkv, Nkv, dk], v [B, Hkv, Nkv, dv]: sequence b's keys are rows 0..len_b-1
//   paged       k [num_blocks, block_size, Hkv, dk], v [num_blocks, block_size, Hkv, dv]: fixed-size
//               blocks shared by all sequences; block_table [B, max_blocks] (int32) lists the blocks
//               of sequence b in order, so its key j is row j % block_size of block
//               block_table[b][j / block_size] (the layout of vLLM's PagedAttention with the
//               FlashAttention backend, and of flash_attn_with_kvcache's block_table). A pool laid
//               out [num_blocks, Hkv, block_size, d] is passed as a strided view of that shape.
// Any strides, except that the last dimension of k and v (and of their scales) is contiguous.
// seq_lens [B] (int32) gives each sequence's number of keys (required when paged; contiguous:
// Nkv for every sequence when empty), so sequences of different lengths share one call; seq_starts
// [B] (int32, optional) the first of them, for a batch padded on the left.
//
// The result does not depend on the layout: paged and contiguous caches holding the same keys
// give the same bits, as do any thread counts (the keys are split into fixed chunks of 1024 by
// position, each chunk's partial softmax merged in order).
//
// Example (paged int8 cache, 4 sequences, GQA with 8 query heads per KV head):
//   attnscale::KVCache c;  c.k = k_i8;  c.k_scales = k_scales;  c.v = v_i8;  c.v_scales = v_scales;
//   c.block_table = table;  c.seq_lens = lens;
//   attnscale::decode(q /*[4, 32, 128]*/, c, out /*[4, 32, 128]*/);
#pragma once
#include <cstdint>

#include "attnscale/attention.h"
#include "attnscale/tensor.h"

namespace attnscale {

struct KVCache {
  TensorView k{}, v{};                // float32, bfloat16, float16 or int8 (both the same type)
  TensorView k_scales{}, v_scales{};  // int8 only: float32, k's (v's) shape with the last dimension d/32
  TensorView block_table{};           // paged only: [B, max_blocks] int32
  TensorView seq_lens{};              // [B] int32; may be empty for a contiguous cache
  TensorView seq_starts{};            // [B] int32, optional: sequence b's keys are [seq_starts[b], len_b),
                                      // the rows before them left padding, never read (FlashAttention's
                                      // cache_leftpad); 0 <= seq_starts[b] <= len_b. Empty: every start 0
};

struct DecodeOptions {
  Scale scale;                    // default 1/√dk
  std::int64_t window_left = -1;  // ≥ 0: a query sees only the window_left + 1 keys up to its own
  bool causal = true;             // several new tokens (Nq > 1): each sees keys up to its own;
                                  // false: every key of the sequence (or up to window_right after)
  std::int64_t window_right = -1;  // not causal, ≥ 0: a token sees at most window_right keys after its
                                   // own (FlashAttention's window_size[1]); causal allows -1 or 0
  int threads = 0;                // at most this many; 0: $ATTNSCALE_THREADS, else every core, and
                                  // one for a call that reads under 32 KiB of K and V
  // Score transforms, as Options' (attention.h), new token i at key position p_i = len_b − Nq + i
  // (the last key when Nq = 1): the score of key j is t = c·tanh(s·q·k_j / c) − slope_bh·|p_i − j|.
  double softcap = 0.0;       // c > 0; 0: no capping
  TensorView alibi_slopes{};  // [Hq] or [B, Hq], float32/float64; empty: no ALiBi
  // Arithmetic of the products. native: float32 products and sums whatever the cache's type. bf16:
  // over a bf16 cache, a GQA group's query rows (s folded in) and its probabilities may be rounded
  // to bfloat16 for Q·Kᵀ and P·V (vdpbf16ps: bf16 pairs multiplied exactly, summed in float32; the
  // softmax's normaliser sums the float32 probabilities), which halves the products' instructions.
  // It is taken where it is faster: groups of 2 or more query rows per KV head, dk a multiple of 8
  // and dv of 32, where the library's bf16 products multiply bf16 pairs (AMX; AVX-512 BF16 on AMD's
  // cores, not on Intel's, whose vdpbf16ps issues at half the FMAs' rate; $ATTNSCALE_BF16 may force
  // a path); other calls, and other caches, compute as native. Errors within about 1e-2 of
  // float64's (docs/numerics.md).
  Compute compute = Compute::native;
};

// q [B, Hq, dk] float32: the new token of each sequence, at its last key (the cache already holds
// the token's own key and value), seeing every key of the sequence; out [B, Hq, dv] float32; lse
// [B, Hq] float32 or float64, natural log, optional. Or q [B, Hq, Nq, dk], out [B, Hq, Nq, dv], lse
// [B, Hq, Nq]: Nq new tokens a sequence (speculative decoding, a chunk of a prompt), its last Nq
// keys, token i seeing keys up to its own (causal) or all of them; the cache is read once for all
// the rows. Hq a multiple of Hkv (query head h reads KV head h / (Hq/Hkv); the group shares each
// read of K and V). A row that sees no key gets out = 0, lse = -inf. Throws Error naming the
// argument on any mismatch.
void decode(const TensorView& q, const KVCache& cache, const TensorView& out, const TensorView& lse = {},
            const DecodeOptions& options = {});

// int8 quantisation for a cache: for every block of 32 consecutive values x of src's last
// dimension, scale = max|x| / 127 and q = round(x / scale) (all-zero block: scale 0, q 0).
// src float32 [..., d] with d a multiple of 32; dst int8 of src's shape; scales float32 with the
// last dimension d/32. Any strides (dst's and scales' last dimension contiguous).
void quantize_q8(const TensorView& src, const TensorView& dst, const TensorView& scales);

}  // namespace attnscale
