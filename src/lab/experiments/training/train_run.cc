#include "lab/experiments/training/train_run.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "attnscale/error.h"
#include "lab/experiments/training/model.h"
#include "lab/experiments/training/tasks.h"

namespace attnscale::lab::training {
namespace {

struct Evaluation {
  double loss = 0, accuracy = 0;
};

// Cross-entropy over the positions with a target (mqar: the recalled values only), and the
// fraction of them whose argmax is the target.
Evaluation evaluate(Decoder& model, const std::vector<Batch>& batches) {
  torch::NoGradGuard no_grad;
  double loss = 0, correct = 0, count = 0;
  for (const auto& b : batches) {
    const torch::Tensor logits = model->forward(b.inputs).flatten(0, 1);
    const torch::Tensor targets = b.targets.flatten();
    const torch::Tensor keep = targets.ge(0);
    const double n = keep.sum().item<double>();
    loss += torch::nn::functional::cross_entropy(
                logits, targets, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1))
                .item<double>() * n;
    correct += logits.argmax(-1).eq(targets).logical_and(keep).sum().item<double>();
    count += n;
  }
  return {loss / count, correct / count};
}

}  // namespace

double learning_rate(const RunConfig& c, std::int64_t step) {
  const double warm = std::max(1.0, std::round(c.warmup * static_cast<double>(c.steps)));
  const double t = static_cast<double>(step);
  if (t < warm) return c.lr * (t + 1) / warm;
  const double progress = (t - warm) / std::max(1.0, static_cast<double>(c.steps) - warm);
  return c.lr * 0.5 * (1 + std::cos(M_PI * progress));
}

RunRecord train(const RunConfig& c) {
  if (!(c.lr > 0) || !std::isfinite(c.lr)) throw Error("--lr: must be positive, got " + std::to_string(c.lr));
  if (c.steps < 1) throw Error("--steps: must be positive, got " + std::to_string(c.steps));
  if (c.log_every < 1) throw Error("--log-every: must be positive, got " + std::to_string(c.log_every));
  const Task task(c.task);
  ModelConfig mc = c.model;
  mc.vocab = task.vocab();
  mc.seq_len = c.task.seq_len;
  Decoder model(mc);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(c.seed);
  model->initialise(generator);

  // Weight decay on matrices and embeddings (rank ≥ 2), none on biases, gains and temperatures.
  std::vector<torch::Tensor> decayed, plain;
  for (auto& p : model->parameters()) (p.dim() >= 2 ? decayed : plain).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(c.lr).betas({0.9, 0.95}).weight_decay(c.weight_decay)));
  groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(c.lr).betas({0.9, 0.95}).weight_decay(0)));
  torch::optim::AdamW optimizer(std::move(groups));

  const auto validation = task.validation(c.seed);
  RunRecord run;
  run.initial_val_loss = evaluate(model, validation).loss;
  std::vector<AttentionProbe> probes(mc.n_layers);
  for (std::int64_t step = 0; step < c.steps; ++step) {
    const bool logged = step % c.log_every == 0 || step + 1 == c.steps;
    for (auto& p : probes) p.active = logged;
    for (auto& blk : model->blocks) blk->retain_qkv_grad = logged;
    StepRecord r;
    r.step = step;
    r.lr = learning_rate(c, step);
    r.logged = logged;
    const Batch batch = task.train_batch(c.seed, step);
    const torch::Tensor logits = model->forward(batch.inputs, &probes);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.flatten(0, 1), batch.targets.flatten(), torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
    r.train_loss = loss.item<double>();
    optimizer.zero_grad();
    loss.backward();
    if (logged) {
      for (std::size_t l = 0; l < probes.size(); ++l) {
        const torch::Tensor g = model->blocks[l]->qkv.grad();
        r.layers.push_back({probes[l].max_logit, probes[l].entropy, g.select(2, 0).norm().item<double>(),
                            g.select(2, 1).norm().item<double>()});
      }
    }
    r.grad_norm = torch::nn::utils::clip_grad_norm_(model->parameters(), c.clip);
    for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(r.lr);
    optimizer.step();
    bool diverged = !std::isfinite(r.train_loss);
    if (logged && !diverged) {
      const Evaluation e = evaluate(model, validation);
      r.val_loss = e.loss;
      r.val_accuracy = e.accuracy;
      r.evaluated = true;
      run.final_val_loss = e.loss;
      run.final_val_accuracy = e.accuracy;
      diverged = !std::isfinite(e.loss) || e.loss > run.initial_val_loss;
    }
    run.steps.push_back(std::move(r));
    if (diverged) {
      run.diverged = true;
      if (!std::isfinite(run.steps.back().train_loss)) run.final_val_loss = run.steps.back().train_loss;
      break;
    }
  }
  return run;
}

}  // namespace attnscale::lab::training
