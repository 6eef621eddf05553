#include "lab/experiments/training/attention_function.h"

#include "attnscale/attention.h"
#include "attnscale/error.h"

namespace attnscale::lab::training {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A rank-3 or rank-4 torch tensor as an attnscale view of the same memory (strides in elements).
TensorView view_of(const torch::Tensor& t) {
  DType dtype;
  if (t.scalar_type() == torch::kFloat) dtype = DType::f32;
  else if (t.scalar_type() == torch::kDouble) dtype = DType::f64;
  else throw Error("attention: expected float32 or float64 tensors, got " + std::string(c10::toString(t.scalar_type())));
  TensorView view;
  view.data = t.data_ptr();
  view.dtype = dtype;
  view.rank = static_cast<int>(t.dim());
  if (view.rank < 1 || view.rank > kMaxRank) throw Error("attention: tensors of rank 1 to 4 only");
  for (int i = 0; i < view.rank; ++i) {
    view.shape[i] = t.size(i);
    view.strides[i] = t.stride(i);
  }
  return view;
}

Options kernel_options(double scale, bool causal, int threads) {
  Options opt;
  opt.scale = Scale::value(scale);
  opt.mask.causal = causal;
  opt.threads = threads;
  return opt;
}

void record(AttentionProbe* probe, const torch::Tensor& lse, const torch::Tensor& probs) {
  torch::NoGradGuard no_grad;
  probe->max_logit = (lse.to(torch::kDouble) + probs.amax(-1).to(torch::kDouble).log()).max().item<double>();
  probe->entropy = -torch::special::xlogy(probs, probs).to(torch::kDouble).sum(-1).mean().item<double>();
}

bool probing(const AttentionProbe* probe) { return probe != nullptr && probe->active; }

torch::Tensor causal_keep(std::int64_t n, std::int64_t nkv, const torch::Device& device) {
  return torch::ones({n, nkv}, torch::TensorOptions().dtype(torch::kBool).device(device)).tril();
}

struct AttnscaleFunction : torch::autograd::Function<AttnscaleFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double scale, bool causal, int64_t threads,
                               AttentionProbe* probe) {
    const auto b = q.size(0), h = q.size(1), n = q.size(2), nkv = k.size(2), dv = v.size(3);
    // out is allocated [B, N, H, dv] and handed out as its [B, H, N, dv] view, so the caller's
    // merge of the heads, out.transpose(1, 2).reshape(B, N, H·dv), costs no copy.
    const torch::Tensor out = torch::empty({b, n, h, dv}, q.options()).permute({0, 2, 1, 3});
    const torch::Tensor lse = torch::empty({b, h, n}, q.options());
    Outputs outputs{view_of(out), view_of(lse), {}};
    torch::Tensor probs;
    if (probing(probe)) {
      probs = torch::empty({b, h, n, nkv}, q.options());
      outputs.probs = view_of(probs);
    }
    attnscale::forward(view_of(q), view_of(k), view_of(v), outputs, kernel_options(scale, causal, static_cast<int>(threads)));
    if (probs.defined()) record(probe, lse, probs);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["threads"] = threads;
    return out;
  }

  // dq, dk, dv from attnscale::backward, which recomputes P from q, k and the saved lse.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const torch::Tensor& dout = grad_outputs[0];
    torch::Tensor dq = torch::empty(q.sizes(), q.options()), dk = torch::empty(k.sizes(), k.options()),
                  dv = torch::empty(v.sizes(), v.options());
    if (!dout.defined()) return {dq.zero_(), dk.zero_(), dv.zero_(), {}, {}, {}, {}};
    attnscale::backward(view_of(q), view_of(k), view_of(v), view_of(out), view_of(lse), view_of(dout),
                        Gradients{view_of(dq), view_of(dk), view_of(dv)},
                        kernel_options(ctx->saved_data["scale"].toDouble(), ctx->saved_data["causal"].toBool(),
                                       static_cast<int>(ctx->saved_data["threads"].toInt())));
    return {dq, dk, dv, {}, {}, {}, {}};
  }
};

}  // namespace

torch::Tensor attnscale_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  double scale, bool causal, int threads, AttentionProbe* probe) {
  return AttnscaleFunction::apply(q, k, v, scale, causal, static_cast<int64_t>(threads), probe);
}

torch::Tensor softmax_attention(const torch::Tensor& scores, const torch::Tensor& v, bool causal,
                                AttentionProbe* probe) {
  torch::Tensor s = scores;
  if (causal)
    s = s.masked_fill(causal_keep(s.size(-2), s.size(-1), s.device()).logical_not(),
                      -std::numeric_limits<double>::infinity());
  const torch::Tensor probs = torch::softmax(s, -1);
  if (probing(probe)) record(probe, torch::logsumexp(s, -1), probs);
  return torch::matmul(probs, v);
}

torch::Tensor torch_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double scale, bool causal, AttentionProbe* probe) {
  return softmax_attention(torch::matmul(q, k.transpose(-2, -1)) * scale, v, causal, probe);
}

}  // namespace attnscale::lab::training
