#include "engine/sampling.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <vector>

namespace kvrelay::engine {
namespace {

TEST(SamplingTest, GreedyIsTheHighestLogitTiesToTheLowerId) {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(SampleToken(l, Sampling{}, 0), 1u);
  EXPECT_EQ(SampleToken(l, Sampling{0.0f, 99}, 7), 1u);
  EXPECT_EQ(SampleToken(l, Sampling{-1.0f, 99}, 7), 1u);
}

RC_GTEST_PROP(SamplingProp, ASeededDrawDependsOnSeedAndPositionOnly,
              (uint64_t seed, uint32_t position)) {
  std::vector<float> l(64);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  const Sampling s{0.8f, seed};
  const Token a = SampleToken(l, s, position);
  RC_ASSERT(a < l.size());
  RC_ASSERT(SampleToken(l, s, position) == a);
}

TEST(SamplingTest, DrawsFollowTheSoftmax) {
  // Two tokens, logits 0 and ln 3 at temperature 1: 1/4 and 3/4.
  const std::vector<float> l = {0.0f, std::log(3.0f)};
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    ones += SampleToken(l, Sampling{1.0f, static_cast<uint64_t>(i)}, 5) == 1 ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.02);
  // A low temperature is nearly greedy; a high one nearly uniform.
  ones = 0;
  for (int i = 0; i < n; ++i) {
    ones += SampleToken(l, Sampling{0.05f, static_cast<uint64_t>(i)}, 5) == 1 ? 1 : 0;
  }
  EXPECT_GT(ones, n * 99 / 100);
  ones = 0;
  for (int i = 0; i < n; ++i) {
    ones += SampleToken(l, Sampling{100.0f, static_cast<uint64_t>(i)}, 5) == 1 ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.5, 0.02);
}

TEST(SamplingTest, PositionsDrawIndependently) {
  std::vector<float> l(1000, 0.0f);  // uniform
  int same = 0;
  for (uint32_t p = 0; p < 200; ++p) {
    same += SampleToken(l, Sampling{1.0f, 42}, p) == SampleToken(l, Sampling{1.0f, 42}, p + 1);
  }
  EXPECT_LT(same, 5);
}

}  // namespace
}  // namespace kvrelay::engine

namespace kvrelay::engine {
namespace {

// A near tie is accepted, anything else is not: greedy by logit distance,
// sampled by the distance of the token's slice from the draw's point.
TEST(SamplingTest, WithinDrawMarginAcceptsOnlyNearTies) {
  std::vector<float> logits = {0.1f, 2.0f, 1.99995f, -3.0f, 1.0f};
  const Sampling greedy{0.0f, 0};
  EXPECT_EQ(SampleToken(logits, greedy, 7), 1u);
  EXPECT_TRUE(WithinDrawMargin(logits, greedy, 7, 1, 1e-3));
  EXPECT_TRUE(WithinDrawMargin(logits, greedy, 7, 2, 1e-3));
  EXPECT_FALSE(WithinDrawMargin(logits, greedy, 7, 2, 1e-5));
  EXPECT_FALSE(WithinDrawMargin(logits, greedy, 7, 4, 1e-3));
  EXPECT_FALSE(WithinDrawMargin(logits, greedy, 7, 9, 1e-3)) << "outside the vocabulary";
  // Sampled: the drawn token is always within; a neighbour only when the
  // draw's point sits at its edge, which a small margin rarely covers and
  // a margin of the whole sum always does.
  const Sampling s{1.0f, 42};
  int neighbours_within = 0;
  for (uint32_t pos = 0; pos < 200; ++pos) {
    const Token t = SampleToken(logits, s, pos);
    EXPECT_TRUE(WithinDrawMargin(logits, s, pos, t, 0.0)) << pos;
    for (Token other = 0; other < logits.size(); ++other) {
      if (other == t) continue;
      EXPECT_TRUE(WithinDrawMargin(logits, s, pos, other, 1.0));
      neighbours_within += WithinDrawMargin(logits, s, pos, other, 1e-3) ? 1 : 0;
    }
  }
  EXPECT_LT(neighbours_within, 10) << "a margin of 1e-3 takes only draws at a slice's edge";
}

}  // namespace
}  // namespace kvrelay::engine
