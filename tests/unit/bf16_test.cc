// The bf16 forward (bfloat16 products, float32 accumulation) on every bf16 path this CPU runs,
// against the float64 reference: relative error <= 1e-2, for bf16 inputs and for float32 inputs
// with Options::compute = bf16; and the run-time detection of AMX and AVX-512 BF16.
#include <gtest/gtest.h>
#include <cpuid.h>

#include <string>
#include <vector>

#include "attention/bf16_kernels.h"
#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using detail::bfdot::Path;
using testing::poison;
using testing::random_tensor;
using testing::rel_error;

std::vector<Path> usable_paths() {
  std::vector<Path> paths{Path::portable};
  if (detail::bfdot::avx512_bf16_usable()) paths.push_back(Path::avx512_bf16);
  if (detail::bfdot::amx_usable()) paths.push_back(Path::amx);
  return paths;
}

TEST(Bf16, DetectionFollowsCpuid) {
  unsigned a, b, c, d;
  const bool cpuid_amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 24)) && (d & (1u << 22));
  // Without the CPUID bits AMX must be refused (this machine: an AVX-512 BF16 CPU without AMX).
  if (!cpuid_amx) EXPECT_FALSE(detail::bfdot::amx_usable());
  const bool cpuid_bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
  if (!cpuid_bf16) EXPECT_FALSE(detail::bfdot::avx512_bf16_usable());
  EXPECT_EQ(detail::bfdot::best_path(), detail::bfdot::amx_usable()            ? Path::amx
                                        : detail::bfdot::avx512_bf16_usable() ? Path::avx512_bf16
                                                                              : Path::portable);
  EXPECT_THROW(detail::bfdot::force_path("tpu"), Error);
}

TEST(Bf16, ForwardWithinOnePercentOnEveryPath) {
  struct Shape {
    std::int64_t B, Hq, Hkv, Nq, Nkv, dk, dv;
  };
  const std::vector<Shape> shapes = {{1, 1, 1, 1, 1, 1, 1}, {2, 4, 2, 67, 131, 16, 24}, {1, 2, 1, 130, 77, 59, 5},
                                     {1, 1, 1, 64, 64, 128, 128}};
  for (Path path : usable_paths()) {
    detail::bfdot::force_path(detail::bfdot::path_name(path));
    SCOPED_TRACE(detail::bfdot::path_name(path));
    for (const Shape& s : shapes)
      for (int mask = 0; mask < 4; ++mask)
        for (DType dtype : {DType::bf16, DType::f32}) {
          const Tensor q = random_tensor(dtype, {s.B, s.Hq, s.Nq, s.dk}, 60 + s.Nq, 0),
                       k = random_tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dk}, 60 + s.Nq, 1),
                       v = random_tensor(dtype, {s.B, s.Hkv, s.Nkv, s.dv}, 60 + s.Nq, 2),
                       keep = random_tensor(DType::u8, {s.Nq, s.Nkv}, 60 + s.Nq, 3);
          Options opt;
          opt.compute = Compute::bf16;
          if (mask == 1) opt.mask.causal = true;
          if (mask == 2) opt.mask.explicit_mask = keep.view();
          if (mask == 3) {  // a window: key tiles start off the grid, at odd keys too
            opt.mask.window_left = 37;
            opt.mask.window_right = 3;
          }
          Tensor out(dtype, {s.B, s.Hq, s.Nq, s.dv}), lse(DType::f32, {s.B, s.Hq, s.Nq}),
              ref(DType::f64, {s.B, s.Hq, s.Nq, s.dv}), rlse(DType::f64, {s.B, s.Hq, s.Nq});
          poison(out);
          poison(lse);
          forward(q.view(), k.view(), v.view(), {out.view(), lse.view()}, opt);
          reference::forward(q.view(), k.view(), v.view(), {ref.view(), rlse.view()}, opt);
          EXPECT_LE(rel_error(out.view(), ref.view()), 1e-2) << s.Nq << " mask " << mask;
          EXPECT_LE(rel_error(lse.view(), rlse.view()), 1e-2) << s.Nq << " mask " << mask;
          if (mask == 3) {  // the optional probabilities, from the bf16 statistics
            Tensor probs(DType::f32, {s.B, s.Hq, s.Nq, s.Nkv}), rprobs(DType::f64, {s.B, s.Hq, s.Nq, s.Nkv});
            poison(probs);
            forward(q.view(), k.view(), v.view(), {out.view(), {}, probs.view()}, opt);
            reference::forward(q.view(), k.view(), v.view(), {ref.view(), {}, rprobs.view()}, opt);
            EXPECT_LE(rel_error(probs.view(), rprobs.view()), 1e-2) << s.Nq << " probs";
          }
        }
  }
  detail::bfdot::force_path("");
}

}  // namespace
}  // namespace attnscale
