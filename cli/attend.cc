// attnscale attend: attention over .npy files.
#include <memory>
#include <string>

#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "attnscale/npy.h"
#include "context_parallel.h"
#include "mask_options.h"
#include "mpi_job.h"
#include "nonfinite_inputs.h"
#include "output_files.h"
#include "subcommands.h"

namespace attnscale::cli {
namespace {

struct AttendFlags {
  std::string q, k, v, out, lse, probs;
  bool reference = false;
  bool allow_nonfinite = false;
  bool context_parallel = false;
  std::string sharding;
  MaskFlags mask;
};

// An output shaped like q's leading dimensions followed by `tail` (or nothing). A size that
// cannot be allocated is an Error naming `flag`, raised before any allocation is attempted.
Tensor like_q(const char* flag, const Tensor& q, DType dtype, int drop, std::int64_t tail) {
  std::int64_t shape[4];
  int rank = 0;
  for (int d = 0; d < q.rank() - drop; ++d) shape[rank++] = q.dim(d);
  if (tail > 0) shape[rank++] = tail;
  try {
    return Tensor(dtype, shape, rank);
  } catch (const Error& e) {
    throw Error(std::string(flag) + ": " + e.what());
  }
}

void run(const AttendFlags& f) {
  require_own_paths({{"--out", f.out}, {"--lse", f.lse}, {"--probs", f.probs}},
                    {{"--q", f.q}, {"--k", f.k}, {"--v", f.v}, {"--mask", f.mask.mask_path}});
  Tensor mask;
  const Options options = f.mask.options(mask);
  if (f.context_parallel) {
    if (f.reference) throw Error("--reference: not available with --context-parallel");
    if (!f.probs.empty()) throw Error("--probs: not available with --context-parallel");
    attend_context_parallel({f.q, f.k, f.v, f.out, f.lse, f.sharding, f.allow_nonfinite}, options);
    return;
  }
  if (!f.sharding.empty()) throw Error("--sharding: only with --context-parallel");
  if (mpi_job::rank() != 0) return;  // under mpirun without --context-parallel, rank 0 does the work
  const Tensor q = read_npy(f.q), k = read_npy(f.k), v = read_npy(f.v);
  if (!f.allow_nonfinite) {
    require_finite("--q", f.q, q, false);
    require_finite("--k", f.k, k, false);
    require_finite("--v", f.v, v, false);
    if (!mask.empty()) require_finite("--mask", f.mask.mask_path, mask, true);
  }
  for (auto [name, t] : {std::pair{"--q", &q}, {"--k", &k}, {"--v", &v}})
    if (t->rank() < 2)
      throw Error(std::string(name) + ": expected a 2-D [N,d], 3-D [H,N,d] or 4-D [B,H,N,d] array, got " +
                  t->view().shape_str());
  if (v.rank() != k.rank())
    throw Error("--v: rank " + std::to_string(v.rank()) + " differs from --k's rank " + std::to_string(k.rank()));
  const std::int64_t nkv = k.dim(k.rank() - 2), dv = v.dim(v.rank() - 1);
  Tensor out = like_q("--out", q, q.dtype(), 1, dv);
  Outputs outputs{out.view()};
  Tensor lse, probs;
  if (!f.lse.empty()) outputs.lse = (lse = like_q("--lse", q, q.dtype(), 1, 0)).view();
  if (!f.probs.empty()) outputs.probs = (probs = like_q("--probs", q, q.dtype(), 1, nkv)).view();
  if (q.dtype() == DType::u8) throw Error("--q: dtype must be float32 or float64, got bool/uint8");
  if (f.reference)
    reference::forward(q.view(), k.view(), v.view(), outputs, options);
  else
    forward(q.view(), k.view(), v.view(), outputs, options);
  OutputFiles files;
  files.write_npy(f.out, out.view());
  if (!f.lse.empty()) files.write_npy(f.lse, lse.view());
  if (!f.probs.empty()) files.write_npy(f.probs, probs.view());
  files.commit();
}

}  // namespace

void add_attend(CLI::App& app) {
  auto flags = std::make_shared<AttendFlags>();
  CLI::App* sub = app.add_subcommand(
      "attend",
      "Compute softmax(Q K^T * s + mask) V from .npy files.\n"
      "Arrays are [N,d], [H,N,d] or [B,H,N,d] (float32 or float64); K and V may have fewer heads than Q\n"
      "(grouped-query attention: query head h reads kv head h / (Hq/Hkv)).\n"
      "Example: attnscale attend --q q.npy --k k.npy --v v.npy --out o.npy --causal top-left");
  sub->add_option("--q", flags->q, "Queries .npy [..., Nq, dk]")->required()->type_name("FILE");
  sub->add_option("--k", flags->k, "Keys .npy [..., Nkv, dk]")->required()->type_name("FILE");
  sub->add_option("--v", flags->v, "Values .npy [..., Nkv, dv]")->required()->type_name("FILE");
  sub->add_option("--out", flags->out, "Output .npy [..., Nq, dv]")->required()->type_name("FILE");
  sub->add_option("--lse", flags->lse, "Also write log-sum-exp per query row [..., Nq]")->type_name("FILE");
  sub->add_option("--probs", flags->probs, "Also write the probability matrix [..., Nq, Nkv]")->type_name("FILE");
  flags->mask.add_to(*sub);
  sub->add_flag("--reference", flags->reference, "Use the naive float64 reference instead of the fast path");
  sub->add_flag("--allow-nonfinite", flags->allow_nonfinite,
                "Accept NaN/inf in --q/--k/--v and NaN/+inf in --mask (they stay in the rows they touch)");
  sub->add_flag("--context-parallel", flags->context_parallel,
                "Under mpirun: shard the sequence over the ranks (ring attention); each rank reads only its rows\n"
                "of the inputs and writes its rows of the outputs (docs/distributed.md)");
  sub->add_option("--sharding", flags->sharding,
                  "With --context-parallel: contiguous or zigzag rows per rank (default: zigzag when causal)")
      ->type_name("KIND");
  sub->callback([flags] { run(*flags); });
}

}  // namespace attnscale::cli
