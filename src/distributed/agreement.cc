#include "distributed/agreement.h"

#include <cstring>
#include <vector>

namespace attnscale::distributed {

void agree(MPI_Comm comm, const std::string& local_error) {
  constexpr int kWidth = 480;  // bytes of each rank's message (longer ones are cut)
  int size = 1;
  MPI_Comm_size(comm, &size);
  char mine[kWidth] = {};
  std::strncpy(mine, local_error.c_str(), kWidth - 1);
  std::vector<char> all(static_cast<std::size_t>(kWidth) * size);
  if (MPI_Allgather(mine, kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, comm) != MPI_SUCCESS)
    throw Error("MPI_Allgather failed while the ranks compared their arguments");
  for (int r = 0; r < size; ++r) {
    const char* text = all.data() + static_cast<std::size_t>(kWidth) * r;
    if (text[0] != '\0') throw AgreedError((size > 1 ? "rank " + std::to_string(r) + ": " : std::string()) + text);
  }
}

}  // namespace attnscale::distributed
