// One training step's time with attnscale's attention against PyTorch's own attention math in the
// same model (docs/lab.md, "training"): the attention alone (forward + backward) and the whole step
// (forward, backward, AdamW), at sequence lengths 256 and 1024. Rounds interleave the two
// attentions; each line prints the median and the range over rounds. OpenBLAS (libtorch's products)
// runs the kernels of this CPU's vector width, as in `attnscale bench` (cli/openblas_core.h).
//
//   build/bin/training_step_bench [--rounds R] [--threads T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/openblas_core.h"
#include "lab/experiments/training/attention_function.h"
#include "lab/experiments/training/model.h"

using namespace attnscale::lab::training;

namespace {

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Stats {
  double median, lo, hi;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: training_step_bench [--rounds R] [--threads T]\n");
      return 2;
    }
  }
  // libtorch's products are OpenBLAS's: on the kernels of this CPU's width, as the CLI runs them.
  attnscale::cli::restart_with_openblas_kernels(argv);
  at::set_num_threads(threads);
  torch::manual_seed(0);
  const std::int64_t batch = 4, heads = 2, d_head = 64, d_model = 128;
  std::printf("OpenBLAS on its %s\n", attnscale::cli::openblas_core_note().c_str());
  std::printf("threads %d, B = %lld, H = %lld, d_head = %lld, d_model = %lld, 2 blocks, float32, %d rounds\n",
              threads, (long long)batch, (long long)heads, (long long)d_head, (long long)d_model, rounds);
  std::printf("%-6s %-22s %-10s %12s %24s\n", "N", "what", "attention", "median ms", "range ms");
  for (std::int64_t n : {256, 1024}) {
    // Attention alone: q, k, v as the model makes them (views of one [B, N, 3, H, d] projection).
    const torch::Tensor qkv = torch::randn({batch, n, 3, heads, d_head}).requires_grad_(true);
    const torch::Tensor dout = torch::randn({batch, heads, n, d_head});
    const double s = 1 / std::sqrt(double(d_head));
    // Whole step: the experiment's model on random tokens.
    ModelConfig c;
    c.vocab = 256;
    c.seq_len = n;
    c.d_model = d_model;
    c.n_layers = 2;
    c.n_heads = heads;
    c.d_head = d_head;
    c.threads = threads;
    std::vector<Decoder> models;
    std::vector<std::unique_ptr<torch::optim::AdamW>> optimizers;
    for (const char* att : {"attnscale", "torch"}) {
      c.attention = att;
      models.emplace_back(c);
      optimizers.push_back(std::make_unique<torch::optim::AdamW>(models.back()->parameters(), torch::optim::AdamWOptions(1e-3)));
    }
    const torch::Tensor tokens = torch::randint(0, 256, {batch, n + 1}, torch::kLong);
    std::vector<double> attn[2], step[2];
    for (int r = 0; r < rounds + 1; ++r)
      for (int which = 0; which < 2; ++which) {
        const double ta = seconds_of([&] {
          const auto q = qkv.select(2, 0).permute({0, 2, 1, 3}), k = qkv.select(2, 1).permute({0, 2, 1, 3}),
                     v = qkv.select(2, 2).permute({0, 2, 1, 3});
          const torch::Tensor o = which == 0 ? attnscale_attention(q, k, v, s, true, threads, nullptr)
                                             : torch_attention(q, k, v, s, true, nullptr);
          o.backward(dout);
          qkv.mutable_grad().reset();
        });
        const double ts = seconds_of([&] {
          const torch::Tensor logits = models[which]->forward(tokens.slice(1, 0, n));
          const torch::Tensor loss = torch::nn::functional::cross_entropy(logits.flatten(0, 1), tokens.slice(1, 1).flatten());
          optimizers[which]->zero_grad();
          loss.backward();
          optimizers[which]->step();
        });
        if (r == 0) continue;  // warm-up round
        attn[which].push_back(ta * 1e3);
        step[which].push_back(ts * 1e3);
      }
    const char* names[2] = {"attnscale", "torch"};
    for (int which = 0; which < 2; ++which) {
      const Stats a = stats(attn[which]);
      std::printf("%-6lld %-22s %-10s %12.2f %11.2f – %-10.2f\n", (long long)n, "attention fwd+bwd", names[which], a.median, a.lo, a.hi);
    }
    for (int which = 0; which < 2; ++which) {
      const Stats a = stats(step[which]);
      std::printf("%-6lld %-22s %-10s %12.2f %11.2f – %-10.2f\n", (long long)n, "whole step", names[which], a.median, a.lo, a.hi);
    }
    std::printf("%-6lld ratio torch/attnscale: attention %.2f, step %.2f\n", (long long)n,
                stats(attn[1]).median / stats(attn[0]).median, stats(step[1]).median / stats(step[0]).median);
  }
  return 0;
}
