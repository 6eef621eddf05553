// A sweep of training runs as a lab experiment: the training experiment and the recall experiment
// are two of them, with their own grid presets and random streams over the same machinery
// (experiment.cc: points task × attention × scaling × d_head × lr × seed, one run each, and the
// summary rows over seeds and learning rates).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "lab/experiment.h"

namespace attnscale::lab::training {

// --grid NAME → flag → value, for every flag whose value is "grid".
using Presets = std::map<std::string, std::map<std::string, std::string>>;

struct Sweep {
  std::string name, summary;
  std::uint32_t stream = 0;  // lab::k_<name>: the runs' seeds derive from it
  std::string scalings;      // --scaling's default ("grid": from the presets)
  Presets grids;             // quick, default, full
};

Experiment sweep_experiment(const Sweep& sweep);

}  // namespace attnscale::lab::training
