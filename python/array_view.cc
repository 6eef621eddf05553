#include "array_view.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <string>
#include <vector>

#include "numpy_blocks.h"

namespace attnscale::python {
namespace {

std::atomic<std::int64_t> copies{0};

std::string shape_text(const py::array& a) {
  return fmt::format("[{}]", fmt::join(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()), ", "));
}

bool is_bfloat16(const py::dtype& dt) {
  const py::object meta = dt.attr("metadata");
  return !meta.is_none() && py::bool_(meta.attr("get")("attnscale").equal(py::str("bfloat16")));
}

// The dtypes an argument of `kind` takes, as its TypeError lists them.
const char* accepted(ArrayKind kind) {
  switch (kind) {
    case ArrayKind::floating: return "float32, float64 or attnscale.bfloat16";
    case ArrayKind::real: return "float32 or float64";
    case ArrayKind::single: return "float32";
    case ArrayKind::mask: return "bool, uint8, float32 or float64";
    case ArrayKind::cache: return "float32, attnscale.bfloat16, float16 or int8";
    case ArrayKind::convertible: return "float32, float64, attnscale.bfloat16 or float16";
    case ArrayKind::index: return "int32";
  }
  return "";
}

// The attnscale dtype of a numpy dtype, or throws TypeError naming what `kind` takes.
DType dtype_of(const char* name, const py::array& a, ArrayKind kind) {
  const char k = a.dtype().kind();
  const auto size = a.itemsize();
  const bool f32 = k == 'f' && size == 4, f64 = k == 'f' && size == 8, f16 = k == 'f' && size == 2;
  const bool bf16 = size == 2 && is_bfloat16(a.dtype());
  const bool boolean = k == 'b' || (k == 'u' && size == 1), i8 = k == 'i' && size == 1, i32 = k == 'i' && size == 4;
  switch (kind) {
    case ArrayKind::floating:
      if (bf16) return DType::bf16;
      [[fallthrough]];
    case ArrayKind::real:
      if (f64) return DType::f64;
      [[fallthrough]];
    case ArrayKind::single:
      if (f32) return DType::f32;
      break;
    case ArrayKind::mask:
      if (f32) return DType::f32;
      if (f64) return DType::f64;
      if (boolean) return DType::u8;
      break;
    case ArrayKind::cache:
    case ArrayKind::convertible:
      if (f32) return DType::f32;
      if (bf16) return DType::bf16;
      if (f16) return DType::f16;
      if (kind == ArrayKind::cache && i8) return DType::i8;
      if (kind == ArrayKind::convertible && f64) return DType::f64;
      break;
    case ArrayKind::index:
      if (i32) return DType::i32;
      break;
  }
  const std::string got = bf16 ? "attnscale.bfloat16" : std::string(py::str(a.dtype()));  // not its storage, int16
  throw py::type_error(fmt::format("{}: dtype must be {}, got {}", name, accepted(kind), got));
}

bool is_torch_tensor(py::handle obj) {
  const py::handle type = obj.get_type();
  return py::str(type.attr("__module__")).cast<std::string>() == "torch" &&
         py::str(type.attr("__name__")).cast<std::string>() == "Tensor" && py::hasattr(obj, "requires_grad");
}

bool strides_are_whole_elements(const py::array& a) {
  for (py::ssize_t d = 0; d < a.ndim(); ++d)
    if (a.strides(d) % a.itemsize() != 0) return false;
  return true;
}

}  // namespace

std::string type_name(py::handle obj) { return py::str(obj.get_type().attr("__name__")); }

