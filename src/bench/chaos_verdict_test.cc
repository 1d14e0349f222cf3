// Tests of JudgeChaos: each end condition of a fault case fails the verdict
// on its own, with a reason; cut-off requests pass only when the router is
// the process killed.
#include "bench/chaos_verdict.h"

#include <gtest/gtest.h>

namespace kvrelay {
namespace {

ChaosBounds Bounds() { return ChaosBounds{6, 40, 15, 12}; }

ChaosMeasure Good() {
  ChaosMeasure m;
  m.load.requests = 100;
  m.load.ok = 90;
  m.load.clean_errors = 10;
  m.load.probes = m.load.probes_ok = 4;
  m.recover_s = 1.5;
  EngineEnd p;
  p.name = "prefill0";
  p.reachable = p.idle = true;
  p.blocks_used = 0;
  p.prefill = true;
  p.pulls_received = p.pulls_answered = 80;
  p.max_send_age_s = 5;
  EngineEnd d;
  d.name = "decode0";
  d.reachable = d.idle = true;
  d.blocks_used = 0;
  d.max_load_age_s = 5.5;
  m.engines = {p, d};
  return m;
}

TEST(JudgeChaos, AGoodCasePasses) {
  const ChaosVerdict v = JudgeChaos(Good(), Bounds());
  EXPECT_EQ(v.kind, ChaosVerdict::Kind::kPass) << (v.why.empty() ? "" : v.why[0]);
  EXPECT_EQ(v.affected, 10u);
  EXPECT_EQ(v.failed, 0u);
  EXPECT_EQ(v.blocks_leaked, 0);
}

TEST(JudgeChaos, EachConditionFailsOnItsOwn) {
  auto fails = [](auto mutate) {
    ChaosMeasure m = Good();
    mutate(m);
    const ChaosVerdict v = JudgeChaos(m, Bounds());
    return v.kind == ChaosVerdict::Kind::kFail && v.why.size() == 1;
  };
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.load.failed = 1; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.load.probes_ok = 3; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.engines[1].blocks_used = 0, m.engines[1].idle = false; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.engines[1].max_load_age_s = 6.5; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.engines[0].max_send_age_s = 41; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.engines[0].max_lease_age_s = 12.5; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.engines[0].live_leases = 1; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.engines[0].pulls_answered = 79; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.recover_s = -1; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.recover_s = 16; }));
  EXPECT_TRUE(fails([](ChaosMeasure& m) { m.engines[0].reachable = false; }));
}

// Push mode (lease_bound_s 0): leases are not judged, however old.
TEST(JudgeChaos, LeasesAreJudgedOnlyWithALeaseBound) {
  ChaosMeasure m = Good();
  m.engines[0].max_lease_age_s = 100;
  ChaosBounds push = Bounds();
  push.lease_bound_s = 0;
  EXPECT_EQ(JudgeChaos(m, push).kind, ChaosVerdict::Kind::kPass);
  EXPECT_EQ(JudgeChaos(m, Bounds()).kind, ChaosVerdict::Kind::kFail);
}

TEST(JudgeChaos, LeakedBlocksAreCountedAndFail) {
  ChaosMeasure m = Good();
  m.engines[1].blocks_used = 3;
  const ChaosVerdict v = JudgeChaos(m, Bounds());
  EXPECT_EQ(v.kind, ChaosVerdict::Kind::kFail);
  EXPECT_EQ(v.blocks_leaked, 3);
}

TEST(JudgeChaos, CutOffRequestsPassOnlyWhenTheRouterIsKilled) {
  ChaosMeasure m = Good();
  m.load.failed = m.load.cut_off = 5;
  EXPECT_EQ(JudgeChaos(m, Bounds()).kind, ChaosVerdict::Kind::kFail);
  m.cut_off_allowed = true;
  const ChaosVerdict v = JudgeChaos(m, Bounds());
  EXPECT_EQ(v.kind, ChaosVerdict::Kind::kPass);
  EXPECT_EQ(v.affected, 15u);
  m.load.failed = 6;  // one more that is not a cut-off
  EXPECT_EQ(JudgeChaos(m, Bounds()).kind, ChaosVerdict::Kind::kFail);
}

TEST(JudgeChaos, AFaultThatNeverEndsIsNotJudgedOnRecovery) {
  ChaosMeasure m = Good();
  m.recover_s = -1;
  m.recover_expected = false;
  EXPECT_EQ(JudgeChaos(m, Bounds()).kind, ChaosVerdict::Kind::kPass);
}

TEST(JudgeChaos, SkippedIsNeitherPassNorFail) {
  ChaosMeasure m;
  m.skipped = "nft not installed";
  const ChaosVerdict v = JudgeChaos(m, Bounds());
  EXPECT_EQ(v.kind, ChaosVerdict::Kind::kSkipped);
  EXPECT_EQ(v.Text(), "SKIPPED");
}

}  // namespace
}  // namespace kvrelay
