#include "lab/experiments/training/tasks.h"

#include <algorithm>
#include <numeric>

#include "lab/registry.h"
#include "lab/rng.h"
#include "lab/experiments/training/fortunes_corpus.h"

namespace attnscale::lab::training {
namespace {
constexpr std::uint32_t kValidationTrials = 1u << 30;  // mqar validation sequences: trials from here on
std::uint32_t data_stream(const std::string& task) { return stream_id(k_training, {task == "lm" ? 1 : 2}); }
}  // namespace

Task::Task(TaskConfig c) : c_(std::move(c)) { check_task(c_); }

std::int64_t Task::vocab() const { return c_.task == "lm" ? 256 : kMqarKeys + kMqarValues; }

Batch Task::lm_windows(const std::string& text, const std::vector<std::int64_t>& offsets) const {
  const auto b = static_cast<std::int64_t>(offsets.size()), n = c_.seq_len;
  torch::Tensor inputs = torch::empty({b, n}, torch::kLong), targets = torch::empty({b, n}, torch::kLong);
  auto in = inputs.accessor<std::int64_t, 2>();
  auto tg = targets.accessor<std::int64_t, 2>();
  for (std::int64_t r = 0; r < b; ++r)
    for (std::int64_t t = 0; t < n; ++t) {
      in[r][t] = static_cast<unsigned char>(text[offsets[r] + t]);
      tg[r][t] = static_cast<unsigned char>(text[offsets[r] + t + 1]);
    }
  return {inputs, targets};
}

// Sequence `first + r` is trial trial_base + first + r of the mqar stream: keys are the first P of
// a Fisher-Yates shuffle of [0, 32), values uniform on [32, 64), the query order another shuffle.
Batch Task::mqar_sequences(std::uint64_t seed, std::uint32_t trial_base, std::int64_t first, std::int64_t count) const {
  const std::int64_t pairs = c_.seq_len / 4, n = c_.seq_len;
  torch::Tensor inputs = torch::empty({count, n}, torch::kLong), targets = torch::full({count, n}, -1, torch::kLong);
  auto in = inputs.accessor<std::int64_t, 2>();
  auto tg = targets.accessor<std::int64_t, 2>();
  for (std::int64_t r = 0; r < count; ++r) {
    const Stream s(seed, data_stream("mqar"), trial_base + static_cast<std::uint32_t>(first + r));
    std::uint64_t index = 0;
    auto below = [&](std::int64_t m) { return std::min<std::int64_t>(m - 1, static_cast<std::int64_t>(s.uniform(index++) * m)); };
    std::vector<std::int64_t> keys(kMqarKeys), order(pairs), values(pairs);
    std::iota(keys.begin(), keys.end(), 0);
    for (std::int64_t i = 0; i < pairs; ++i) std::swap(keys[i], keys[i + below(kMqarKeys - i)]);
    for (auto& v : values) v = kMqarKeys + below(kMqarValues);
    std::iota(order.begin(), order.end(), 0);
    for (std::int64_t i = pairs - 1; i > 0; --i) std::swap(order[i], order[below(i + 1)]);
    std::vector<std::int64_t> seq;
    for (std::int64_t i = 0; i < pairs; ++i) seq.insert(seq.end(), {keys[i], values[i]});
    for (std::int64_t i = 0; i < pairs; ++i) seq.insert(seq.end(), {keys[order[i]], values[order[i]]});
    for (std::int64_t t = 0; t < n; ++t) in[r][t] = seq[t];
    // The target at a repeated key (position 2P + 2i) is the value that follows it.
    for (std::int64_t i = 0; i < pairs; ++i) tg[r][2 * pairs + 2 * i] = seq[2 * pairs + 2 * i + 1];
  }
  return {inputs, targets};
}

Batch Task::train_batch(std::uint64_t seed, std::int64_t step) const {
  if (c_.task == "mqar") return mqar_sequences(seed, 0, step * c_.batch, c_.batch);
  const std::string& text = fortunes_corpus(c_.corpus).train;
  const Stream s(seed, data_stream("lm"), static_cast<std::uint32_t>(step));
  const auto span = static_cast<double>(text.size() - c_.seq_len - 1);
  std::vector<std::int64_t> offsets(c_.batch);
  for (std::int64_t r = 0; r < c_.batch; ++r)
    offsets[r] = std::min<std::int64_t>(static_cast<std::int64_t>(s.uniform(r) * span), static_cast<std::int64_t>(span) - 1);
  return lm_windows(text, offsets);
}

std::vector<Batch> Task::validation(std::uint64_t seed) const {
  std::vector<Batch> out;
  for (std::int64_t first = 0; first < c_.val_sequences; first += c_.batch) {
    const std::int64_t count = std::min(c_.batch, c_.val_sequences - first);
    if (c_.task == "mqar") {
      out.push_back(mqar_sequences(seed, kValidationTrials, first, count));
      continue;
    }
    const std::string& text = fortunes_corpus(c_.corpus).validation;
    const std::int64_t span = static_cast<std::int64_t>(text.size()) - c_.seq_len - 1;
    std::vector<std::int64_t> offsets(count);
    for (std::int64_t r = 0; r < count; ++r)
      offsets[r] = c_.val_sequences > 1 ? (first + r) * span / (c_.val_sequences - 1) : 0;
    out.push_back(lm_windows(text, offsets));
  }
  return out;
}

}  // namespace attnscale::lab::training
