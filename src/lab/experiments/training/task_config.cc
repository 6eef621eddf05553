#include "lab/experiments/training/task_config.h"

#include "attnscale/error.h"
#include "lab/experiments/training/fortunes_corpus.h"

namespace attnscale::lab::training {

void check_task(const TaskConfig& c) {
  if (c.task != "lm" && c.task != "mqar") throw Error("--task: expected lm or mqar, got '" + c.task + "'");
  if (c.seq_len < 2 || c.seq_len > 4096) throw Error("--seq-len: must be in [2, 4096], got " + std::to_string(c.seq_len));
  if (c.task == "mqar" && (c.seq_len % 4 != 0 || c.seq_len / 4 > kMqarKeys))
    throw Error("--seq-len: mqar needs a multiple of 4 up to " + std::to_string(4 * kMqarKeys) + ", got " +
                std::to_string(c.seq_len));
  if (c.batch < 1) throw Error("--batch: must be positive, got " + std::to_string(c.batch));
  if (c.task == "lm") {
    const Corpus& corpus = fortunes_corpus(c.corpus);
    if (static_cast<std::int64_t>(corpus.validation.size()) <= c.seq_len + 1)
      throw Error("--seq-len: longer than the validation text");
  }
}

}  // namespace attnscale::lab::training
