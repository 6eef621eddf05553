#include "lab/mpi_points.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "attnscale/error.h"
#include "common/parallel.h"
#include "distributed/same_values.h"
#include "lab/row_codec.h"

namespace attnscale::lab {
namespace {

// A worker's request: 8 bytes, the point it finished (kNone at its first request), then its rows.
constexpr int kAskTag = 7101;
// Rank 0's answer: the point to run next (kNone: none left, the worker stops) and whether it is
// the last point of the sweep (it then gets all of its rank's threads).
constexpr int kDealTag = 7102;
constexpr std::uint64_t kNone = ~std::uint64_t{0};

void check(int code, const char* what) {
  if (code != MPI_SUCCESS) throw Error(std::string("MPI: ") + what + " failed");
}

// Open MPI's blocking calls poll the transport in a busy loop; a rank waiting for a point or for
// the final table would take a core from a rank still computing (the job often has no more
// cores than ranks). So every wait here polls with MPI_Test and sleeps in between, 50 µs doubling
// to 2 ms: at most a couple of milliseconds late, next to points that take far longer.
class Pause {
 public:
  void operator()() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(2000));
  }
  void reset() { pause_ = std::chrono::microseconds(50); }

 private:
  std::chrono::microseconds pause_{50};
};

void wait_quietly(MPI_Request& request) {
  Pause pause;
  for (int done = 0;;) {
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    pause();
  }
}

std::string receive(MPI_Comm comm, const MPI_Status& status) {
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  std::string message(static_cast<std::size_t>(bytes), '\0');
  check(MPI_Recv(message.data(), bytes, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, comm, MPI_STATUS_IGNORE),
        "MPI_Recv");
  return message;
}

// Sends `text` from rank 0 to every rank of comm (length first), waiting quietly.
void broadcast(MPI_Comm comm, std::string& text) {
  std::uint64_t length = text.size();
  MPI_Request request;
  check(MPI_Ibcast(&length, 1, MPI_UINT64_T, 0, comm, &request), "MPI_Ibcast");
  wait_quietly(request);
  text.resize(length);
  // In pieces below 2^31 bytes (MPI counts are int).
  for (std::uint64_t at = 0; at < length; at += std::uint64_t{1} << 30) {
    const int piece = static_cast<int>(std::min<std::uint64_t>(length - at, std::uint64_t{1} << 30));
    check(MPI_Ibcast(text.data() + at, piece, MPI_BYTE, 0, comm, &request), "MPI_Ibcast");
    wait_quietly(request);
  }
}

// Rank 0's list of the points still to run, handed out in order.
class Dealer {
 public:
  struct Deal {
    std::size_t point;
    bool last;
  };
  explicit Dealer(std::vector<std::size_t> todo) : todo_(std::move(todo)) {}
  std::optional<Deal> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (next_ >= todo_.size()) return std::nullopt;
    const std::size_t i = next_++;
    return Deal{todo_[i], i + 1 == todo_.size()};
  }
  void close() {  // after an error: no more points for anyone
    std::lock_guard<std::mutex> lock(mutex_);
    next_ = todo_.size();
  }

 private:
  std::mutex mutex_;
  std::vector<std::size_t> todo_;
  std::size_t next_ = 0;
};

// Runs `workers` loops on this process's threads (as local_points() runs points in parallel); the
// first error stops every loop at its next request and is rethrown.
template <class Loop>
void run_workers(int workers, std::atomic<bool>& failed, Loop&& loop) {
  parallel_for(workers, 1, workers, [&](std::int64_t, std::int64_t, int) {
    try {
      loop();
    } catch (...) {
      failed = true;
      throw;
    }
  });
}

}  // namespace

