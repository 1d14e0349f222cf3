#include "base/status.h"

#include <gtest/gtest.h>

#include "base/result.h"

namespace kvrelay {
namespace {

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = NotFoundError("transfer 12");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: transfer 12");
}

TEST(ResultTest, ValueAndError) {
  Result<int> r = 7;
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 7);
  Result<int> e = ResourceExhaustedError("pool full");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
  EXPECT_DEATH((void)e.value(), "value\\(\\) of an error Result");
}

}  // namespace
}  // namespace kvrelay
