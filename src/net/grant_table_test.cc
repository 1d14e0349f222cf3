#include "net/grant_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kvrelay::net {
namespace {

constexpr TransferId kA{1, 2};
constexpr TransferId kB{3, 4};

// What holds for both tables (the write direction's GrantTable and the read
// direction's ReadGrantTable).
template <typename Table>
class BothGrantTables : public testing::Test {};
using GrantTableTypes = testing::Types<GrantTable, ReadGrantTable>;
TYPED_TEST_SUITE(BothGrantTables, GrantTableTypes);

TYPED_TEST(BothGrantTables, NothingIsGrantedAtFirst) {
  TypeParam t(8);
  EXPECT_FALSE(t.Allows(kA, 0, 0));
  EXPECT_FALSE(t.Allows(kA, 0, 7));
}

TYPED_TEST(BothGrantTables, GrantAllowsExactlyTheGrantedBlocksToThatTransfer) {
  TypeParam t(8);
  const std::vector<uint32_t> blocks = {2, 3, 4, 6};
  t.Grant(kA, blocks);
  EXPECT_TRUE(t.Allows(kA, 2, 4));
  EXPECT_TRUE(t.Allows(kA, 6, 6));
  EXPECT_TRUE(t.Allows(kA, 3, 3));
  EXPECT_FALSE(t.Allows(kA, 2, 6));  // 5 is not granted
  EXPECT_FALSE(t.Allows(kA, 1, 2));
  EXPECT_FALSE(t.Allows(kB, 2, 2));  // another transfer
}

TYPED_TEST(BothGrantTables, RevokeRemovesOnlyThatTransfersGrant) {
  TypeParam t(8);
  t.Grant(kA, std::vector<uint32_t>{0, 1, 2});
  t.Revoke(kA, std::vector<uint32_t>{1});
  EXPECT_TRUE(t.Allows(kA, 0, 0));
  EXPECT_FALSE(t.Allows(kA, 1, 1));
  EXPECT_TRUE(t.Allows(kA, 2, 2));
  // Revoking as another transfer leaves the grant alone.
  t.Revoke(kB, std::vector<uint32_t>{0, 2});
  EXPECT_TRUE(t.Allows(kA, 0, 0));
  EXPECT_TRUE(t.Allows(kA, 2, 2));
}

TEST(GrantTableTest, ALaterGrantReplacesAnEarlierOne) {
  GrantTable t(4);
  t.Grant(kA, std::vector<uint32_t>{1, 2});
  t.Grant(kB, std::vector<uint32_t>{2});
  EXPECT_TRUE(t.Allows(kA, 1, 1));
  EXPECT_FALSE(t.Allows(kA, 2, 2));
  EXPECT_TRUE(t.Allows(kB, 2, 2));
  // A's late revoke does not take B's block.
  t.Revoke(kA, std::vector<uint32_t>{1, 2});
  EXPECT_FALSE(t.Allows(kA, 1, 1));
  EXPECT_TRUE(t.Allows(kB, 2, 2));
}

TYPED_TEST(BothGrantTables, OutOfRangeBlocksAreIgnoredAndNeverAllowed) {
  TypeParam t(4);
  t.Grant(kA, std::vector<uint32_t>{3, 4, 1000, UINT32_MAX});
  EXPECT_TRUE(t.Allows(kA, 3, 3));
  EXPECT_FALSE(t.Allows(kA, 4, 4));
  EXPECT_FALSE(t.Allows(kA, 3, 4));
  EXPECT_FALSE(t.Allows(kA, 3, UINT32_MAX));
  t.Revoke(kA, std::vector<uint32_t>{UINT32_MAX});  // no effect, no crash
  EXPECT_TRUE(t.Allows(kA, 3, 3));
  // An inverted range is never allowed.
  EXPECT_FALSE(t.Allows(kA, 3, 2));
  TypeParam empty(0);
  empty.Grant(kA, std::vector<uint32_t>{0});
  EXPECT_FALSE(empty.Allows(kA, 0, 0));
}

TYPED_TEST(BothGrantTables, TheZeroTransferIsNeverAllowed) {
  TypeParam t(4);
  t.Grant(TransferId{}, std::vector<uint32_t>{0, 1, 2, 3});
  EXPECT_FALSE(t.Allows(TransferId{}, 0, 0));
  EXPECT_FALSE(t.Allows(TransferId{}, 0, 3));
}

TYPED_TEST(BothGrantTables, ClearRevokesEverything) {
  TypeParam t(4);
  t.Grant(kA, std::vector<uint32_t>{0, 1});
  t.Grant(kB, std::vector<uint32_t>{2, 3});
  t.Clear();
  EXPECT_FALSE(t.Allows(kA, 0, 0));
  EXPECT_FALSE(t.Allows(kB, 3, 3));
}

TYPED_TEST(BothGrantTables, ConcurrentGrantRevokeAndChecksAgree) {
  // Each thread owns its own blocks: whatever the interleaving, a thread
  // sees its own grants and never another's.
  constexpr uint32_t kThreads = 4;
  constexpr uint32_t kPerThread = 16;
  TypeParam t(kThreads * kPerThread);
  std::atomic<uint64_t> wrong{0};
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const TransferId me{i + 1, 7};
      std::vector<uint32_t> mine;
      for (uint32_t b = 0; b < kPerThread; ++b) mine.push_back(i * kPerThread + b);
      for (int round = 0; round < 2000; ++round) {
        t.Grant(me, mine);
        if (!t.Allows(me, mine.front(), mine.back())) ++wrong;
        const uint32_t other = ((i + 1) % kThreads) * kPerThread;
        if (t.Allows(me, other, other)) ++wrong;
        t.Revoke(me, mine);
        if (t.Allows(me, mine.front(), mine.front())) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0u);
}

TEST(ReadGrantTableTest, SeveralTransfersMayReadOneBlock) {
  // Two requests share prefix-cache blocks 1 and 2 on P.
  ReadGrantTable t(8);
  t.Grant(kA, std::vector<uint32_t>{0, 1, 2});
  t.Grant(kB, std::vector<uint32_t>{1, 2, 3});
  EXPECT_TRUE(t.Allows(kA, 0, 2));
  EXPECT_TRUE(t.Allows(kB, 1, 3));
  EXPECT_FALSE(t.Allows(kA, 3, 3));
  EXPECT_FALSE(t.Allows(kB, 0, 0));
  // A's transfer ends: B still reads the shared blocks.
  t.Revoke(kA, std::vector<uint32_t>{0, 1, 2});
  EXPECT_FALSE(t.Allows(kA, 1, 1));
  EXPECT_TRUE(t.Allows(kB, 1, 3));
  EXPECT_EQ(t.transfers(), 1u);
}

TEST(ReadGrantTableTest, GrantsAddUpAndRangesNeedEveryBlock) {
  ReadGrantTable t(16);
  t.Grant(kA, std::vector<uint32_t>{7, 3, 3, 5});  // unsorted, repeated
  t.Grant(kA, std::vector<uint32_t>{4, 6});
  EXPECT_TRUE(t.Allows(kA, 3, 7));
  EXPECT_TRUE(t.Allows(kA, 5, 5));
  EXPECT_FALSE(t.Allows(kA, 2, 7));
  EXPECT_FALSE(t.Allows(kA, 3, 8));
  t.Revoke(kA, std::vector<uint32_t>{5, 9});  // 9 was never granted
  EXPECT_TRUE(t.Allows(kA, 3, 4));
  EXPECT_FALSE(t.Allows(kA, 3, 7));
  EXPECT_TRUE(t.Allows(kA, 6, 7));
  EXPECT_FALSE(t.Allows(kA, 0, UINT32_MAX));
}

TEST(ReadGrantTableTest, RevokeAllAndEmptyGrantsLeaveNoEntry) {
  ReadGrantTable t(4);
  t.Grant(kA, std::vector<uint32_t>{0, 1});
  t.Grant(kB, std::vector<uint32_t>{9});  // nothing in range: no entry
  EXPECT_EQ(t.transfers(), 1u);
  t.RevokeAll(kA);
  EXPECT_FALSE(t.Allows(kA, 0, 0));
  EXPECT_EQ(t.transfers(), 0u);
  t.Grant(kA, std::vector<uint32_t>{2});
  t.Revoke(kA, std::vector<uint32_t>{2});
  EXPECT_EQ(t.transfers(), 0u);
}

}  // namespace
}  // namespace kvrelay::net
