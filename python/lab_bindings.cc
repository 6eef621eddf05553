// The lab's registry for Python: list the experiments with their flags, run one into rows.
//
// Generic over lab::experiments(): attnscale/lab.py builds one Python function per experiment
// from lab_experiments(), so a new experiment appears in Python without a change here.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <string>

#include "lab/experiment.h"
#include "lab/results.h"
#include "lab_bindings.h"

namespace attnscale::python {
namespace {

namespace py = pybind11;

py::list lab_experiments() {
  py::list out;
  for (const lab::Experiment& e : lab::experiments()) {
    py::list flags;
    for (const lab::FlagSpec& f : e.flags) flags.append(py::make_tuple(f.name, f.default_value, f.help));
    py::dict d;
    d["name"] = e.name;
    d["summary"] = e.summary;
    d["flags"] = flags;
    d["default_trials"] = e.default_trials;
    d["param_names"] = e.param_names;
    out.append(d);
  }
  return out;
}

py::dict metadata(const lab::Metadata& m) {
  py::dict d;
  d["experiment"] = m.experiment;
  d["seed"] = m.seed;
  d["trials"] = m.trials;
  d["threads"] = m.threads;
  d["version"] = m.version;
  d["git_hash"] = m.git_hash;
  d["cpu_target"] = m.cpu_target;
  d["seconds"] = m.seconds;
  py::dict flags;
  for (const auto& [k, v] : m.flags) flags[py::str(k)] = v;
  d["flags"] = flags;
  return d;
}

struct Cancelled {};  // thrown from the progress callback to stop a run after Ctrl-C

// Runs the experiment with the GIL released, on a thread of its own, while this (the calling)
// thread checks every 100 ms for a signal such as Ctrl-C: Python handles signals only on its
// main thread. After a signal no new sweep point starts, the points in progress finish, and the
// signal's exception (KeyboardInterrupt) is raised. `progress(done, total)` (or None) is called
// with the GIL held after each sweep point, in order, from whichever thread finished it; an
// exception it raises stops the run the same way and propagates.
py::dict lab_run(const std::string& name, const std::map<std::string, std::string>& flags,
                 std::uint64_t seed, std::int64_t trials, int threads, py::object progress) {
  const lab::Experiment& e = lab::find_experiment(name);
  std::atomic<bool> cancel{false};
  lab::Progress report = [&](std::size_t done, std::size_t total, const std::vector<lab::Row>&) {
    if (cancel) throw Cancelled{};
    if (progress.is_none()) return;
    py::gil_scoped_acquire locked;
    progress(done, total);
  };
  lab::ResultTable table;
  std::exception_ptr error;
  std::optional<py::error_already_set> signal;
  {
    py::gil_scoped_release unlocked;
    std::mutex mutex;
    std::condition_variable finished_cv;
    bool finished = false;
    std::thread runner([&] {
      try {
        table = lab::run_experiment(e, flags, seed, trials, threads, report);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      finished = true;
      finished_cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mutex);
    while (!finished_cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return finished; })) {
      if (signal) continue;
      lock.unlock();
      {
        py::gil_scoped_acquire locked;
        if (PyErr_CheckSignals() != 0) {
          signal.emplace();  // takes the pending Python exception
          cancel = true;
        }
      }
      lock.lock();
    }
    lock.unlock();
    runner.join();
  }
  if (signal) throw std::move(*signal);
  if (error) std::rethrow_exception(error);
  py::list rows;
  for (const lab::Row& r : table.rows)
    rows.append(py::make_tuple(r.params, r.metric, r.mean, r.ci_low, r.ci_high,
                               r.theory ? py::object(py::float_(*r.theory)) : py::object(py::none())));
  py::dict out;
  out["param_names"] = table.param_names;
  out["rows"] = rows;
  out["metadata"] = metadata(table.meta);
  out["csv"] = lab::to_csv(table);
  out["json"] = lab::to_json(table);
  return out;
}

}  // namespace

void add_lab(py::module_& m) {
  m.def("lab_experiments", &lab_experiments,
        "lab_experiments()\n\nThe lab's experiments: a list of dicts with name, summary, flags "
        "[(name, default, help)], default_trials and param_names.");
  m.def("lab_run", &lab_run,
        "lab_run(name, flags, seed, trials, threads, progress)\n\nRuns one experiment: flags is a "
        "dict of flag name -> text (as on the command line); trials 0 takes the experiment's "
        "default. Returns a dict with param_names, rows (params, metric, mean, ci_low, ci_high, "
        "theory), metadata, and the csv and json texts the command line writes.",
        py::arg("name"), py::arg("flags"), py::arg("seed") = 0, py::arg("trials") = 0, py::arg("threads") = 0,
        py::arg("progress") = py::none());
}

}  // namespace attnscale::python
