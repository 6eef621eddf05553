// attnscale attend: attention over .npy files.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "attnscale/npy.h"
#include "attend_memory.h"
#include "context_parallel.h"
#include "input_files.h"
#include "library_names.h"
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
  // Score transforms, dropout and packed sequences (Options of attention.h).
  double softcap = 0.0;
  std::string alibi_slopes, sinks;  // .npy files
  double dropout = 0.0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  std::vector<std::int64_t> cu_seqlens_q, cu_seqlens_k;  // --cu-seqlens-q 0,3,7
};

// Adds the transform flags' values to `options`; `alibi`, `sinks` keep loaded arrays alive.
void add_transforms(const AttendFlags& f, Options& options, Tensor& alibi, Tensor& sinks) {
  options.softcap = f.softcap;
  if (!f.alibi_slopes.empty())
    options.alibi_slopes = (alibi = read_input("--alibi-slopes", f.alibi_slopes, InputDtypes::floats)).view();
  if (!f.sinks.empty()) options.sinks = (sinks = read_input("--sinks", f.sinks, InputDtypes::floats)).view();
  options.dropout = Dropout{f.dropout, f.dropout_seed, f.dropout_offset};
  options.cu_seqlens_q = f.cu_seqlens_q;  // each requires the other (CLI11's needs())
  options.cu_seqlens_k = f.cu_seqlens_k;
}