MpiPoints::MpiPoints(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

void MpiPoints::agree(const SweepDefinition& sweep, const std::string& error) const {
  std::vector<distributed::NamedValue> values;
  for (const auto& [name, value] : sweep) values.push_back({name, value});
  distributed::agree_on_values(comm_, "the sweep", values, error);
}

std::vector<std::vector<Row>> MpiPoints::run(std::size_t n, int threads, const RunPoint& run_point,
                                             const CompletedPoints& completed, const Progress& progress) const {
  // Every rank built the same sweep from the same flags (agree(), called by run_experiment); a rank
  // that did not would wait forever for points that never come, so it is an Error on every rank.
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
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < n; ++i)
    if (!done[i]) todo.push_back(i);
  // As local_points(): a worker per thread, each point with threads / workers of them (the last
  // point of the sweep with all of them: the other workers of its rank are done or finishing).
  const int workers = std::max(1, static_cast<int>(std::min<std::size_t>(threads, std::max<std::size_t>(todo.size(), 1))));
  const int inner = std::max(1, threads / workers);
  std::vector<int> workers_of(static_cast<std::size_t>(size_));
  check(MPI_Allgather(&workers, 1, MPI_INT, workers_of.data(), 1, MPI_INT, comm_), "MPI_Allgather");
  std::atomic<bool> failed{false};

  std::vector<std::vector<Row>> results(n);
  if (rank_ != 0) {
    // A worker asks rank 0 for a point (handing in the one it finished) until none is left. One
    // request of this rank is in flight at a time, so each answer is for the worker that waits.
    std::mutex mpi;
    run_workers(workers, failed, [&] {
      std::uint64_t finished = kNone;
      std::vector<Row> rows;
      while (!failed) {
        std::string ask(reinterpret_cast<const char*>(&finished), sizeof finished);
        if (finished != kNone) ask += encode_rows(rows);
        std::uint64_t deal[2];
        {
          std::lock_guard<std::mutex> lock(mpi);
          MPI_Request request[2];
          check(MPI_Irecv(deal, 2, MPI_UINT64_T, 0, kDealTag, comm_, &request[0]), "MPI_Irecv");
          check(MPI_Isend(ask.data(), static_cast<int>(ask.size()), MPI_BYTE, 0, kAskTag, comm_, &request[1]),
                "MPI_Isend");
          wait_quietly(request[1]);
          wait_quietly(request[0]);
        }
        if (deal[0] == kNone || failed) return;  // after an error here: the point is left undone
        if (deal[0] >= n) throw Error("MPI: rank 0 dealt point " + std::to_string(deal[0]) + " of a sweep of " + std::to_string(n));
        finished = deal[0];
        rows = run_point(finished, deal[1] ? threads : inner);
      }
    });
  } else {
    std::vector<char> have(n, 0);
    std::size_t next = 0;  // points [0, next) have been reported, in order
    std::mutex mutex;      // results, have, next, and the progress callback
    auto arrived = [&](std::size_t i, std::vector<Row> rows) {
      std::lock_guard<std::mutex> lock(mutex);
      if (have[i]) throw Error("MPI: the rows of point " + std::to_string(i) + " arrived twice");
      results[i] = std::move(rows);
      have[i] = 1;
      while (next < n && have[next]) {
        if (progress) progress(next + 1, n, results[next]);
        ++next;
      }
    };
    for (const auto& [i, rows] : completed) arrived(i, rows);  // resumed points first

    // Rank 0's own workers run on this thread (as local_points() runs them); a thread of its own
    // answers the other ranks, and is the only one to call MPI until it is joined.
    Dealer dealer(todo);
    std::exception_ptr server_error;
    std::thread server([&] {
      try {
        int open = 0;  // workers on other ranks not yet told that no point is left
        for (int r = 1; r < size_; ++r) open += workers_of[static_cast<std::size_t>(r)];
        Pause pause;
        while (open > 0 && !failed) {
          int flag = 0;
          MPI_Status status;
          check(MPI_Iprobe(MPI_ANY_SOURCE, kAskTag, comm_, &flag, &status), "MPI_Iprobe");
          if (!flag) {
            pause();
            continue;
          }
          pause.reset();
          const std::string ask = receive(comm_, status);
          const std::string from = "MPI: rank " + std::to_string(status.MPI_SOURCE);
          std::uint64_t finished = kNone;
          if (ask.size() < sizeof finished) throw Error(from + " sent a request cut short");
          std::memcpy(&finished, ask.data(), sizeof finished);
          if (finished != kNone) {
            if (finished >= n)
              throw Error(from + " sent rows of point " + std::to_string(finished) + " of a sweep of " + std::to_string(n));
            arrived(finished, decode_rows(ask.substr(sizeof finished)));
          }
          const auto deal = dealer.take();
          const std::uint64_t answer[2] = {deal ? deal->point : kNone, deal && deal->last ? 1u : 0u};
          check(MPI_Send(answer, 2, MPI_UINT64_T, status.MPI_SOURCE, kDealTag, comm_), "MPI_Send");
          if (!deal) --open;
        }
      } catch (...) {
        server_error = std::current_exception();
        failed = true;
        dealer.close();
      }
    });
    try {
      run_workers(workers, failed, [&] {
        while (!failed)
          if (const auto deal = dealer.take()) arrived(deal->point, run_point(deal->point, deal->last ? threads : inner));
          else return;
      });
    } catch (...) {
      server.join();  // it stops at its next poll (`failed` is set)
      throw;
    }
    server.join();
    if (server_error) std::rethrow_exception(server_error);
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
