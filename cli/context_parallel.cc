#include "context_parallel.h"

#include <fmt/format.h>

#include "attnscale/error.h"

#ifdef ATTNSCALE_HAVE_MPI
#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

#include "attend_memory.h"
#include "attnscale/distributed.h"
#include "distributed/agreement.h"
#include "distributed/same_values.h"
#include "io/npy_header.h"
#include "io/output_file.h"
#include "input_files.h"
#include "library_names.h"
#include "mpi_job.h"
#include "nonfinite_inputs.h"
#include "output_files.h"
#endif

namespace attnscale::cli {

#ifndef ATTNSCALE_HAVE_MPI
void attend_context_parallel(const ContextParallelFiles& f, const Options&) {
  if (!f.flags_error.empty()) throw Error(f.flags_error);
  throw Error("--context-parallel: this build has no MPI (install libopenmpi-dev and rebuild)");
}
#else
namespace {

using distributed::Segment;

std::string system_error() { return std::strerror(errno); }

// A read-only memory map of a whole file, closed on destruction.
class MappedFile {
 public:
  MappedFile(const std::string& flag, const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY);
    if (fd_ < 0) throw Error(fmt::format("{}: {}: cannot open file ({})", flag, path, system_error()));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) throw Error(fmt::format("{}: {}: not a regular file", flag, path));
    size_ = st.st_size;
    if (size_ > 0) {
      data_ = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_PRIVATE, fd_, 0);
      if (data_ == MAP_FAILED) throw Error(fmt::format("{}: {}: cannot map file ({})", flag, path, system_error()));
    }
  }
  ~MappedFile() {
    if (data_ != nullptr && data_ != MAP_FAILED) ::munmap(data_, static_cast<std::size_t>(size_));
    if (fd_ >= 0) ::close(fd_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return static_cast<const char*>(data_); }
  std::int64_t size() const { return size_; }

 private:
  int fd_ = -1;
  void* data_ = nullptr;
  std::int64_t size_ = 0;
};

// One input: its header (global shape) and this rank's rows.
struct ShardedInput {
  detail::NpyHeader header;
  Tensor rows;
  int rank() const { return static_cast<int>(header.shape.size()); }
  std::int64_t n() const { return header.shape[header.shape.size() - 2]; }
};

detail::NpyHeader read_header(const std::string& flag, const std::string& path, const MappedFile& f) {
  const std::string_view bytes(f.data() ? f.data() : "", static_cast<std::size_t>(f.size()));
  // The parser names the file; the flag goes in front, as read_input() puts it (input_files.h).
  detail::NpyHeader h = naming_input_errors(flag, path, InputDtypes::floats, [&] {
    const detail::NpyPreamble pre = detail::parse_npy_preamble(
        path, bytes.substr(0, std::min<std::int64_t>(f.size(), detail::kNpyPreambleBytes)), f.size());
    return detail::parse_npy_header(path, bytes.substr(pre.header_offset, pre.header_len), pre, f.size());
  });
  if (h.shape.size() < 2 || h.shape.size() > 4)
    throw Error(fmt::format("{}: expected a 2-D [N,d], 3-D [H,N,d] or 4-D [B,H,N,d] array, got {}-D", flag, h.shape.size()));
  require_accepted(flag, path, h.dtype, InputDtypes::floats);
  return h;
}

// The rows `segs` of dimension rank−2, copied out of the mapping (the other rows are never read).
Tensor copy_rows(const detail::NpyHeader& h, const char* data, const std::vector<Segment>& segs) {
  const int rank = static_cast<int>(h.shape.size());
  std::int64_t n = 0, outer = 1;
  for (const auto& s : segs) n += s.length;
  for (int d = 0; d + 2 < rank; ++d) outer *= h.shape[d];
  const std::int64_t N = h.shape[rank - 2], inner = h.shape[rank - 1];
  std::int64_t shape[4];
  for (int d = 0; d < rank; ++d) shape[d] = h.shape[d];
  shape[rank - 2] = n;
  Tensor t(h.dtype, shape, rank);
  const std::size_t es = dtype_size(h.dtype);
  const char* src = data + h.data_offset;
  char* dst = static_cast<char*>(t.data());
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t at = 0;
    for (const auto& s : segs) {
      std::memcpy(dst + (o * n + at) * inner * es, src + (o * N + s.begin) * inner * es, s.length * inner * es);
      at += s.length;
    }
  }
  return t;
}

