#include "options.h"

#include <fmt/format.h>

#include <string>

#include "attnscale/error.h"

namespace attnscale::python {
namespace {

std::string type_name(py::handle obj) { return py::str(obj.get_type().attr("__name__")); }

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

}  // namespace attnscale::python
