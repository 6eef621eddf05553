// The two training tasks, as batches of (inputs, targets) token tensors [B, N] (int64; target −1:
// no loss at that position). Every batch is a pure function of (seed, step) through the lab's
// Philox streams, so the runs of one seed see the same data whatever their scaling or learning rate.
//
// lm    next-byte prediction on the fortunes text (fortunes_corpus.h): a training batch is B windows
//       of N + 1 bytes at uniform random offsets of the training part; validation is a fixed set of
//       windows at evenly spaced offsets of the validation part.
// mqar  multi-query associative recall (as in the Zoology benchmark): P key-value pairs
//       k_1 v_1 … k_P v_P, then the P keys again in a random order, each followed by its value; the
//       loss and accuracy count only the value after each repeated key (the pairs' own values are
//       unpredictable). Keys are P distinct tokens of [0, 32), values tokens of [32, 64) drawn
//       with replacement: V = 64, N = 4P. Only attention can look the pairs up.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lab/experiments/training/task_config.h"

namespace attnscale::lab::training {

struct Batch {
  torch::Tensor inputs, targets;  // [B, N] int64
};

class Task {
 public:
  explicit Task(TaskConfig c);  // validates (check_task)
  std::int64_t vocab() const;
  Batch train_batch(std::uint64_t seed, std::int64_t step) const;
  // The fixed validation set (depends on `seed` for mqar only), in batches of at most `batch`.
  std::vector<Batch> validation(std::uint64_t seed) const;
  bool scores_accuracy() const { return c_.task == "mqar"; }

 private:
  Batch lm_windows(const std::string& text, const std::vector<std::int64_t>& offsets) const;
  Batch mqar_sequences(std::uint64_t seed, std::uint32_t trial_base, std::int64_t first, std::int64_t count) const;
  TaskConfig c_;
};

}  // namespace attnscale::lab::training
