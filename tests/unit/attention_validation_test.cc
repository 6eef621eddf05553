// Every bad argument throws Error naming the argument (and shapes), and writes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attnscale/attention.h"
#include "attnscale/error.h"
#include "random_tensors.h"

namespace attnscale {
namespace {
using testing::random_tensor;

struct Inputs {
  Tensor q = random_tensor(DType::f32, {2, 4, 5, 8}, 1, 0);
  Tensor k = random_tensor(DType::f32, {2, 2, 6, 8}, 1, 1);
  Tensor v = random_tensor(DType::f32, {2, 2, 6, 3}, 1, 2);
  Tensor out = Tensor(DType::f32, {2, 4, 5, 3});
  Options opt;
};

// Runs forward with one thing broken; checks the message names `needle` and out is untouched.
void expect_error(const std::function<void(Inputs&)>& breakit, const std::string& needle) {
  Inputs s;
  breakit(s);
  for (std::int64_t i = 0; i < s.out.numel(); ++i) s.out.as<float>()[i] = 42.0f;
  try {
    forward(s.q.view(), s.k.view(), s.v.view(), {s.out.view()}, s.opt);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  for (std::int64_t i = 0; i < s.out.numel(); ++i) ASSERT_EQ(s.out.as<float>()[i], 42.0f);
}

// The shape rules the command line and Python share: output_shapes() and parse_align().
TEST(Validation, OutputShapesFollowQ) {
  const Tensor q(DType::f32, {3, 5, 7}), k(DType::f32, {1, 11, 7}), v(DType::f32, {1, 11, 2});
  const OutputShapes s = output_shapes(q.view(), k.view(), v.view());
  EXPECT_EQ(s.out, (std::vector<std::int64_t>{3, 5, 2}));
  EXPECT_EQ(s.lse, (std::vector<std::int64_t>{3, 5}));
  EXPECT_EQ(s.probs, (std::vector<std::int64_t>{3, 5, 11}));
  const Tensor r1(DType::f32, {4});
  try {
    output_shapes(q.view(), k.view(), r1.view(), {"--q", "--k", "--v"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--v: expected rank 2, 3 or 4 ([N, d], [H, N, d] or [B, H, N, d]), got rank 1 [4]");
  }
}

TEST(Validation, ParseAlign) {
  EXPECT_EQ(parse_align("top-left", "x"), Align::top_left);
  EXPECT_EQ(parse_align("bottom-right", "x"), Align::bottom_right);
  try {
    parse_align("middle", "--align");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--align: expected 'top-left' or 'bottom-right', got 'middle'");
  }
}

TEST(Validation, WrongRank) {
  expect_error([](Inputs& s) { s.q = random_tensor(DType::f32, {40}, 1, 0); }, "q: expected rank 2, 3 or 4");
}
TEST(Validation, ZeroSize) {
  expect_error([](Inputs& s) { s.k = Tensor(DType::f32, {2, 2, 0, 8}); }, "k: every dimension must be positive");
}
TEST(Validation, DkZero) {
  expect_error([](Inputs& s) { s.q = Tensor(DType::f32, {2, 4, 5, 0}); }, "q: every dimension must be positive");
}
TEST(Validation, DkMismatch) {
  expect_error([](Inputs& s) { s.k = random_tensor(DType::f32, {2, 2, 6, 7}, 1, 1); }, "k: last dimension dk = 7");
}
TEST(Validation, HeadsNotDivisible) {
  expect_error(
      [](Inputs& s) {
        s.k = random_tensor(DType::f32, {2, 3, 6, 8}, 1, 1);
        s.v = random_tensor(DType::f32, {2, 3, 6, 3}, 1, 2);
      },
      "must be a multiple of key/value heads Hkv = 3");
}
TEST(Validation, BatchMismatch) {
  expect_error([](Inputs& s) { s.v = random_tensor(DType::f32, {1, 2, 6, 3}, 1, 2); }, "k, v: batch must match");
}
TEST(Validation, ValuesKeysMismatch) {
  expect_error([](Inputs& s) { s.v = random_tensor(DType::f32, {2, 2, 7, 3}, 1, 2); }, "v: heads and keys must match");
}
TEST(Validation, DtypeMismatch) {
  expect_error([](Inputs& s) { s.v = random_tensor(DType::f64, {2, 2, 6, 3}, 1, 2); }, "q, k, v: dtypes differ");
}
// forward computes in float32, float64 and bfloat16 only: float16 and the integer types (KV
// caches, masks, block tables) are refused as operands, outputs and masks, not read or written as
// something else.
TEST(Validation, DtypesOutsideTheComputedOnesAreRefused) {
  for (const DType t : {DType::f16, DType::i8, DType::i32, DType::u8}) {
    expect_error(
        [t](Inputs& s) {
          s.q = Tensor(t, {2, 4, 5, 8});
          s.k = Tensor(t, {2, 2, 6, 8});
          s.v = Tensor(t, {2, 2, 6, 3});
        },
        "q: dtype must be float32, float64 or bfloat16, got " + std::string(dtype_name(t)));
    Inputs s;
    const Tensor out(t, {2, 4, 5, 3}), lse(t, {2, 4, 5});
    auto message = [&](const Outputs& o) {
      try {
        forward(s.q.view(), s.k.view(), s.v.view(), o, s.opt);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    EXPECT_EQ(message({out.view()}), "out: dtype must be float32, got " + std::string(dtype_name(t)));
    Outputs with_lse{s.out.view()};
    with_lse.lse = lse.view();
    EXPECT_EQ(message(with_lse), "lse: dtype must be float32, float64 or bfloat16, got " + std::string(dtype_name(t)));
  }
  static Tensor m;
  for (const DType t : {DType::i8, DType::i32, DType::f16, DType::bf16})
    expect_error(
        [t](Inputs& s) {
          m = Tensor(t, {5, 6});
          s.opt.mask.explicit_mask = m.view();
        },
        "mask: dtype must be bool/uint8, float32 or float64, got " + std::string(dtype_name(t)));
}
TEST(Validation, OutputShape) {
  expect_error([](Inputs& s) { s.out = Tensor(DType::f32, {2, 4, 5, 4}); }, "out: expected shape [2, 4, 5, 3]");
}
TEST(Validation, MaskDoesNotBroadcast) {
  static Tensor m;
  expect_error(
      [](Inputs& s) {
        m = Tensor(DType::u8, {2, 3, 5, 6});
        s.opt.mask.explicit_mask = m.view();
      },
      "mask: shape [2, 3, 5, 6] does not broadcast to [2, 4, 5, 6]");
  expect_error(
      [](Inputs& s) {
        m = Tensor(DType::f32, {6, 5});
        s.opt.mask.explicit_mask = m.view();
      },
      "mask: shape [6, 5] does not broadcast");
}
TEST(Validation, NonFiniteScale) {
  EXPECT_THROW(Scale::value(INFINITY), Error);
  EXPECT_THROW(Scale::value(NAN), Error);
  EXPECT_THROW(Scale::parse("1e999"), Error);
  EXPECT_THROW(Scale::parse("sqrtx"), Error);
  try {
    Scale::parse("fast");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "scale: expected none, sqrt, linear or a finite number, got 'fast'");
  }
}
TEST(Validation, ScaleTextIsReadAlikeWhateverItsSpacesAndSubnormalsAreFinite) {
  EXPECT_EQ(Scale::parse(" 1").resolve(8), 1.0);
  EXPECT_EQ(Scale::parse("1 ").resolve(8), 1.0);
  EXPECT_EQ(Scale::parse(" 0.5 ").resolve(8), 0.5);
  EXPECT_EQ(Scale::parse("sqrt ").describe(), Scale::parse("sqrt").describe());
  EXPECT_EQ(Scale::parse("1e-320").resolve(8), 1e-320);  // subnormal: finite
  try {
    Scale::parse("1e-400");
    ADD_FAILURE() << "1e-400 rounds to 0 and must be refused";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "scale: '1e-400' is too small (it rounds to 0)");
  }
}
TEST(Validation, BadWindow) {
  expect_error([](Inputs& s) { s.opt.mask.window_left = -3; }, "window: sizes must be >= 0");
}
TEST(Validation, NullData) {
  expect_error([](Inputs& s) { s.q = Tensor(); }, "q: missing");
}
TEST(Validation, BackwardChecksGradientShapes) {
  Inputs s;
  Tensor lse(DType::f32, {2, 4, 5}), dq(DType::f32, {2, 4, 5, 8}), dk(DType::f32, {2, 2, 6, 8}),
      dv(DType::f32, {2, 2, 6, 4});
  try {
    backward(s.q.view(), s.k.view(), s.v.view(), s.out.view(), lse.view(), s.out.view(),
             {dq.view(), dk.view(), dv.view()});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dv: expected shape [2, 2, 6, 3]"), std::string::npos) << e.what();
  }
}
// Outputs that would write two results to one place, or into each other, are refused before anything
// is written; dq, dk and dv interleaved in one packed buffer (gaps between each one's elements) are not.
TEST(Validation, OutputsThatShareMemoryAreRefused) {
  Inputs s;
  // lse inside out's memory: the forward refuses it (out left as it was).
  Tensor out(DType::f32, {2, 4, 5, 3});
  const float before = out.as<float>()[7] = 42.0f;
  const auto lse_in_out = TensorView::contiguous(out.as<float>() + 1, DType::f32, {2, 4, 5});
  EXPECT_THROW(forward(s.q.view(), s.k.view(), s.v.view(), {out.view(), lse_in_out}), Error);
  EXPECT_EQ(out.as<float>()[7], before);
  try {
    forward(s.q.view(), s.k.view(), s.v.view(), {out.view(), lse_in_out});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out, lse: outputs share memory"), std::string::npos) << e.what();
  }
  // An out broadcast over its heads (stride 0) would take every head's rows in one place.
  const auto broadcast = TensorView::strided(out.as<float>(), DType::f32, {2, 4, 5, 3}, {60, 0, 3, 1});
  try {
    forward(s.q.view(), s.k.view(), s.v.view(), {broadcast});
    ADD_FAILURE() << "a stride-0 out accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out: dimension 1 has stride 0"), std::string::npos) << e.what();
  }
  // The backward: dk and dv in one buffer is refused; dq, dk and dv interleaved in a packed one are
  // not, and give the bits of separate buffers.
  const Tensor q = random_tensor(DType::f32, {1, 2, 5, 8}, 1, 0), k = random_tensor(DType::f32, {1, 2, 6, 8}, 1, 1),
               v = random_tensor(DType::f32, {1, 2, 6, 8}, 1, 2), dout = random_tensor(DType::f32, {1, 2, 5, 8}, 1, 3);
  Tensor o(DType::f32, {1, 2, 5, 8}), lse(DType::f32, {1, 2, 5}), dq(DType::f32, {1, 2, 5, 8}),
      dk(DType::f32, {1, 2, 6, 8}), dv(DType::f32, {1, 2, 6, 8});
  forward(q.view(), k.view(), v.view(), {o.view(), lse.view()});
  try {
    backward(q.view(), k.view(), v.view(), o.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dk.view()});
    ADD_FAILURE() << "dk and dv in one buffer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dk, dv: outputs share memory"), std::string::npos) << e.what();
  }
  backward(q.view(), k.view(), v.view(), o.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()});
  Tensor packed(DType::f32, {6, 3, 2, 8});  // [N, 3 (q, k, v), H, d], B = 1: 5 rows for dq, 6 for dk and dv
  const auto slot = [&](int which, std::int64_t n) {
    return TensorView::strided(packed.as<float>() + which * 16, DType::f32, {1, 2, n, 8}, {6 * 48, 8, 48, 1});
  };
  backward(q.view(), k.view(), v.view(), o.view(), lse.view(), dout.view(), {slot(0, 5), slot(1, 6), slot(2, 6)});
  for (const auto& [which, want] : {std::pair{0, &dq}, {1, &dk}, {2, &dv}}) {
    const TensorView got = slot(which, want->view().shape[2]);
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t n = 0; n < got.shape[2]; ++n)
        for (std::int64_t c = 0; c < 8; ++c)
          ASSERT_EQ(static_cast<const float*>(got.data)[h * 8 + n * 48 + c],
                    want->as<float>()[(h * got.shape[2] + n) * 8 + c])
              << which << " " << h << " " << n << " " << c;
  }
}
// dout has the inputs' dtype (bfloat16 calls copy it to float32 as they copy q, k, v: bf16_as_float.h).
TEST(Validation, BackwardDoutHasTheInputsDtype) {
  const Tensor q = random_tensor(DType::bf16, {1, 2, 5, 8}, 1, 0), k = random_tensor(DType::bf16, {1, 2, 6, 8}, 1, 1),
               v = random_tensor(DType::bf16, {1, 2, 6, 4}, 1, 2), dout = random_tensor(DType::f32, {1, 2, 5, 4}, 1, 3);
  Tensor out(DType::bf16, {1, 2, 5, 4}), lse(DType::f32, {1, 2, 5}), dq(DType::bf16, {1, 2, 5, 8}),
      dk(DType::bf16, {1, 2, 6, 8}), dv(DType::bf16, {1, 2, 6, 4});
  try {
    backward(q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), {dq.view(), dk.view(), dv.view()});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "dout: dtype must be bfloat16, got float32");
  }
}

}  // namespace
}  // namespace attnscale
