#include "options.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "attnscale/error.h"

namespace attnscale::python {
namespace {

Scale parse_scale(py::handle scale) {
  if (scale.is_none()) return Scale{};
  if (py::isinstance<py::str>(scale)) return Scale::parse(scale.cast<std::string>());
  const py::object real = py::module_::import("numbers").attr("Real");
  if (!py::isinstance<py::bool_>(scale) && py::isinstance(scale, real))
    return Scale::value(py::float_(py::reinterpret_borrow<py::object>(scale)).cast<double>());
  throw py::type_error(fmt::format("scale: expected None, 'none', 'sqrt', 'linear' or a number, got {}", type_name(scale)));
}

std::int64_t window_side(py::handle side, py::handle window) {
  if (side.is_none()) return -1;
  const py::object integral = py::module_::import("numbers").attr("Integral");
  if (py::isinstance<py::bool_>(side) || !py::isinstance(side, integral))
    throw py::type_error(fmt::format("window: expected (left, right) with ints or None, got {}", std::string(py::repr(window))));
  return side.cast<std::int64_t>();
}

}  // namespace

MaskedOptions make_options(py::handle scale, py::handle causal, py::handle window, py::handle align,
                           py::handle mask, int threads) {
  MaskedOptions m;
  Options& o = m.options;
  o.scale = parse_scale(scale);
  o.threads = threads;
  // causal: None/False, True, or the alignment's name.
  if (py::isinstance<py::bool_>(causal)) {
    o.mask.causal = causal.cast<bool>();
  } else if (py::isinstance<py::str>(causal)) {
    o.mask.causal = true;
    o.mask.align = parse_align(causal.cast<std::string>(), "causal");
  } else if (!causal.is_none()) {
    throw py::type_error(fmt::format("causal: expected None, True, 'top-left' or 'bottom-right', got {}", type_name(causal)));
  }
  if (!align.is_none()) {
    if (!py::isinstance<py::str>(align))
      throw py::type_error(fmt::format("align: expected None, 'top-left' or 'bottom-right', got {}", type_name(align)));
    const Align a = parse_align(align.cast<std::string>(), "align");
    if (py::isinstance<py::str>(causal) && a != o.mask.align)
      throw Error(fmt::format("align: conflicts with causal='{}' (they share one diagonal)", causal.cast<std::string>()));
    o.mask.align = a;
  }
  if (!window.is_none()) {
    if (!(py::isinstance<py::tuple>(window) || py::isinstance<py::list>(window)) || py::len(window) != 2)
      throw py::type_error(fmt::format("window: expected (left, right) with ints or None, got {}", std::string(py::repr(window))));
    py::sequence w = py::reinterpret_borrow<py::sequence>(window);
    o.mask.window_left = window_side(w[0], window);
    o.mask.window_right = window_side(w[1], window);
  }
  if (!mask.is_none()) {
    m.mask = as_view("mask", mask, ArrayKind::mask);
    o.mask.explicit_mask = m.mask.view;
  }
  return m;
}

namespace {
std::vector<std::int64_t> offsets(const char* name, py::handle obj) {
  if (obj.is_none()) return {};
  const py::array a = py::array::ensure(obj);
  if (!a || a.ndim() != 1 || !(a.dtype().kind() == 'i' || a.dtype().kind() == 'u'))
    throw py::type_error(fmt::format("{}: expected None or a 1-d sequence of integers, got {}", name, type_name(obj)));
  const auto ints = a.cast<py::array_t<std::int64_t, py::array::forcecast>>();
  return std::vector<std::int64_t>(ints.data(), ints.data() + ints.size());
}
}  // namespace

void add_extras(MaskedOptions& m, const Extras& e) {
  Options& o = m.options;
  o.softcap = e.softcap;
  if (!e.alibi_slopes.is_none()) {
    m.alibi_slopes = as_view("alibi_slopes", e.alibi_slopes, ArrayKind::real);
    o.alibi_slopes = m.alibi_slopes.view;
  }
  if (!e.sinks.is_none()) {
    m.sinks = as_view("sinks", e.sinks, ArrayKind::real);
    o.sinks = m.sinks.view;
  }
  o.dropout = Dropout{e.dropout_p, e.dropout_seed, e.dropout_offset};
  o.cu_seqlens_q = offsets("cu_seqlens_q", e.cu_seqlens_q);
  o.cu_seqlens_k = offsets("cu_seqlens_k", e.cu_seqlens_k);
  if (o.cu_seqlens_q.empty() != o.cu_seqlens_k.empty())
    throw Error(o.cu_seqlens_q.empty() ? "cu_seqlens_q: required with cu_seqlens_k"
                                       : "cu_seqlens_k: required with cu_seqlens_q");
}

Compute parse_compute(py::handle compute) {
  if (compute.is_none()) return Compute::native;
  if (!py::isinstance<py::str>(compute))
    throw py::type_error(fmt::format("compute: expected None, 'native' or 'bf16', got {}", type_name(compute)));
  const std::string c = compute.cast<std::string>();
  if (c == "native") return Compute::native;
  if (c == "bf16") return Compute::bf16;
  throw py::value_error(fmt::format("compute: expected 'native' or 'bf16', got '{}'", c));
}

}  // namespace attnscale::python
