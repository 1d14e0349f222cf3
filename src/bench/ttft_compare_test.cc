// Tests of CompareTtft: the difference of the two TTFT medians against the
// transfer time the measured bandwidth predicts, and its refusals.
#include "bench/ttft_compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "bench/percentile.h"

namespace kvrelay {
namespace {

TtftSamples Samples() {
  TtftSamples s;
  s.prompt_tokens = 1024;
  s.kv_bytes = 1'000'000'000;  // 1 GB
  s.plain_s = {0.30, 0.10, 0.20};       // p50 0.2
  s.pd_s = {0.45, 0.35, 0.40, 0.50};    // p50 0.425
  s.transfer_s = {0.2, 0.1, 0.3};       // p50 0.2: 5 GB/s
  s.pd_pull_s = {0.5, 0.6};
  s.answer_to_token_s = {0.01};
  return s;
}

TEST(CompareTtft, DifferenceOverPredictedTransfer) {
  Result<TtftComparison> c = CompareTtft(Samples(), 1.25);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->plain_p50_s, 0.2);
  EXPECT_DOUBLE_EQ(c->pd_p50_s, 0.425);
  EXPECT_NEAR(c->difference_s, 0.225, 1e-12);
  EXPECT_DOUBLE_EQ(c->transfer_p50_s, 0.2);
  EXPECT_NEAR(c->bandwidth_gbps, 5.0, 1e-12);
  EXPECT_NEAR(c->predicted_s, 0.2, 1e-12);  // the bytes at the measured bandwidth
  EXPECT_NEAR(c->ratio, 1.125, 1e-9);
  EXPECT_TRUE(c->met);
  EXPECT_EQ(c->plain_n, 3u);
  EXPECT_EQ(c->pd_n, 4u);
  EXPECT_EQ(c->transfer_n, 3u);
  EXPECT_DOUBLE_EQ(c->pd_pull_p50_s, 0.55);
  EXPECT_DOUBLE_EQ(c->answer_to_token_p50_s, 0.01);
  EXPECT_EQ(c->until_answer_difference_s, 0);  // answer_to_token_s does not pair with pd_s
}

TEST(CompareTtft, UntilAnswerPairsEachRequest) {
  TtftSamples s = Samples();
  s.answer_to_token_s = {0.15, 0.05, 0.10, 0.20};  // pd − it: 0.30 0.30 0.30 0.30
  Result<TtftComparison> c = CompareTtft(s, 1.25);
  ASSERT_TRUE(c.ok());
  EXPECT_NEAR(c->until_answer_difference_s, 0.30 - 0.2, 1e-12);
}

TEST(CompareTtft, MissedAboveTheTarget) {
  Result<TtftComparison> c = CompareTtft(Samples(), 1.1);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->met);
  EXPECT_DOUBLE_EQ(c->target_ratio, 1.1);
}

TEST(CompareTtft, PdFasterThanPlainIsANegativeRatioAndMet) {
  TtftSamples s = Samples();
  s.pd_s = {0.1};
  Result<TtftComparison> c = CompareTtft(s, 1.25);
  ASSERT_TRUE(c.ok());
  EXPECT_LT(c->ratio, 0);
  EXPECT_TRUE(c->met);
}

TEST(CompareTtft, BreakdownIsOptional) {
  TtftSamples s = Samples();
  s.pd_pull_s.clear();
  s.answer_to_token_s.clear();
  Result<TtftComparison> c = CompareTtft(s, 1.25);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pd_pull_p50_s, 0);
  EXPECT_EQ(c->answer_to_token_p50_s, 0);
}

