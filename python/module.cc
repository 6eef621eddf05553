// The extension module attnscale._attnscale (the kernels); the package attnscale/__init__.py
// re-exports it. The lab (_lab: Open MPI through its sweeps; libtorch only once a training run
// opens the lab's libtorch module) and ring attention (_distributed: Open MPI) are modules of their
// own, loaded on first use, so that `import attnscale` maps neither.
#include <pybind11/pybind11.h>

#include "array_view.h"
#include "attention_bindings.h"
#include "convert_bindings.h"
#include "kv_cache_bindings.h"
#include "attention/bf16_kernels.h"
#include "attention/peak_loops.h"
#include "attnscale/version.h"

namespace py = pybind11;

PYBIND11_MODULE(_attnscale, m) {
  // The docstrings start with the Python signature; pybind11's generated one would show C++ types.
  py::options options;
  options.disable_function_signatures();
  m.doc() = "attnscale's C++ library: the attention kernels (see the attnscale package).";
  attnscale::python::add_attention(m);
  attnscale::python::add_kv_cache(m);
  attnscale::python::add_convert(m);
  m.def("version", &attnscale::version, "The library version, e.g. '0.1.0'.");
  m.def("git_hash", &attnscale::git_hash, "The commit the library was built from, or 'unknown'.");
  m.def("cpu_target", &attnscale::cpu_target,
        "The SIMD target the fast kernels dispatch to on this CPU (e.g. 'AVX2', 'baseline').");
  m.def("_copy_count", &attnscale::python::copy_count,
        "How many input arrays were copied because their strides are not whole elements or their "
        "byte order is not native (every other input is read in place).");
  m.def(
      "_as_array",
      [](const std::string& name, py::handle obj, bool mask) {
        using attnscale::python::ArrayKind;
        return attnscale::python::as_view(name.c_str(), obj, mask ? ArrayKind::mask : ArrayKind::floating).array;
      },
      "_as_array(name, obj, mask): obj as the numpy array the kernels would read (the same TypeError "
      "naming `name` for a wrong dtype or a torch tensor numpy cannot read).");
  // The compute ceilings bench/goals.py measures beside the kernels (see peak_loops.h).
  m.def(
      "_timed_peak_loop",
      [](const std::string& kind, int threads, std::int64_t steps) {
        namespace peak = attnscale::detail::peak;
        if (kind != "fp32" && kind != "bf16" && kind != "amx")
          throw py::value_error("kind: 'fp32', 'bf16' or 'amx', got '" + kind + "'");
        peak::Timing t;
        {
          py::gil_scoped_release unlocked;
          t = kind == "fp32" ? peak::timed_fp32_fma(threads, steps)
              : kind == "bf16" ? peak::timed_bf16_dot(threads, steps)
                               : peak::timed_amx_bf16(threads, steps);
        }
        return py::make_tuple(t.flops, t.time.seconds);
      },
      "_timed_peak_loop(kind, threads, steps) -> (flops, seconds): the 'fp32', 'bf16' or 'amx' peak "
      "loop timed by itself, from the first thread's start to the last one's end once every thread "
      "has reached the start barrier (as attnscale bench times it; peak_loops.h).");
  m.def("_bf16_path", [] { return std::string(attnscale::detail::bfdot::path_name(attnscale::detail::bfdot::path())); },
        "_bf16_path() -> str: the path of the bf16 products now (amx, avx512-bf16, widened, portable).");
  m.attr("__version__") = attnscale::version();
  m.attr("bfloat16") = attnscale::python::bfloat16_dtype();
}
