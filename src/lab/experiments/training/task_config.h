// What a training task is asked for (tasks.h makes its batches), and its check, without libtorch:
// the lab validates a sweep's flags with it before any run loads the libtorch module.
#pragma once
#include <cstdint>
#include <string>

namespace attnscale::lab::training {

// MQAR's tokens: keys of [0, 32), values of [32, 64) (tasks.h).
constexpr std::int64_t kMqarKeys = 32, kMqarValues = 32;

struct TaskConfig {
  std::string task = "lm";  // "lm" or "mqar"
  std::string corpus = "/usr/share/games/fortunes";
  std::int64_t seq_len = 64;  // N; mqar: 4 · pairs
  std::int64_t batch = 16;
  std::int64_t val_sequences = 32;
};

// Throws Error naming the flag (--task, --seq-len, --batch, --corpus) unless `c` is a task that
// can run; lm reads the corpus for it (fortunes_corpus.h, once per folder).
void check_task(const TaskConfig& c);

}  // namespace attnscale::lab::training
