// One training run of the training experiment: a model (model.h) on a task (tasks.h) with AdamW,
// linear warm-up then cosine decay of the learning rate, and gradient clipping; what it records.
// The header needs no libtorch: the lab builds a RunConfig and reads the RunRecord, and the run
// itself (train_run.cc) is in the libtorch module (torch_module.h).
#pragma once
#include <cstdint>
#include <vector>

#include "lab/experiments/training/model_config.h"
#include "lab/experiments/training/task_config.h"

namespace attnscale::lab::training {

struct RunConfig {
  ModelConfig model;
  TaskConfig task;
  double lr = 1e-3;              // peak learning rate η
  std::int64_t steps = 200;
  double warmup = 0.1;           // fraction of the steps with a linear warm-up from 0 to η
  double weight_decay = 0.1;     // AdamW, on matrices and embeddings only
  double clip = 1.0;             // global gradient-norm clipping
  std::int64_t log_every = 25;   // logged steps: 0, log_every, 2·log_every, …, and the last
  std::uint64_t seed = 0;        // data and initialisation
};

struct LayerRecord {
  double max_logit = 0, entropy = 0;  // attention_function.h
  double grad_q = 0, grad_k = 0;      // ‖∂L/∂Q‖, ‖∂L/∂K‖ at the projection outputs, before clipping
};

struct StepRecord {
  std::int64_t step = 0;
  double lr = 0, train_loss = 0;
  bool logged = false;     // the fields below are filled on logged steps only
  bool evaluated = false;  // val_loss, val_accuracy measured (not after a non-finite loss)
  double val_loss = 0, val_accuracy = 0, grad_norm = 0;
  std::vector<LayerRecord> layers;
};

struct RunRecord {
  std::vector<StepRecord> steps;  // every step run (train_loss on each), up to divergence
  double initial_val_loss = 0;    // before the first update
  double final_val_loss = 0, final_val_accuracy = 0;  // at the last logged step
  bool diverged = false;  // a non-finite training loss, or a validation loss above the initial one
};

// η at `step`: linear warm-up over the first warmup·steps steps, then cosine decay to 0.
double learning_rate(const RunConfig& c, std::int64_t step);

// Runs on the calling thread (torch's own threads: set by the caller). Parameters are drawn from
// a generator seeded from c.seed, data from the lab's streams: the record is a pure function of c.
RunRecord train(const RunConfig& c);

}  // namespace attnscale::lab::training