TEST(CompareTtft, RefusesWhatCannotBeCompared) {
  auto refused = [](TtftSamples s, double target = 1.25) {
    Result<TtftComparison> c = CompareTtft(s, target);
    return !c.ok() && c.status().code() == StatusCode::kInvalidArgument;
  };
  TtftSamples s = Samples();
  s.plain_s.clear();
  EXPECT_TRUE(refused(s));
  s = Samples();
  s.pd_s.clear();
  EXPECT_TRUE(refused(s));
  s = Samples();
  s.transfer_s.clear();
  EXPECT_TRUE(refused(s));
  s = Samples();
  s.transfer_s = {0, 0, 0};
  EXPECT_TRUE(refused(s));
  s = Samples();
  s.kv_bytes = 0;
  EXPECT_TRUE(refused(s));
  s = Samples();
  s.pd_s.push_back(-1);
  EXPECT_TRUE(refused(s));
  s = Samples();
  s.answer_to_token_s.push_back(std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(refused(s));
  EXPECT_TRUE(refused(Samples(), 0));
  EXPECT_TRUE(refused(Samples(), std::nan("")));
}

TEST(CompareTtft, StreamedAgainstWhole) {
  TtftSamples s = Samples();          // plain p50 0.2, difference 0.225, predicted 0.2
  s.chunk_tokens = 400;               // 1024 tokens: chunks of 400, 400, 224
  s.streamed_s = {0.25, 0.26, 0.24};  // p50 0.25: difference 0.05
  Result<TtftComparison> c = CompareTtft(s, 1.25);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->streamed_n, 3u);
  EXPECT_EQ(c->chunks, 3u);
  EXPECT_DOUBLE_EQ(c->streamed_p50_s, 0.25);
  EXPECT_NEAR(c->streamed_difference_s, 0.05, 1e-12);
  EXPECT_NEAR(c->streamed_ratio, 0.25, 1e-9);
  EXPECT_NEAR(c->over_whole, 0.05 / 0.225, 1e-9);
  EXPECT_NEAR(c->last_chunk_predicted_s, 0.2 * 224 / 1024, 1e-12);
  EXPECT_TRUE(c->stream_goal_met);    // 0.22 ≤ 0.25
  EXPECT_FALSE(CompareTtft(s, 1.25, 0.2)->stream_goal_met);

  s.streamed_s = {0.1};               // faster than plain: nothing left to hide
  EXPECT_TRUE(CompareTtft(s, 1.25)->stream_goal_met);
  s.chunk_tokens = 1024;              // one chunk: nothing was streamed
  EXPECT_FALSE(CompareTtft(s, 1.25)->stream_goal_met);
  EXPECT_EQ(CompareTtft(s, 1.25)->chunks, 1u);

  s = Samples();
  s.pd_s = {0.1};                     // whole difference ≤ 0: no share to take
  s.chunk_tokens = 400;
  s.streamed_s = {0.3};
  EXPECT_EQ(CompareTtft(s, 1.25)->over_whole, -1);
  EXPECT_FALSE(CompareTtft(s, 1.25)->stream_goal_met);
}

TEST(CompareTtft, WithoutStreamedSamplesTheirFiguresStayZero) {
  Result<TtftComparison> c = CompareTtft(Samples(), 1.25);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->streamed_n, 0u);
  EXPECT_EQ(c->over_whole, 0);
  EXPECT_FALSE(c->stream_goal_met);
}

TEST(CompareTtft, RefusesStreamedSamplesItCannotRead) {
  TtftSamples s = Samples();
  s.streamed_s = {0.3};               // no chunk size
  EXPECT_EQ(CompareTtft(s, 1.25).status().code(), StatusCode::kInvalidArgument);
  s.chunk_tokens = 256;
  EXPECT_EQ(CompareTtft(s, 1.25, 0).status().code(), StatusCode::kInvalidArgument);
  s.streamed_s = {-0.1};
  EXPECT_EQ(CompareTtft(s, 1.25).status().code(), StatusCode::kInvalidArgument);
}

TEST(Percentile, InterpolatesBetweenNeighbours) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_DOUBLE_EQ(Percentile({3, 1, 2}, 0.5), 2);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 1), 4);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4}, 0), 1);
}

}  // namespace
}  // namespace kvrelay