// Rank r's share of K ranks of q, k and v (attend_memory.h), from their shapes: its rows, its
// longest run of them, and the most rows of k and v, and longest run, any rank holds (the ring's
// buffers, a block's keys).
ContextParallelShare rank_share(const ShardedInput& q, const ShardedInput& k, const ShardedInput& v, bool lse,
                                int threads, int K, int r, distributed::Sharding sharding) {
  ContextParallelShare s{&q.header, &k.header, &v.header, lse, threads};
  const auto rows = [&](std::int64_t n, int rank, std::int64_t* longest) {
    std::int64_t total = 0;
    for (const Segment& seg : distributed::shard(n, K, rank, sharding)) {
      total += seg.length;
      *longest = std::max(*longest, seg.length);
    }
    return total;
  };
  s.q_rows = rows(q.n(), r, &s.q_segment);
  for (int rank = 0; rank < K; ++rank) {
    const std::int64_t n = rows(k.n(), rank, &s.kv_segment);
    if (rank == r) s.kv_rows = n;
    s.max_kv_rows = std::max(s.max_kv_rows, n);
  }
  return s;
}

const char* sharding_name(distributed::Sharding s) {
  return s == distributed::Sharding::zigzag ? "zigzag" : "contiguous";
}

// "(2, 3, 12, 8) float32": an input's shape and dtype as a message shows them.
std::string shape_text(const detail::NpyHeader& h) {
  std::string s;
  for (auto d : h.shape) s += (s.empty() ? "(" : ", ") + std::to_string(d);
  return s + ") " + std::string(dtype_name(h.dtype));
}

distributed::Sharding pick_sharding(const std::string& name, const Options& options) {
  if (name == "contiguous") return distributed::Sharding::contiguous;
  if (name == "zigzag") return distributed::Sharding::zigzag;
  if (!name.empty()) throw Error(fmt::format("--sharding: expected contiguous or zigzag, got '{}'", name));
  return options.mask.causal ? distributed::Sharding::zigzag : distributed::Sharding::contiguous;
}

