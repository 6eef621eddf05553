#include "distributed/same_values.h"

#include <cstdint>
#include <string_view>

namespace attnscale::distributed {
namespace {

// A rank's record: its error, then its values, each as "<length>:<bytes>" (values may hold anything).
void put(std::string& out, std::string_view s) {
  out += std::to_string(s.size());
  out += ':';
  out += s;
}

std::vector<std::string> split(std::string_view record) {
  std::vector<std::string> out;
  while (!record.empty()) {
    const std::size_t colon = record.find(':');
    if (colon == std::string_view::npos) break;
    const std::size_t n = std::stoull(std::string(record.substr(0, colon)));
    out.emplace_back(record.substr(colon + 1, n));
    record.remove_prefix(std::min(record.size(), colon + 1 + n));
  }
  return out;
}

std::string shown(const std::string& value) {
  if (value.empty()) return "not given";
  constexpr std::size_t kShown = 240;  // a sweep's list of points can be long: its start tells
  return value.size() <= kShown ? value : value.substr(0, kShown) + "...";
}

void check(int code) {
  if (code != MPI_SUCCESS) throw Error("MPI_Allgather failed while the ranks compared their arguments");
}

}  // namespace

void agree_on_values(MPI_Comm comm, const std::string& what, const std::vector<NamedValue>& mine,
                     const std::string& local_error, const std::string& hint_text) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::string record;
  put(record, local_error);
  for (const NamedValue& v : mine) {
    put(record, v.name);
    put(record, v.value);
    put(record, v.shown.empty() ? v.value : v.shown);
  }
  const int length = static_cast<int>(record.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
  std::int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[r] = static_cast<int>(total);
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  check(MPI_Allgatherv(record.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, comm));
  std::vector<std::vector<std::string>> of(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) of[r] = split(std::string_view(all).substr(offsets[r], lengths[r]));

  // Every rank reads the same records, so every rank throws the same message.
  for (int r = 0; r < size; ++r)
    if (!of[r].empty() && !of[r][0].empty())
      throw AgreedError((size > 1 ? "rank " + std::to_string(r) + ": " : std::string()) + of[r][0]);
  const std::string hint = " (" + hint_text + ")";
  for (int r = 1; r < size; ++r) {
    const auto& a = of[0];
    const auto& b = of[r];
    // After the error: (name, value, shown) for each value.
    for (std::size_t i = 1; i < std::max(a.size(), b.size()); i += 3) {
      if (i + 2 >= a.size() || i + 2 >= b.size() || a[i] != b[i])
        throw AgreedError("the ranks disagree on " + what + ": rank " + std::to_string(r) + " was started by " +
                          "another build or command than rank 0" + hint);
      if (a[i + 1] != b[i + 1])
        throw AgreedError("the ranks disagree on " + what + ": " + a[i] + ": " + shown(a[i + 2]) + " on rank 0, " +
                          shown(b[i + 2]) + " on rank " + std::to_string(r) + hint);
    }
  }
}

}  // namespace attnscale::distributed
