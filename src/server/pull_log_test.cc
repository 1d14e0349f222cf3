#include "server/pull_log.h"

#include <gtest/gtest.h>

namespace kvrelay::server {
namespace {

PullSample Sample(uint64_t lo) {
  PullSample s;
  s.transfer = TransferId{0, lo};
  return s;
}

TEST(PullLogTest, NumbersSamplesAndReturnsThoseAfterASeq) {
  PullLog log(10);
  for (uint64_t i = 1; i <= 5; ++i) log.Add(Sample(i));
  EXPECT_EQ(log.last_seq(), 5u);
  auto all = log.Since(0, 100);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all.front().seq, 1u);
  EXPECT_EQ(all.back().transfer.lo, 5u);
  auto tail = log.Since(3, 100);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].seq, 4u);
  EXPECT_TRUE(log.Since(5, 100).empty());
  EXPECT_EQ(log.Since(0, 2).size(), 2u);
}

TEST(PullLogTest, KeepsOnlyTheNewestCapacitySamples) {
  PullLog log(3);
  for (uint64_t i = 1; i <= 7; ++i) log.Add(Sample(i));
  auto all = log.Since(0, 100);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].seq, 5u);   // 1..4 dropped; a reader learns it missed them
  EXPECT_EQ(all[2].seq, 7u);
  EXPECT_EQ(log.Since(5, 100).size(), 2u);
}

TEST(PullLogTest, EmptyLogHasNothing) {
  PullLog log;
  EXPECT_EQ(log.last_seq(), 0u);
  EXPECT_TRUE(log.Since(0, 10).empty());
}

}  // namespace
}  // namespace kvrelay::server