// One shared output .npy: rank 0 creates it (temporary name) at its full size; every rank writes its
// rows at their offsets; rank 0 renames it into place in commit(). Removed if not committed.
class SharedOutput {
 public:
  SharedOutput(MPI_Comm comm, std::string flag, std::string path, DType dtype, std::vector<std::int64_t> shape)
      : comm_(comm), flag_(std::move(flag)), path_(std::move(path)), dtype_(dtype), shape_(std::move(shape)) {
    MPI_Comm_rank(comm_, &rank_);
    // The temporary's name comes from rank 0, so every rank opens the same file. It lies beside
    // the file the path names (a symbolic link is followed, and stays); a FIFO or device cannot
    // take rows written at their offsets by several ranks.
    char name[4096] = {}, target[4096] = {};
    distributed::agreed(comm_, [&] {
      if (rank_ != 0) return;
      const detail::OutputTarget t = detail::output_target(path_);
      if (t.in_place)
        throw Error(fmt::format("{}: {}: not a regular file; --context-parallel writes each rank's rows in place",
                                flag_, path_));
      existed_ = t.exists;
      // Absolute: another rank may run in another folder and name the file otherwise.
      const std::string where = canonical_path(t.path);
      std::snprintf(target, sizeof target, "%s", where.c_str());
      std::snprintf(name, sizeof name, "%s.tmp.%d", where.c_str(), static_cast<int>(::getpid()));
    });
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm_);
    MPI_Bcast(target, sizeof target, MPI_CHAR, 0, comm_);
    tmp_ = name;
    target_ = target;
    header_ = detail::npy_header_bytes(dtype_, shape_.data(), static_cast<int>(shape_.size()));
    distributed::agreed(comm_, [&] {
      if (rank_ != 0) return;
      std::int64_t bytes = static_cast<std::int64_t>(header_.size()), numel = 1;
      for (auto s : shape_) numel *= s;
      bytes += numel * static_cast<std::int64_t>(dtype_size(dtype_));
      const int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) throw Error(fmt::format("{}: cannot write '{}' ({})", flag_, path_, system_error()));
      created_ = true;
      const bool ok = ::pwrite(fd, header_.data(), header_.size(), 0) == static_cast<ssize_t>(header_.size()) &&
                      ::ftruncate(fd, bytes) == 0;
      ::close(fd);
      if (!ok) throw Error(fmt::format("{}: cannot write '{}' ({})", flag_, path_, system_error()));
    });
  }
  ~SharedOutput() {
    if (created_ && !committed_) std::remove(tmp_.c_str());
  }

  // Every rank writes its rows (segments of dimension row_dim) of the C-order array.
  void write_rows(const Tensor& local, const std::vector<Segment>& segs, int row_dim) {
    distributed::agreed(comm_, [&] {
      const int rank = static_cast<int>(shape_.size());
      std::int64_t outer = 1, inner = 1;
      for (int d = 0; d < row_dim; ++d) outer *= shape_[d];
      for (int d = row_dim + 1; d < rank; ++d) inner *= shape_[d];
      const std::int64_t N = shape_[row_dim], n = local.dim(row_dim);
      const std::size_t es = dtype_size(dtype_);
      const int fd = ::open(tmp_.c_str(), O_WRONLY);
      if (fd < 0) throw Error(fmt::format("{}: cannot open '{}' to write this rank's rows ({})", flag_, tmp_, system_error()));
      const char* src = static_cast<const char*>(local.data());
      bool ok = true;
      for (std::int64_t o = 0; o < outer && ok; ++o) {
        std::int64_t at = 0;
        for (const auto& s : segs) {
          const std::size_t bytes = static_cast<std::size_t>(s.length * inner) * es;
          const off_t where = static_cast<off_t>(header_.size() + (o * N + s.begin) * inner * es);
          ok = ok && ::pwrite(fd, src + (o * n + at) * inner * es, bytes, where) == static_cast<ssize_t>(bytes);
          at += s.length;
        }
      }
      ok = ::close(fd) == 0 && ok;
      if (!ok) throw Error(fmt::format("{}: cannot write this rank's rows of '{}' ({})", flag_, path_, system_error()));
    });
  }

  void commit() {
    distributed::agreed(comm_, [&] {
      if (rank_ == 0 && std::rename(tmp_.c_str(), target_.c_str()) != 0)
        throw Error(fmt::format("{}: cannot rename into '{}' ({})", flag_, path_, system_error()));
    });
    committed_ = true;
  }
  // Removes the committed output if it is a new file (an existing one is already replaced).
  void remove_placed() {
    if (committed_ && rank_ == 0 && !existed_) std::remove(target_.c_str());
  }

 private:
  MPI_Comm comm_;
  std::string flag_, path_, target_, tmp_, header_;
  DType dtype_;
  std::vector<std::int64_t> shape_;
  int rank_ = 0;
  bool created_ = false, committed_ = false, existed_ = false;
};

}  // namespace

