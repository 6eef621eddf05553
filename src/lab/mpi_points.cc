#include "lab/mpi_points.h"

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "attnscale/error.h"
#include "lab/row_codec.h"

namespace attnscale::lab {
namespace {

constexpr int kRowsTag = 7101;  // one message per finished point: 8 bytes of index, then its rows

void check(int code, const char* what) {
  if (code != MPI_SUCCESS) throw Error(std::string("MPI: ") + what + " failed");
}

std::string receive_any(MPI_Comm comm, MPI_Status& status) {
  check(MPI_Probe(MPI_ANY_SOURCE, kRowsTag, comm, &status), "MPI_Probe");
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  std::string message(static_cast<std::size_t>(bytes), '\0');
  check(MPI_Recv(message.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kRowsTag, comm, MPI_STATUS_IGNORE), "MPI_Recv");
  return message;
}

// Sends `text` from rank 0 to every rank of comm (length first).
void broadcast(MPI_Comm comm, std::string& text) {
  std::uint64_t length = text.size();
  check(MPI_Bcast(&length, 1, MPI_UINT64_T, 0, comm), "MPI_Bcast");
  text.resize(length);
  // In pieces below 2^31 bytes (MPI counts are int).
  for (std::uint64_t at = 0; at < length; at += std::uint64_t{1} << 30) {
    const int piece = static_cast<int>(std::min<std::uint64_t>(length - at, std::uint64_t{1} << 30));
    check(MPI_Bcast(text.data() + at, piece, MPI_BYTE, 0, comm), "MPI_Bcast");
  }
}

}  // namespace

MpiPoints::MpiPoints(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

std::vector<std::vector<Row>> MpiPoints::run(std::size_t n, int threads, const RunPoint& run_point,
                                             const CompletedPoints& completed, const Progress& progress) const {
  // Every rank built the same sweep from the same flags; a rank that did not (another binary,
  // other flags) would wait forever for points that never come, so it is an Error on every rank.
  std::uint64_t range[2] = {n, ~std::uint64_t{n}}, agreed[2];
  check(MPI_Allreduce(range, agreed, 2, MPI_UINT64_T, MPI_MAX, comm_), "MPI_Allreduce");
  if (agreed[0] != n || ~agreed[1] != n)
    throw Error("the ranks disagree on the sweep (" + std::to_string(n) + " points on rank " + std::to_string(rank_) +
                "): start every rank with the same command");

  // Rank 0 holds the journal: it says which points are done.
  std::string done(n, '\0');
  if (rank_ == 0)
    for (const auto& [i, rows] : completed) {
      if (i >= n) throw Error("resumed rows name point " + std::to_string(i) + " of a sweep of " + std::to_string(n));
      done[i] = 1;
    }
  broadcast(comm_, done);
  std::vector<std::size_t> mine;
  std::size_t remaining = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (!done[i] && remaining++ % static_cast<std::size_t>(size_) == static_cast<std::size_t>(rank_)) mine.push_back(i);

  std::vector<std::vector<Row>> results(n);
  std::vector<char> have(n, 0);
  std::size_t next = 0, missing = n;  // points [0, next) have been reported, in order
  if (rank_ == 0)
    for (const auto& [i, rows] : completed) results[i] = rows, have[i] = 1, --missing;
  auto report_ready = [&] {  // rank 0
    while (next < n && have[next]) {
      if (progress) progress(next + 1, n, results[next]);
      ++next;
    }
  };
  auto arrived = [&](std::size_t i, std::vector<Row> rows) {  // rank 0
    results[i] = std::move(rows);
    have[i] = 1;
    --missing;
    report_ready();
  };
  auto take_message = [&](const std::string& message) {
    std::uint64_t i = 0;
    std::memcpy(&i, message.data(), sizeof i);
    if (i >= n || have[i]) throw Error("MPI: a rank sent rows for point " + std::to_string(i) + " twice or out of range");
    arrived(i, decode_rows(message.substr(sizeof i)));
  };
  if (rank_ == 0) report_ready();  // resumed points first
  std::mutex mutex;  // the callbacks below make the only MPI calls made off the main thread, one at a time
  local_points().run(
      mine.size(), threads, [&](std::size_t j, int t) { return run_point(mine[j], t); }, {},
      [&](std::size_t done_here, std::size_t, const std::vector<Row>& rows) {
        std::lock_guard<std::mutex> lock(mutex);
        const std::size_t i = mine[done_here - 1];
        if (rank_ != 0) {
          std::uint64_t index = i;
          std::string message(reinterpret_cast<const char*>(&index), sizeof index);
          message += encode_rows(rows);
          check(MPI_Send(message.data(), static_cast<int>(message.size()), MPI_BYTE, 0, kRowsTag, comm_), "MPI_Send");
          return;
        }
        arrived(i, rows);
        // Take in what the other ranks finished meanwhile, so the journal keeps up with them.
        for (int flag = 1; flag;) {
          MPI_Status status;
          check(MPI_Iprobe(MPI_ANY_SOURCE, kRowsTag, comm_, &flag, &status), "MPI_Iprobe");
          if (flag) take_message(receive_any(comm_, status));
        }
      });
  if (rank_ == 0)
    while (missing > 0) {
      MPI_Status status;
      take_message(receive_any(comm_, status));
    }

  // Every rank returns the whole table (the report reads it on every rank).
  std::string all;
  if (rank_ == 0)
    for (const auto& rows : results) {
      const std::string text = encode_rows(rows);
      all += std::to_string(text.size()) + ":" + text;
    }
  broadcast(comm_, all);
  if (rank_ != 0) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t colon = all.find(':', at);
      if (colon == std::string::npos) throw Error("MPI: the table sent by rank 0 is cut short");
      const std::size_t length = std::stoull(all.substr(at, colon - at));
      results[i] = decode_rows(all.substr(colon + 1, length));
      at = colon + 1 + length;
    }
  }
  return results;
}

}  // namespace attnscale::lab
