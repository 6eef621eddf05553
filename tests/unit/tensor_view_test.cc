// TensorView's own functions on views of any rank a caller may build by hand.
#include <gtest/gtest.h>

#include "attnscale/tensor.h"

namespace attnscale {
namespace {

TEST(TensorView, ShapeStrOfARankBeyondTheShapeReadsNoDimension) {
  float x[4] = {};
  TensorView v = TensorView::contiguous(x, DType::f32, {2, 5, 8, 3});
  EXPECT_EQ(v.shape_str(), "[2, 5, 8, 3]");
  v.rank = 5;  // shape holds kMaxRank = 4 dimensions
  EXPECT_EQ(v.shape_str(), "[rank 5?]");
  v.rank = -1;
  EXPECT_EQ(v.shape_str(), "[rank -1?]");
  v.rank = 0;
  EXPECT_EQ(v.shape_str(), "[]");
}

}  // namespace
}  // namespace attnscale