// An output of `shape` (from output_shapes()). A size that cannot be allocated is an Error naming
// `flag`, raised before any allocation is attempted.
Tensor allocate(const char* flag, DType dtype, const std::vector<std::int64_t>& shape) {
  try {
    return Tensor(dtype, shape.data(), static_cast<int>(shape.size()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", flag, e.what()));
  }
}

// Under mpirun every rank checks its flags and the ranks agree on the verdict (context_parallel.h),
// so that an error any rank sees stops every rank with one line.
void run_context_parallel(const AttendFlags& f) {
  const PathFlags outputs_given{{"--out", f.out}, {"--lse", f.lse}, {"--probs", f.probs}};
  Tensor mask, alibi, sinks;
  Options options;
  std::string error;
  try {
    require_own_paths(outputs_given, {{"--q", f.q}, {"--k", f.k}, {"--v", f.v}, {"--mask", f.mask.mask_path},
                                      {"--alibi-slopes", f.alibi_slopes}, {"--sinks", f.sinks}});
    if (f.reference) throw Error("--reference: not available with --context-parallel");
    if (!f.probs.empty()) throw Error("--probs: not available with --context-parallel");
    require_writable(outputs_given);
    options = f.mask.options(mask);
    add_transforms(f, options, alibi, sinks);
  } catch (const Error& e) {
    error = e.what();
  }
  attend_context_parallel({f.q, f.k, f.v, f.out, f.lse, f.sharding, f.allow_nonfinite, error}, options);
}

void run(const AttendFlags& f) {
  if (f.context_parallel) return run_context_parallel(f);
  const PathFlags outputs_given{{"--out", f.out}, {"--lse", f.lse}, {"--probs", f.probs}};
  require_own_paths(outputs_given, {{"--q", f.q}, {"--k", f.k}, {"--v", f.v}, {"--mask", f.mask.mask_path},
                                    {"--alibi-slopes", f.alibi_slopes}, {"--sinks", f.sinks}});
  require_writable(outputs_given);
  AttendCall call{f.q, f.k, f.v, f.mask.mask_path, f.alibi_slopes, f.sinks, f.lse, f.probs};
  call.reference = f.reference;
  call.threads = f.mask.threads;
  call.window = !f.mask.window.empty() && (f.mask.window[0] >= 0 || f.mask.window[1] >= 0);
  call.dropout = f.dropout > 0;
  call.cu_seqlens_q = f.cu_seqlens_q;
  call.cu_seqlens_k = f.cu_seqlens_k;
  check_attend_memory(call);  // from the headers, before any read
  Tensor mask, alibi, sinks;
  Options options = f.mask.options(mask);
  add_transforms(f, options, alibi, sinks);
  if (!f.sharding.empty()) throw Error("--sharding: only with --context-parallel");
  if (mpi_job::rank() != 0) return;  // under mpirun without --context-parallel, rank 0 does the work
  const Tensor q = read_input("--q", f.q, InputDtypes::floats), k = read_input("--k", f.k, InputDtypes::floats),
               v = read_input("--v", f.v, InputDtypes::floats);
  if (!f.allow_nonfinite) {
    require_finite("--q", f.q, q, false);
    require_finite("--k", f.k, k, false);
    require_finite("--v", f.v, v, false);
    if (!mask.empty()) require_finite("--mask", f.mask.mask_path, mask, true);
  }
  const OutputShapes shapes = output_shapes(q.view(), k.view(), v.view(), {"--q", "--k", "--v"});
  if (v.rank() != k.rank())
    throw Error(fmt::format("--v: rank {} differs from --k's rank {}", v.rank(), k.rank()));
  Tensor out = allocate("--out", q.dtype(), shapes.out);
  Outputs outputs{out.view()};
  Tensor lse, probs;
  if (!f.lse.empty()) outputs.lse = (lse = allocate("--lse", q.dtype(), shapes.lse)).view();
  if (!f.probs.empty()) outputs.probs = (probs = allocate("--probs", q.dtype(), shapes.probs)).view();
  naming_flags([&] {
    if (f.reference)
      reference::forward(q.view(), k.view(), v.view(), outputs, options);
    else
      forward(q.view(), k.view(), v.view(), outputs, options);
  });
  if (!f.allow_nonfinite) require_finite_result("--out", out);
  OutputFiles files;
  files.add_npy("--out", f.out, out.view());
  if (!f.lse.empty()) files.add_npy("--lse", f.lse, lse.view());
  if (!f.probs.empty()) files.add_npy("--probs", f.probs, probs.view());
  files.place();
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
  sub->add_option("--probs", flags->probs,
                  "Also write the probability matrix [..., Nq, Nkv] (with --dropout: P before dropout, a dropped\n"
                  "entry as -P_ij; the output is the kept entries / (1 - p) times V)")
      ->type_name("FILE");
  flags->mask.add_to(*sub);
  sub->add_flag("--reference", flags->reference, "Use the naive float64 reference instead of the fast path");
  sub->add_flag("--allow-nonfinite", flags->allow_nonfinite,
                "Accept NaN/inf in --q/--k/--v and NaN/+inf in --mask (they stay in the rows they touch)");
  sub->add_flag("--context-parallel", flags->context_parallel,
                "Under mpirun: shard the sequence over the ranks (ring attention); each rank reads only its rows\n"
                "of the inputs and writes its rows of the outputs (distributed.md: docs/ in the source,\n"
                "share/doc/attnscale/ installed)");
  sub->add_option("--sharding", flags->sharding,
                  "With --context-parallel: contiguous or zigzag rows per rank (default: zigzag when causal)")
      ->type_name("KIND");
  sub->add_option("--softcap", flags->softcap, "Cap each scaled score x at c*tanh(x/c) (Gemma 2; default 0: off)")
      ->type_name("C")
      ->check(finite_number());
  sub->add_option("--alibi-slopes", flags->alibi_slopes,
                  "ALiBi slopes .npy [Hq] or [B, Hq]: -slope*|diag(i) - j| added to score (i, j)")
      ->type_name("FILE");
  sub->add_option("--sinks", flags->sinks, "Attention sinks .npy [Hq]: one logit per head in every row's softmax")
      ->type_name("FILE");
  sub->add_option("--dropout", flags->dropout, "Dropout probability on P, kept values scaled by 1/(1-p) (default 0)")
      ->type_name("P")
      ->check(finite_number());
  sub->add_option("--dropout-seed", flags->dropout_seed, "Seed of the dropout mask, 0 to 2^64-1 (default 0)")
      ->type_name("N")
      ->check(seed_range());
  sub->add_option("--dropout-offset", flags->dropout_offset, "Offset of the dropout mask, 0 to 2^64-1 (default 0)")
      ->type_name("N")
      ->check(seed_range());
  CLI::Option* cu_q = sub->add_option("--cu-seqlens-q", flags->cu_seqlens_q,
                                      "Packed sequences: query offsets 0,...,total_q; q is [Hq, total_q, dk]\n"
                                      "(with --cu-seqlens-k)")
                           ->delimiter(',')
                           ->option_text("LIST");  // not CLI11's "LIST ... Needs: --cu-seqlens-k"
  CLI::Option* cu_k = sub->add_option("--cu-seqlens-k", flags->cu_seqlens_k,
                                      "Packed sequences: key offsets 0,...,total_k; k and v are [Hkv, total_k, d]\n"
                                      "(with --cu-seqlens-q)")
                           ->delimiter(',')
                           ->option_text("LIST");
  cu_q->needs(cu_k);
  cu_k->needs(cu_q);
  sub->callback([flags] { run(*flags); });
}

}  // namespace attnscale::cli
