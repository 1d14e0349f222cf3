// engine_actor_test.cc — the engine actor's loop: what arrives while a
// step's modelled compute runs takes effect then, not after the step.
#include "runtime/engine_actor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/byte_kv_memory.h"
#include "engine/model.h"

namespace kvrelay::runtime {
namespace {

using std::chrono::milliseconds;

class EngineActorTest : public ::testing::Test {
 protected:
  // A plain engine whose every step models `step` of compute.
  void Start(Duration step) {
    engine::EngineOptions o;
    o.role = engine::Role::kPlain;
    ASSERT_TRUE(engine::ModelShapeByName("tiny", &o.shape));
    o.num_blocks = 64;
    o.step_base = step;
    o.step_per_token = Duration::Zero();
    region_.resize(engine::ByteKvMemory::RegionBytes(o.shape, o.num_blocks, engine::kHeadGroups));
    memory_ = std::make_unique<engine::ByteKvMemory>(o.shape, o.num_blocks, 0,
                                                     engine::kHeadGroups, region_);
    actor_ = std::make_unique<EngineActor>(o, memory_.get());
    actor_->Start();
  }
  std::shared_ptr<RequestStream> Submit(uint64_t client) {
    engine::RequestSpec spec;
    spec.client = client;
    for (uint32_t i = 0; i < 8; ++i) spec.prompt.push_back(100 + i);
    spec.max_tokens = 50;
    auto r = actor_->Submit(std::move(spec));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : nullptr;
  }
  // Waits for the first token: the engine is then inside a step's compute
  // (every step lasts the same modelled time).
  static void WaitFirstToken(RequestStream& s) {
    size_t cursor = 0;
    std::vector<engine::TokenOut> out;
    while (out.empty()) ASSERT_FALSE(s.Wait(&cursor, &out, milliseconds(10000)));
  }

  // Starts the engine with `step`-long steps and a first request, and
  // returns once that request's first token arrived (mid-compute).
  std::shared_ptr<RequestStream> StartInsideAStep(Duration step) {
    Start(step);
    auto stream = Submit(1);
    if (stream != nullptr) WaitFirstToken(*stream);
    return stream;
  }
  // True if `s` finished within `timeout`.
  // True once `s` finished (its every token read) within `timeout`; its
  // tokens go to *out. One Wait returns early when tokens arrive, so this
  // waits again until the finish or the timeout.
  static bool Finished(RequestStream& s, milliseconds timeout,
                       std::vector<engine::TokenOut>* out = nullptr) {
    size_t cursor = 0;
    std::vector<engine::TokenOut> got;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (s.Wait(&cursor, &got, std::max(left, milliseconds(0)))) {
        if (out != nullptr) *out = std::move(got);
        return true;
      }
      if (left <= milliseconds(0)) return false;
    }
  }

  std::vector<uint8_t> region_;
  std::unique_ptr<engine::ByteKvMemory> memory_;
  std::unique_ptr<EngineActor> actor_;
};

TEST_F(EngineActorTest, OperationDuringComputeAnswersBeforeTheStepEnds) {
  // Each step models 4 s: an operation that waited for the step's end would
  // take seconds; one applied mid-compute answers in the inbox's wake-up.
  auto stream = StartInsideAStep(Duration::Seconds(4));
  ASSERT_NE(stream, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  const OpResult r = actor_->RunOp(
      [](engine::Engine& e) { return e.AbortRequests({1}, false); }, milliseconds(20000));
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.ok) << r.detail;
  EXPECT_LT(took_s, 2.0) << "the abort waited for the step's compute to end";
  EXPECT_TRUE(Finished(*stream, milliseconds(1000)));
  EXPECT_EQ(stream->reason(), engine::FinishReason::kAborted);
  actor_->Stop();
}

TEST_F(EngineActorTest, RequestDuringComputeIsAcceptedAtOnce) {
  // A request that arrives mid-compute is accepted at once (Submit does not
  // wait for the step's end) and runs at the next step.
  auto first = StartInsideAStep(Duration::Seconds(2));
  ASSERT_NE(first, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  auto second = Submit(2);
  ASSERT_NE(second, nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000)) << "Submit waited";
  WaitFirstToken(*second);
  actor_->Stop();
}

TEST_F(EngineActorTest, StopDuringComputeFinishesOpenRequests) {
  auto stream = StartInsideAStep(Duration::Seconds(4));
  ASSERT_NE(stream, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  actor_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_TRUE(Finished(*stream, milliseconds(0)));
  EXPECT_EQ(stream->reason(), engine::FinishReason::kError);
}

TEST_F(EngineActorTest, StepCountersAddUpEveryStep) {
  // Steps that model 1 ns each: every step that computed counts 1 ns of
  // modelled time and, its real work taking longer, one overrun.
  Start(Duration::Nanoseconds(1));
  auto stream = Submit(1);
  ASSERT_NE(stream, nullptr);
  std::vector<engine::TokenOut> out;
  ASSERT_TRUE(Finished(*stream, milliseconds(10000), &out)) << "the request did not finish";
  EXPECT_EQ(stream->reason(), engine::FinishReason::kLength);
  EXPECT_EQ(out.size(), 50u);
  actor_->Stop();
  const StepCounters& c = actor_->step_counters();
  // One prefill step and one step per further token (50 tokens).
  EXPECT_GE(c.modelled_ns.load(), 50u);
  EXPECT_GE(c.steps.load(), c.modelled_ns.load());
  EXPECT_EQ(c.overruns.load(), c.modelled_ns.load());
  EXPECT_GT(c.work_ns.load(), c.modelled_ns.load());
}

}  // namespace
}  // namespace kvrelay::runtime
