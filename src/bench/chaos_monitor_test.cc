// Tests of the pure parts of the chaos monitor: reading the oldest live
// transfer out of /debug/state, and summing a Prometheus metric.
#include "bench/chaos_monitor.h"

#include <gtest/gtest.h>

namespace kvrelay {
namespace {

TEST(OldestTransfers, TakesTheOldestAcrossRanks) {
  const std::string body = R"({"ranks":[
    {"sends":[{"age_s":1.5},{"age_s":0.2}],"loads":[],"leases":[{"held_s":0.5}]},
    {"sends":[{"age_s":0.7}],"loads":[{"age_s":3.25}],"leases":[{"held_s":2.75}]}]})";
  TransferAges ages;
  ASSERT_TRUE(OldestTransfers(body, &ages));
  EXPECT_DOUBLE_EQ(ages.send_s, 1.5);
  EXPECT_DOUBLE_EQ(ages.load_s, 3.25);
  EXPECT_DOUBLE_EQ(ages.lease_s, 2.75);
  EXPECT_FALSE(OldestTransfers("not json", &ages));
}

TEST(MetricSum, SumsEverySeriesOfExactlyThatName) {
  const std::string text =
      "# HELP kvrelay_pulls_answered_total x\n"
      "kvrelay_pulls_answered_total{outcome=\"ok\"} 7\n"
      "kvrelay_pulls_answered_total{outcome=\"aborted\"} 3\n"
      "kvrelay_pulls_answered_total_other 100\n"
      "kvrelay_pulls_received_total 10\n";
  EXPECT_DOUBLE_EQ(MetricSum(text, "kvrelay_pulls_answered_total"), 10);
  EXPECT_DOUBLE_EQ(MetricSum(text, "kvrelay_pulls_received_total"), 10);
  EXPECT_DOUBLE_EQ(MetricSum(text, "kvrelay_missing"), 0);
}

}  // namespace
}  // namespace kvrelay
