#include "attend_memory.h"

#include <cstdint>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "common/memory.h"
#include "input_files.h"
#include "io/npy_header.h"

namespace attnscale::cli {
namespace {

// One array the call will hold: its flag, its file (inputs only) and what it holds.
struct HeldArray {
  std::string flag, path;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;

  // A view of the shape, no data: what output_shapes() reads.
  TensorView view() const {
    TensorView v;
    v.dtype = dtype;
    v.rank = static_cast<int>(shape.size());  // 1 to 4 (parse_npy_header, output_shapes())
    for (int d = 0; d < v.rank && d < kMaxRank; ++d) v.shape[d] = shape[d];
    return v;
  }
  // "[4, 1048576, 64] float32", as Tensor's allocation error spells a tensor.
  std::string text() const { return view().shape_str() + " " + std::string(dtype_name(dtype)); }
  double bytes() const {
    double n = static_cast<double>(dtype_size(dtype));
    for (const auto d : shape) n *= static_cast<double>(d);
    return n;
  }
};

HeldArray input(const char* flag, const std::string& path, InputDtypes accepted) {
  detail::NpyHeader h = read_input_header(flag, path, accepted);
  return {flag, path, h.dtype, std::move(h.shape)};
}

}  // namespace

void check_attend_memory(const AttendFiles& files) {
  // In the order the call reads and allocates them (the mask with the other flags first), so that
  // an array too large alone is refused with the message its allocation gives.
  std::vector<HeldArray> held;
  if (!files.mask.empty()) held.push_back(input("--mask", files.mask, InputDtypes::mask));
  held.push_back(input("--q", files.q, InputDtypes::floats));
  held.push_back(input("--k", files.k, InputDtypes::floats));
  held.push_back(input("--v", files.v, InputDtypes::floats));
  const std::size_t first = held.size() - 3;
  const OutputShapes shapes =
      output_shapes(held[first].view(), held[first + 1].view(), held[first + 2].view(), {"--q", "--k", "--v"});
  const DType out_dtype = held[first].dtype;  // outputs take q's dtype
  held.push_back({"--out", "", out_dtype, shapes.out});
  if (!files.lse.empty()) held.push_back({"--lse", "", out_dtype, shapes.lse});
  if (!files.probs.empty()) held.push_back({"--probs", "", out_dtype, shapes.probs});

  double total = 0;
  std::string named;
  for (const HeldArray& a : held) {
    // read_input() names an input's allocation "--q: q.npy: tensor ...", attend an output's
    // "--probs: tensor ...".
    detail::check_allocation(
        [&] { return a.flag + ": " + (a.path.empty() ? "" : a.path + ": ") + "tensor " + a.text(); }, a.bytes());
    total += a.bytes();
    named += (named.empty() ? "" : ", ") + a.flag + " " + a.text();
  }
  detail::check_estimate(named + ": the call", total,
                         files.probs.empty() ? "smaller arrays need less" : "smaller arrays, or no --probs, need less");
}

}  // namespace attnscale::cli
