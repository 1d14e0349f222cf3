#include "router/transfer_id_source.h"

#include <gtest/gtest.h>

#include <unordered_set>

namespace kvrelay::router {
namespace {

TEST(TransferIdSourceTest, ThirtyTwoLowercaseHexDigitsNeverZero) {
  for (int i = 0; i < 1000; ++i) {
    Result<TransferId> t = NewTransferIdFromOs();
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_FALSE(t->IsZero());
    const std::string s = t->ToString();
    ASSERT_EQ(s.size(), 32u);
    for (char c : s) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << s;
    TransferId back;
    ASSERT_TRUE(TransferId::Parse(s, &back));
    EXPECT_EQ(back, *t);
  }
}

TEST(TransferIdSourceTest, UniqueAndUsesAllBits) {
  std::unordered_set<TransferId> seen;
  uint64_t hi_or = 0, lo_or = 0, hi_and = ~0ull, lo_and = ~0ull;
  for (int i = 0; i < 20000; ++i) {
    Result<TransferId> t = NewTransferIdFromOs();
    ASSERT_TRUE(t.ok());
    EXPECT_TRUE(seen.insert(*t).second) << "duplicate " << t->ToString();
    hi_or |= t->hi;
    lo_or |= t->lo;
    hi_and &= t->hi;
    lo_and &= t->lo;
  }
  // Every bit was seen both set and clear: no half of the id is constant.
  EXPECT_EQ(hi_or, ~0ull);
  EXPECT_EQ(lo_or, ~0ull);
  EXPECT_EQ(hi_and, 0ull);
  EXPECT_EQ(lo_and, 0ull);
}

}  // namespace
}  // namespace kvrelay::router
