#include "distributed_bindings.h"

#ifdef ATTNSCALE_HAVE_MPI
#include <fmt/format.h>
#include <mpi.h>
#include <pybind11/stl.h>

#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "array_view.h"
#include "attnscale/distributed.h"
#include "distributed/agreement.h"
#include "options.h"
#endif

namespace attnscale::python {

#ifndef ATTNSCALE_HAVE_MPI
void add_distributed(pybind11::module_& m) { m.attr("has_mpi") = false; }
#else
namespace {

distributed::Sharding parse_sharding(py::handle s, const Options& o) {
  if (s.is_none()) return o.mask.causal ? distributed::Sharding::zigzag : distributed::Sharding::contiguous;
  const std::string name = py::str(s);
  if (name == "contiguous") return distributed::Sharding::contiguous;
  if (name == "zigzag") return distributed::Sharding::zigzag;
  throw py::value_error(fmt::format("sharding: expected None, 'contiguous' or 'zigzag', got '{}'", name));
}

MPI_Comm communicator(std::int64_t fortran_handle) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw py::value_error("comm: MPI is not initialised (import mpi4py.MPI first)");
  return MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
}

// Runs this rank's argument checks (and whatever else may fail before the ring starts), then agrees
// with every rank of c on the outcome before any of them starts the ring: an argument error on one
// rank raises on every rank (the failing rank its own exception, the others "rank R: ...") instead
// of leaving them waiting in the ring for a rank that gave up. This agreement is the first
// collective of a call; a rank whose call failed in Python before reaching a binding (a misspelt
// keyword) takes part in it through _refuse.
template <class F>
void agreed_arguments(MPI_Comm c, F&& checks) {
  std::exception_ptr mine;
  std::string message;
  try {
    checks();
  } catch (py::error_already_set& e) {
    mine = std::current_exception();
    message = py::str(e.value());
  } catch (const std::exception& e) {
    mine = std::current_exception();
    message = e.what();
  }
  if (mine && message.empty()) message = "error";
  try {
    distributed::agree(c, message);
  } catch (const distributed::AgreedError&) {
    if (mine) std::rethrow_exception(mine);
    throw;
  }
}

// The threads keyword as an int, or a one-line error naming it (pybind11's own cast names neither
// the argument nor the value).
int threads_of(py::handle threads) {
  if (!py::isinstance<py::int_>(threads) || py::isinstance<py::bool_>(threads))
    throw py::type_error(fmt::format("threads: expected int, got {}", type_name(threads)));
  try {
    return threads.cast<int>();
  } catch (const py::cast_error&) {
    throw py::type_error(fmt::format("threads: {} is out of range (too large for the extension's integers)",
                                     std::string(py::str(threads))));
  }
}

std::vector<std::int64_t> shape_with(const TensorView& t, int drop, std::optional<std::int64_t> tail) {
  std::vector<std::int64_t> s(t.shape.begin(), t.shape.begin() + t.rank - drop);
  if (tail) s.push_back(*tail);
  return s;
}

py::object ring_attention(py::handle q_obj, py::handle k_obj, py::handle v_obj, std::int64_t comm,
                          py::handle sharding, py::handle scale, py::handle causal, py::handle window,
                          py::handle align, py::handle return_lse_obj, py::handle threads) {
  const MPI_Comm c = communicator(comm);
  ArrayView q, k, v, out, lse;
  MaskedOptions opt;
  distributed::Sharding s{};
  Outputs outputs;
  bool return_lse = false;
  agreed_arguments(c, [&] {
    q = as_view("q", q_obj, ArrayKind::real);
    k = as_view("k", k_obj, ArrayKind::real);
    v = as_view("v", v_obj, ArrayKind::real);
    return_lse = return_lse_obj.cast<bool>();
    opt = make_options(scale, causal, window, align, py::none(), threads_of(threads));
    s = parse_sharding(sharding, opt.options);
    if (q.view.rank < 2 || v.view.rank < 2) throw py::value_error("q, v: expected rank 2, 3 or 4");
    out = new_array(q.view.dtype, shape_with(q.view, 1, v.view.shape[v.view.rank - 1]));
    outputs.out = out.view;
    if (return_lse) outputs.lse = (lse = new_array(q.view.dtype, shape_with(q.view, 1, std::nullopt))).view;
  });
  {
    py::gil_scoped_release unlocked;
    distributed::ring_forward(q.view, k.view, v.view, outputs, opt.options, c, s);
  }
  if (!return_lse) return out.array;
  return py::make_tuple(out.array, lse.array);
}

py::tuple ring_attention_backward(py::handle q_obj, py::handle k_obj, py::handle v_obj, py::handle out_obj,
                                  py::handle lse_obj, py::handle dout_obj, std::int64_t comm, py::handle sharding,
                                  py::handle scale, py::handle causal, py::handle window, py::handle align,
                                  py::handle threads, py::handle dlse_obj) {
  const MPI_Comm c = communicator(comm);
  ArrayView q, k, v, out, lse, dout, dlse, dq, dk, dv;
  MaskedOptions opt;
  distributed::Sharding s{};
  agreed_arguments(c, [&] {
    q = as_view("q", q_obj, ArrayKind::real);
    k = as_view("k", k_obj, ArrayKind::real);
    v = as_view("v", v_obj, ArrayKind::real);
    out = as_view("out", out_obj, ArrayKind::real);
    lse = as_view("lse", lse_obj, ArrayKind::real);
    dout = as_view("dout", dout_obj, ArrayKind::real);
    opt = make_options(scale, causal, window, align, py::none(), threads_of(threads));
    s = parse_sharding(sharding, opt.options);
    if (!dlse_obj.is_none()) opt.options.dlse = (dlse = as_view("dlse", dlse_obj, ArrayKind::real)).view;
    dq = new_array(q.view.dtype, shape_with(q.view, 0, std::nullopt));
    dk = new_array(q.view.dtype, shape_with(k.view, 0, std::nullopt));
    dv = new_array(q.view.dtype, shape_with(v.view, 0, std::nullopt));
  });
  {
    py::gil_scoped_release unlocked;
    distributed::ring_backward(q.view, k.view, v.view, out.view, lse.view, dout.view, {dq.view, dk.view, dv.view},
                               opt.options, c, s);
  }
  return py::make_tuple(dq.array, dk.array, dv.array);
}

}  // namespace

