// Built against attnscale::distributed (CMakeLists.txt, WITH_DISTRIBUTED): ten rows over two
// ranks, rank 0's share, without starting MPI.
#include <cstdio>

#include "attnscale/distributed.h"

int main() {
  using attnscale::distributed::Sharding;
  const auto rows = attnscale::distributed::shard_rows(10, 2, 0, Sharding::zigzag);
  std::printf("rank 0 of 2 holds %lld of 10 rows\n", static_cast<long long>(rows));
  return rows == 5 ? 0 : 1;
}