void attend_context_parallel(const ContextParallelFiles& f, const Options& options) {
  if (!mpi_job::active()) {
    if (!f.flags_error.empty()) throw Error(f.flags_error);
    throw Error("--context-parallel: start the ranks with mpirun (mpirun -np K attnscale attend ...)");
  }
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int K = mpi_job::size(), r = mpi_job::rank();
  // First the flags: every collective below depends on them (an --lse on one rank only would have
  // it wait for a file the others never create), and --out and --lse each name one shared file.
  distributed::Sharding sharding = distributed::Sharding::contiguous;
  std::string error = f.flags_error;
  try {
    if (error.empty()) {
      distributed::check_ring_options(options);  // --mask, --alibi-slopes, ...: named by the flags below
      sharding = pick_sharding(f.sharding, options);
    }
  } catch (const Error& e) {
    error = with_flag_names(e.what());
  }
  // Paths are compared as the files they name: x.npy on one rank and ./x.npy on another agree.
  distributed::agree_on_values(comm, "the arguments",
                               {{"--out", canonical_path(f.out), shown_path(f.out)},
                                {"--lse", canonical_path(f.lse), shown_path(f.lse)},
                                {"--sharding", sharding_name(sharding)}},
                               error);

  // Then the inputs' shapes, each rank's file named (every rank reads its rows of the same arrays).
  ShardedInput q, k, v;
  std::vector<std::unique_ptr<MappedFile>> files;
  const std::tuple<const char*, const std::string*, ShardedInput*> inputs[] = {
      {"--q", &f.q, &q}, {"--k", &f.k, &k}, {"--v", &f.v, &v}};
  distributed::agreed(comm, [&] {
    for (auto [flag, path, in] : inputs) {
      files.push_back(std::make_unique<MappedFile>(flag, *path));
      in->header = read_header(flag, *path, *files.back());
    }
  });
  std::vector<distributed::NamedValue> shapes;
  for (auto [flag, path, in] : inputs)
    shapes.push_back({flag, shape_text(in->header),
                      fmt::format("{} ({} rows, shape {})", *path, in->n(), shape_text(in->header))});
  distributed::agree_on_values(comm, "the inputs", shapes, "", "every rank reads its rows of the same arrays");

  // Then what this rank will hold, before any row is copied (attend_memory.h): its own share, then
  // the shares of the ranks on this machine, which share its memory.
  HeldSum share;
  distributed::agreed(comm, [&] {
    for (auto [flag, path, in] : inputs) {
      const std::int64_t n = in->n(), least = (sharding == distributed::Sharding::zigzag ? 2 : 1) * K;
      if (n < least)
        throw Error(fmt::format("{}: {} row{} cannot be split over {} ranks ({} per rank at least)", flag, n,
                                n == 1 ? "" : "s", K,
                                sharding == distributed::Sharding::zigzag ? "zigzag: 2 chunks" : "1 row"));
    }
    share = check_context_parallel_share(rank_share(q, k, v, !f.lse.empty(), options.threads, K, r, sharding));
  });
  MPI_Comm machine;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &machine);
  int local_ranks = 1;
  double local_bytes = 0;
  MPI_Comm_size(machine, &local_ranks);
  MPI_Allreduce(&share.bytes, &local_bytes, 1, MPI_DOUBLE, MPI_SUM, machine);
  MPI_Comm_free(&machine);
  distributed::agreed(comm, [&] { check_machine_share(share, local_ranks, local_bytes); });

  distributed::agreed(comm, [&] {
    for (std::size_t i = 0; i < files.size(); ++i) {
      auto [flag, path, in] = inputs[i];
      in->rows = copy_rows(in->header, files[i]->data(), distributed::shard(in->n(), K, r, sharding));
    }
    files.clear();
    if (v.rank() != k.rank())
      throw Error(fmt::format("--v: rank {} differs from --k's rank {}", v.rank(), k.rank()));
    if (!f.allow_nonfinite) {
      require_finite("--q", f.q, q.rows, false);
      require_finite("--k", f.k, k.rows, false);
      require_finite("--v", f.v, v.rows, false);
    }
  });
  const auto q_rows = distributed::shard(q.n(), K, r, sharding);
  // Outputs: q's shape with dv last (out) or without its last dimension (lse).
  std::vector<std::int64_t> out_shape = q.header.shape, lse_shape = q.header.shape;
  out_shape.back() = v.header.shape.back();
  lse_shape.pop_back();
  std::vector<std::int64_t> local_out = out_shape, local_lse = lse_shape;
  local_out[local_out.size() - 2] = q.rows.dim(q.rows.rank() - 2);
  local_lse.back() = q.rows.dim(q.rows.rank() - 2);
  Tensor out(q.rows.dtype(), local_out.data(), static_cast<int>(local_out.size()));
  Tensor lse;
  Outputs outputs{out.view()};
  if (!f.lse.empty()) outputs.lse = (lse = Tensor(q.rows.dtype(), local_lse.data(), static_cast<int>(local_lse.size()))).view();
  distributed::ring_forward(q.rows.view(), k.rows.view(), v.rows.view(), outputs, options, comm, sharding);

  SharedOutput o(comm, "--out", f.out, q.rows.dtype(), out_shape);
  o.write_rows(out, q_rows, static_cast<int>(out_shape.size()) - 2);
  std::unique_ptr<SharedOutput> l;
  if (!f.lse.empty()) {
    l = std::make_unique<SharedOutput>(comm, "--lse", f.lse, q.rows.dtype(), lse_shape);
    l->write_rows(lse, q_rows, static_cast<int>(lse_shape.size()) - 1);
  }
  o.commit();
  try {
    if (l) l->commit();
  } catch (const Error&) {
    o.remove_placed();  // both outputs or neither
    throw;
  }
}
#endif

}  // namespace attnscale::cli
