#include "net/grant_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kvrelay::net {
namespace {

constexpr TransferId kA{1, 2};
constexpr TransferId kB{3, 4};

TEST(GrantTableTest, NothingIsGrantedAtFirst) {
  GrantTable t(8);
  EXPECT_FALSE(t.Allows(kA, 0, 0));
  EXPECT_FALSE(t.Allows(kA, 0, 7));
}

TEST(GrantTableTest, GrantAllowsExactlyTheGrantedBlocksToThatTransfer) {
  GrantTable t(8);
  const std::vector<uint32_t> blocks = {2, 3, 4, 6};
  t.Grant(kA, blocks);
  EXPECT_TRUE(t.Allows(kA, 2, 4));
  EXPECT_TRUE(t.Allows(kA, 6, 6));
  EXPECT_TRUE(t.Allows(kA, 3, 3));
  EXPECT_FALSE(t.Allows(kA, 2, 6));  // 5 is not granted
  EXPECT_FALSE(t.Allows(kA, 1, 2));
  EXPECT_FALSE(t.Allows(kB, 2, 2));  // another transfer
}

TEST(GrantTableTest, RevokeRemovesOnlyThatTransfersGrant) {
  GrantTable t(8);
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

TEST(GrantTableTest, OutOfRangeBlocksAreIgnoredAndNeverAllowed) {
  GrantTable t(4);
  t.Grant(kA, std::vector<uint32_t>{3, 4, 1000, UINT32_MAX});
  EXPECT_TRUE(t.Allows(kA, 3, 3));
  EXPECT_FALSE(t.Allows(kA, 4, 4));
  EXPECT_FALSE(t.Allows(kA, 3, 4));
  EXPECT_FALSE(t.Allows(kA, 3, UINT32_MAX));
  t.Revoke(kA, std::vector<uint32_t>{UINT32_MAX});  // no effect, no crash
  EXPECT_TRUE(t.Allows(kA, 3, 3));
  // An inverted range is never allowed.
  EXPECT_FALSE(t.Allows(kA, 3, 2));
  GrantTable empty(0);
  empty.Grant(kA, std::vector<uint32_t>{0});
  EXPECT_FALSE(empty.Allows(kA, 0, 0));
}

TEST(GrantTableTest, TheZeroTransferIsNeverAllowed) {
  GrantTable t(4);
  t.Grant(TransferId{}, std::vector<uint32_t>{0, 1, 2, 3});
  EXPECT_FALSE(t.Allows(TransferId{}, 0, 0));
  EXPECT_FALSE(t.Allows(TransferId{}, 0, 3));
}

TEST(GrantTableTest, ClearRevokesEverything) {
  GrantTable t(4);
  t.Grant(kA, std::vector<uint32_t>{0, 1});
  t.Grant(kB, std::vector<uint32_t>{2, 3});
  t.Clear();
  EXPECT_FALSE(t.Allows(kA, 0, 0));
  EXPECT_FALSE(t.Allows(kB, 3, 3));
}

TEST(GrantTableTest, ConcurrentGrantRevokeAndChecksAgree) {
  // Each thread owns its own blocks: whatever the interleaving, a thread
  // sees its own grants and never another's.
  constexpr uint32_t kThreads = 4;
  constexpr uint32_t kPerThread = 16;
  GrantTable t(kThreads * kPerThread);
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

}  // namespace
}  // namespace kvrelay::net
