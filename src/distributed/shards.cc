// shard(): which global rows a rank holds (see distributed.h).
#include <string>

#include "attnscale/distributed.h"
#include "attnscale/error.h"

namespace attnscale::distributed {
namespace {
// Chunk c of `parts` equal chunks of n rows: [c·n/parts, (c+1)·n/parts).
Segment chunk(std::int64_t n, std::int64_t parts, std::int64_t c) {
  const std::int64_t begin = c * n / parts, end = (c + 1) * n / parts;
  return {begin, end - begin};
}
}  // namespace

std::vector<Segment> shard(std::int64_t n, int ranks, int rank, Sharding sharding) {
  if (n < 0) throw Error("shard: n must be >= 0, got " + std::to_string(n));
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error("shard: rank " + std::to_string(rank) + " of " + std::to_string(ranks) + " ranks");
  if (sharding == Sharding::contiguous) return {chunk(n, ranks, rank)};
  return {chunk(n, 2 * std::int64_t{ranks}, rank), chunk(n, 2 * std::int64_t{ranks}, 2 * std::int64_t{ranks} - 1 - rank)};
}

std::int64_t shard_rows(std::int64_t n, int ranks, int rank, Sharding sharding) {
  std::int64_t rows = 0;
  for (const Segment& s : shard(n, ranks, rank, sharding)) rows += s.length;
  return rows;
}

}  // namespace attnscale::distributed
