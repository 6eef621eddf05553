// Where LineFeed's lines go, by CPU, and the rows a one-row decode over a paged cache asks for
// ahead of those it reads (kv_stream_heads.cc, StreamHeadsT).
//
// On Intel's cores the second-level cache: GQA decode's feeds ask for a whole tile of K and V
// (32 KiB each at float32, d = 128) one phase of arithmetic ahead, and into L1 (prefetcht0) they
// ran at 0.74-0.81 of a copy from DRAM (Hq = 32, Hkv = 4, Nkv = 65536, two threads) where into L2
// (prefetcht1) they ran at 0.95-0.99, the L1 fetch of each line then left to the core's own
// prefetchers and loads (a 2-core Xeon with AMX; bf16 0.74-0.75 -> 0.80, the bf16 products on AMX
// 0.68 -> 0.75, float16 and int8 within the noise; docs/performance.md, "The Intel AMX machine,
// 2026-12-05, 11:20"). Elsewhere the first: on Zen 5 into L2 took 5.52 ms against 5.18 (float32,
// the same case), on Zen 3 0.99-1.05 of the time. The paged one-row stream's prefetches (all heads'
// rows of the key 128 KiB ahead) likewise: on the Xeon 0.874-0.890 of a copy into L1, 0.927-0.942
// into L2 (H = 8, Nkv = 65536, d = 128, two threads); on Zen 5 into L2 took 1.97x a contiguous
// cache's time against 1.77x (float32; bf16 1.88x against 1.66x).
#include "common/prefetch.h"

#include "common/cpu_model.h"

namespace attnscale::detail {

CacheLevel feed_level() {
  static const CacheLevel level = cpu_model().intel ? CacheLevel::far : CacheLevel::near;
  return level;
}

}  // namespace attnscale::detail
