#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

namespace fl {
namespace {

TEST(Tensor, ContiguousStridesAndBytes) {
  Tensor t = make_tensor(nullptr, DType::f32, {3, 4, 5});
  EXPECT_EQ(t.stride[2], 4);
  EXPECT_EQ(t.stride[1], 20);
  EXPECT_EQ(t.stride[0], 80);
  EXPECT_EQ(t.numel(), 60);
  EXPECT_EQ(t.rows(), 12);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 240);
  EXPECT_EQ(t.describe(), "f32[3, 4, 5]");
}

TEST(Tensor, QuantizedRowsArePaddedToWholeBlocks) {
  // K = 704 in HFQ4-G128: 6 groups of 72 bytes = 432 bytes per row (DESIGN §4).
  Tensor t = make_tensor(nullptr, DType::hfq4_g128, {10, 704});
  EXPECT_EQ(t.row_bytes(), 432);
  EXPECT_EQ(t.stride[0], 432);
  EXPECT_EQ(t.stride[1], 0);
  EXPECT_EQ(t.nbytes(), 4320);
  EXPECT_EQ(row_bytes(DType::q8_0, 1), 34);
  EXPECT_EQ(row_bytes(DType::hfq6_g256, 2816), 11 * 200);
}

TEST(Tensor, SliceSelectNarrowReshape) {
  HostTensor h = HostTensor::zeros(DType::f32, {4, 6});
  for (int i = 0; i < 24; ++i) h.ptr<float>()[i] = static_cast<float>(i);
  Tensor rows = h.view.slice(1, 3);
  EXPECT_EQ(rows.dim(0), 2);
  EXPECT_EQ(rows.ptr<float>()[0], 6.0f);
  Tensor row = h.view.select(2);
  EXPECT_EQ(row.ndim, 1);
  EXPECT_EQ(row.ptr<float>()[1], 13.0f);
  Tensor cols = h.view.narrow(1, 2, 3);
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_EQ(cols.stride[0], 24);
  EXPECT_EQ(cols.ptr<float>()[0], 2.0f);
  Tensor r = h.view.reshape({2, 12});
  EXPECT_EQ(r.dim(1), 12);
  EXPECT_THROW(h.view.reshape({5, 5}), Error);
  Tensor q = make_tensor(nullptr, DType::q8_0, {4, 64});
  EXPECT_THROW(q.reshape({8, 32}), Error);  // a packed row must stay whole
  EXPECT_THROW(q.narrow(1, 0, 32), Error);
}

}  // namespace
}  // namespace fl
