#include "net/stripe_plan.h"

#include <gtest/gtest.h>

#include <vector>

#include "base/prng.h"

namespace kvrelay::net {
namespace {

// (src, dst) of every byte a segment list moves, in order.
std::vector<std::pair<uint64_t, uint64_t>> Bytes(std::span<const Segment> segments) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const Segment& s : segments) {
    for (uint64_t b = 0; b < s.bytes; ++b) out.emplace_back(s.src_offset + b, s.dst_offset + b);
  }
  return out;
}

TEST(StripePlanTest, SmallWritesStayOnOneStream) {
  constexpr uint64_t kMin = 8 << 20;
  EXPECT_EQ(StripeCount(0, 4, kMin), 1u);
  EXPECT_EQ(StripeCount(2 * kMin - 1, 4, kMin), 1u);
  EXPECT_EQ(StripeCount(2 * kMin, 4, kMin), 2u);
  EXPECT_EQ(StripeCount(3 * kMin + 5, 4, kMin), 3u);
  EXPECT_EQ(StripeCount(100 * kMin, 4, kMin), 4u);
  EXPECT_EQ(StripeCount(100 * kMin, 1, kMin), 1u);
  EXPECT_EQ(StripeCount(100 * kMin, 0, kMin), 1u);
}

TEST(StripePlanTest, StripesConcatenateToTheWriteAndCutOnPages) {
  Prng prng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<Segment> segs;
    const int n = 1 + static_cast<int>(prng.Next64() % 12);
    uint64_t src = 0, dst = 1 << 20;
    for (int i = 0; i < n; ++i) {
      // Some empty, some tiny, some spanning several pages.
      const uint64_t bytes = prng.Next64() % 4 == 0 ? 0 : prng.Next64() % (5 * kStripeAlignBytes);
      segs.push_back(Segment{src, dst, bytes});
      src += bytes + 64;
      dst += bytes + 4096;
    }
    const uint32_t k = 1 + static_cast<uint32_t>(prng.Next64() % 5);
    const auto stripes = SplitIntoStripes(segs, k);
    ASSERT_EQ(stripes.size(), k);
    std::vector<Segment> joined;
    uint64_t at = 0, total = 0;
    for (const Segment& s : segs) total += s.bytes;
    for (uint32_t j = 0; j < k; ++j) {
      for (const Segment& s : stripes[j]) {
        EXPECT_GT(s.bytes, 0u);
        joined.push_back(s);
      }
      uint64_t bytes = 0;
      for (const Segment& s : stripes[j]) bytes += s.bytes;
      at += bytes;
      if (j + 1 < k) {
        EXPECT_EQ(at % kStripeAlignBytes, 0u) << "round " << round;
      }
      if (total >= uint64_t{k} * kStripeAlignBytes && j + 1 < k) {
        // Nearly equal: within a page of an even share.
        EXPECT_LE(at, total * (j + 1) / k);
        EXPECT_GT(at + kStripeAlignBytes, total * (j + 1) / k);
      }
    }
    EXPECT_EQ(at, total);
    EXPECT_EQ(Bytes(joined), Bytes(segs)) << "round " << round;
  }
}

TEST(StripePlanTest, OneLargeSegmentIsCutEvenly) {
  const std::vector<Segment> one{{0, 4096, 64ull << 20}};
  const auto stripes = SplitIntoStripes(one, 4);
  ASSERT_EQ(stripes.size(), 4u);
  for (uint32_t j = 0; j < 4; ++j) {
    ASSERT_EQ(stripes[j].size(), 1u);
    EXPECT_EQ(stripes[j][0], (Segment{j * (16ull << 20), 4096 + j * (16ull << 20), 16ull << 20}));
  }
}

}  // namespace
}  // namespace kvrelay::net
