// attnscale/distributed.h: context-parallel (ring) attention over the ranks of an MPI communicator.
// Built when CMake finds MPI (library attnscale_distributed).
//
// The sequence is sharded along N: rank r holds the rows shard(N, K, r, sharding) of q (and out,
// lse, dout, dq) and of k, v (and dk, dv), concatenated in that order. K/V shards travel around the
// ring r → r+1 (non-blocking sends, double-buffered, so the transfer of the next shard overlaps the
// attention over the current one); each rank merges its partial (out, LSE) results with the LSE merge
// of decode.h. The backward sends the dK/dV accumulators around the ring with the K/V shards, so
// each rank ends with the gradients of its own K/V rows.
//
//   S   sharding       rows of rank r (N rows, K ranks)
//   contiguous         [r·N/K, (r+1)·N/K)
//   zigzag             chunks r and 2K−1−r of 2K equal chunks: with a causal mask every rank gets
//                      the same work (an early chunk sees few keys, its partner many)
//
// Shapes per rank: q [B, Hq, nq_r, dk], k [B, Hkv, nkv_r, dk], v [B, Hkv, nkv_r, dv] (2-D and 3-D
// views as in attention.h); out, lse, dq, dk, dv like the local inputs. GQA, dk ≠ dv, causal
// masks (both alignments, on the global diagonal), sliding windows, softcap; float32 and float64.
// Not supported (check_ring_options): explicit masks, the probability output, ALiBi, sinks,
// dropout and packed sequences.
//
// Transfers progress during the compute: Open MPI moves a large message only inside MPI calls, so
// when MPI was initialised with MPI_THREAD_SERIALIZED or above, a helper thread of the call tests the
// step's requests while the calling thread computes (the two never call MPI at once; as SERIALIZED
// requires anyway, the caller makes no MPI call from other threads during the call). Under MPI_THREAD_SINGLE or FUNNELED they progress between blocks only, and a transfer
// is then mostly paid for in the wait after the compute.
//
// Every rank of comm calls the function together. Arguments are checked on every rank and then
// agreed on: a shape, option or shard size that differs between ranks, or an error on any one rank,
// makes every rank throw the same Error (no rank waits forever). The ring order is fixed, so the
// result is bitwise the same from run to run for a given number of ranks (and any thread count).
//
// Example (4 ranks, causal, 2^16 tokens):
//   auto rows = attnscale::distributed::shard(65536, size, rank, Sharding::zigzag);  // load these rows
//   attnscale::distributed::ring_forward(q, k, v, {out, lse}, opt, MPI_COMM_WORLD, Sharding::zigzag);
#pragma once
// Open MPI's C++ bindings (deprecated since MPI 2.2, removed in MPI 3) are not used here; without
// this, g++ -Wextra warns in their header (-Wcast-function-type) wherever this one is included.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/error.h"

namespace attnscale::distributed {

// The Error every rank throws together when the ranks disagree or any one of them failed: no rank
// is left waiting, so a caller may simply report it and finish MPI on every rank.
class AgreedError : public Error {
 public:
  using Error::Error;
};

enum class Sharding { contiguous, zigzag };

// A run of global rows [begin, begin + length).
struct Segment {
  std::int64_t begin = 0, length = 0;
};

// The global rows rank `rank` of `ranks` holds for a sequence of n rows, in local order. Sizes
// differ by at most one row between ranks (zigzag: between chunks) when n is not divisible.
std::vector<Segment> shard(std::int64_t n, int ranks, int rank, Sharding sharding);
std::int64_t shard_rows(std::int64_t n, int ranks, int rank, Sharding sharding);

// Where the time went on this rank (optional): attention on the local blocks, and waiting for
// transfers the compute did not hide.
struct RingTimes {
  double compute_seconds = 0, wait_seconds = 0;
};

// Throws Error naming the first option of `options` that ring attention cannot take: each block is
// the public forward on its own rows and keys, so options that depend on a pair's global position
// or on the whole row would be taken per block (ALiBi's distances from the block's corner, a sink
// once per block, a dropout mask keyed by local positions) and give another result than one call.
void check_ring_options(const Options& options);

// Forward: outputs.out (required) and outputs.lse (optional, needed by the backward) for the local
// query rows, over the keys of every rank.
void ring_forward(const TensorView& q, const TensorView& k, const TensorView& v, const Outputs& outputs,
                  const Options& options, MPI_Comm comm, Sharding sharding = Sharding::contiguous,
                  RingTimes* times = nullptr);

// Backward from the local out and lse of ring_forward and the local dout: dq for the local query
// rows, dk and dv for the local key rows.
void ring_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& lse, const TensorView& dout, const Gradients& grads, const Options& options,
                   MPI_Comm comm, Sharding sharding = Sharding::contiguous, RingTimes* times = nullptr);

}  // namespace attnscale::distributed