ArrayView as_view(const char* name, py::handle obj, ArrayKind kind) {
  py::module_ np = py::module_::import("numpy");
  py::array a;
  if (py::isinstance<py::array>(obj)) {
    a = py::reinterpret_borrow<py::array>(obj);
  } else {
    try {
      a = np.attr("asarray")(obj);
    } catch (py::error_already_set& e) {
      if (is_torch_tensor(obj)) {
        if (obj.attr("requires_grad").cast<bool>())
          throw py::type_error(fmt::format("{0}: a torch.Tensor that requires grad; use attnscale.torch.attention "
                                           "(differentiable), or pass {0}.detach()",
                                           name));
        throw py::type_error(fmt::format("{}: cannot read this torch.Tensor as a numpy array ({}); use "
                                         "attnscale.torch.attention",
                                         name, std::string(py::str(e.value()))));
      }
      throw py::type_error(fmt::format("{}: expected a numpy array, got {}", name, type_name(obj)));
    }
    if (a.dtype().kind() == 'O')
      throw py::type_error(fmt::format("{}: expected a numpy array, got {}", name, type_name(obj)));
  }
  const DType dtype = dtype_of(name, a, kind);
  if (a.ndim() > kMaxRank)
    throw py::value_error(fmt::format("{}: expected at most 4 dimensions, got rank {} {}", name, a.ndim(),
                                      shape_text(a)));
  // Byte order other than native, strides between elements, or a data pointer off the item
  // alignment (the kernels load whole elements): one C-ordered, aligned, native copy.
  const bool native = a.dtype().attr("isnative").cast<bool>();
  const bool aligned = reinterpret_cast<std::uintptr_t>(a.data()) % a.itemsize() == 0;
  if (!native || !aligned || !strides_are_whole_elements(a)) {
    py::dtype want = native ? a.dtype() : py::dtype(a.dtype().attr("newbyteorder")("="));
    a = np.attr("ascontiguousarray")(a, want);
    ++copies;
  }
  ArrayView v;
  v.view.data = const_cast<void*>(a.data());  // inputs are only read
  v.view.dtype = dtype;
  v.view.rank = static_cast<int>(a.ndim());
  for (int d = 0; d < v.view.rank; ++d) {
    v.view.shape[d] = a.shape(d);
    v.view.strides[d] = a.strides(d) / a.itemsize();
  }
  v.array = std::move(a);
  return v;
}

py::dtype bfloat16_dtype() {
  // Never freed: a static py::object would be destroyed after the interpreter shuts down.
  static const py::object* dt = new py::object(py::module_::import("numpy").attr("dtype")(
      "int16", py::arg("metadata") = py::dict(py::arg("attnscale") = "bfloat16")));
  return py::reinterpret_borrow<py::dtype>(*dt);
}

ArrayView new_array(DType dtype, const std::vector<std::int64_t>& shape) {
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  ArrayView v;
  const BlockArrays blocks;  // numpy_blocks.h: 64-byte aligned, kept for the next call once freed
  v.array = dtype == DType::f64    ? py::array(py::dtype::of<double>(), dims)
            : dtype == DType::bf16 ? py::array(bfloat16_dtype(), dims)
            : dtype == DType::i8   ? py::array(py::dtype::of<std::int8_t>(), dims)
                                   : py::array(py::dtype::of<float>(), dims);
  v.view.data = v.array.mutable_data();
  v.view.dtype = dtype;
  v.view.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int d = v.view.rank - 1; d >= 0; --d) {
    v.view.shape[d] = shape[d];
    v.view.strides[d] = stride;
    stride *= shape[d];
  }
  return v;
}

py::array to_numpy(Tensor t) {
  auto* keep = new Tensor(std::move(t));
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  const TensorView& v = keep->view();
  const auto item = static_cast<py::ssize_t>(dtype_size(v.dtype));
  std::vector<py::ssize_t> shape, strides;
  for (int d = 0; d < v.rank; ++d) {
    shape.push_back(v.shape[d]);
    strides.push_back(v.strides[d] * item);
  }
  py::dtype dt = v.dtype == DType::f64    ? py::dtype::of<double>()
                : v.dtype == DType::bf16 ? bfloat16_dtype()
                                         : py::dtype::of<float>();
  return py::array(dt, shape, strides, keep->data(), owner);
}

std::int64_t copy_count() { return copies.load(); }

}  // namespace attnscale::python