void add_distributed(py::module_& m) {
  m.attr("has_mpi") = true;
  m.def("_ring_attention", &ring_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("comm"),
        py::arg("sharding"), py::arg("scale"), py::arg("causal"), py::arg("window"), py::arg("align"),
        py::arg("return_lse"), py::arg("threads"),
        "_ring_attention(q, k, v, comm, sharding, scale, causal, window, align, return_lse, threads): "
        "see attnscale.distributed.ring_attention.");
  m.def("_ring_attention_backward", &ring_attention_backward, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("dout"), py::arg("comm"), py::arg("sharding"), py::arg("scale"),
        py::arg("causal"), py::arg("window"), py::arg("align"), py::arg("threads"), py::arg("dlse") = py::none(),
        "_ring_attention_backward(...): see attnscale.distributed.ring_attention_backward.");
  m.def(
      "_refuse",
      [](std::int64_t comm, const std::string& error) {
        agreed_arguments(communicator(comm), [&] { throw py::type_error(error); });
      },
      py::arg("comm"), py::arg("error"),
      "_refuse(comm, error): raises TypeError(error) on this rank once it has taken part in the agreement "
      "that a ring call starts with, so that the other ranks of comm raise it too (see attnscale.distributed).");
  m.def(
      "_shard",
      [](std::int64_t n, int ranks, int rank, const std::string& sharding) {
        std::vector<std::tuple<std::int64_t, std::int64_t>> out;
        const auto s = sharding == "zigzag" ? distributed::Sharding::zigzag : distributed::Sharding::contiguous;
        if (sharding != "zigzag" && sharding != "contiguous")
          throw py::value_error(fmt::format("sharding: expected 'contiguous' or 'zigzag', got '{}'", sharding));
        for (const auto& seg : distributed::shard(n, ranks, rank, s)) out.emplace_back(seg.begin, seg.length);
        return out;
      },
      "_shard(n, ranks, rank, sharding) -> [(begin, length), ...]: see attnscale.distributed.shard.");
}
#endif

}  // namespace attnscale::python
