// engine_stream_test.cc — a prefill engine with stream_chunks: what it
// hands its connector chunk by chunk (ProgressOp, then ReadyOp), and when
// it frees a streamed request's blocks — never while a rank may still
// write from them: not at an abort, not at a preemption, only once every
// rank reported the send finished.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/prng.h"
#include "base/time.h"
#include "engine/emulated_model.h"
#include "engine/engine.h"

namespace kvrelay::engine {
namespace {

// One digest per (block, group); no checks: the emulated model's KV.
class Memory final : public KvMemory {
 public:
  void Write(BlockId b, uint32_t group, uint64_t digest) override {
    content_[{b.index, group}] = digest;
  }
  uint64_t Read(BlockId b, uint32_t group) const override {
    auto it = content_.find({b.index, group});
    return it == content_.end() ? 0 : it->second;
  }
  void OnAllocate(BlockId, TransferId) override {}
  void OnFree(BlockId b) override {
    for (uint32_t g = 0; g < kHeadGroups; ++g) content_.erase({b.index, g});
  }
  void OnReset() override { content_.clear(); }

 private:
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> content_;
};

// The emulated model, except that its KV is not in the blocks as computed
// (as llama.cpp's is not): such an engine hands off whole.
class KeepsOwnKv final : public ComputeModel {
 public:
  KeepsOwnKv(const ModelShape& shape, KvMemory* memory) : inner_(shape, memory) {}
  void Run(std::span<const SeqWork> batch, uint64_t v, std::span<Token> out) override {
    inner_.Run(batch, v, out);
  }
  void Forget(uint64_t key) override { inner_.Forget(key); }
  void ForgetAll() override { inner_.ForgetAll(); }
  Status Reside(const Residency& want) override { return inner_.Reside(want); }
  bool SharesBlocks() const override { return false; }
  uint32_t vocab() const override { return inner_.vocab(); }
  std::string Describe() const override { return "keeps its own KV"; }

 private:
  EmulatedModel inner_;
};

constexpr uint32_t kPrompt = 18;  // 5 blocks of the tiny shape's 4 tokens
constexpr uint32_t kBlocks = 5;
const TransferId kT{0xabcULL, 1};

EngineOptions ProducerOptions(bool stream) {
  EngineOptions o;
  o.role = Role::kProducer;
  KV_CHECK(ModelShapeByName("tiny", &o.shape));
  o.max_batch_tokens = 8;  // two blocks a step: the prompt takes three chunks
  o.prefix_caching = false;
  o.stream_chunks = stream;
  return o;
}

class Producer {
 public:
  explicit Producer(bool stream, bool keeps_own_kv = false) {
    if (keeps_own_kv) model_ = std::make_unique<KeepsOwnKv>(ProducerOptions(stream).shape, &memory_);
    engine_ = std::make_unique<Engine>(ProducerOptions(stream), &memory_, model_.get());
    RequestSpec spec;
    spec.client = 1;
    for (uint32_t i = 0; i < kPrompt; ++i) spec.prompt.push_back(static_cast<Token>(Mix64(i) % 1000));
    spec.max_tokens = 1;
    spec.kv.transfer = kT;
    spec.kv.do_remote_decode = true;
    KV_CHECK(engine_->AddRequest(std::move(spec), now_).ok());
  }
  Engine& engine() { return *engine_; }
  // One step (with `report` from rank 0 if given); returns its metadata.
  ConnectorMetadata Step(std::optional<RankReport> report = std::nullopt) {
    std::vector<RankReport> reports;
    if (report) reports.push_back(*report);
    now_ = now_ + Duration::Milliseconds(1);
    engine_->Step(reports, now_);
    return Drain();
  }
  ConnectorMetadata Control() {
    engine_->Control();
    return Drain();
  }
  static RankReport SendFinished() {
    RankReport r;
    r.finished_sending.push_back(kT);
    return r;
  }
  std::optional<FinishReason> done;
  size_t held_blocks() const { return engine_->pool().num_referenced(); }

 private:
  ConnectorMetadata Drain() {
    ConnectorMetadata out;
    while (auto a = engine_->PollAction()) {
      if (auto* m = std::get_if<MetadataOut>(&*a)) {
        for (auto& p : m->meta.progress) out.progress.push_back(p);
        for (auto& r : m->meta.readies) out.readies.push_back(r);
        for (auto& x : m->meta.aborts) out.aborts.push_back(x);
        for (auto& c : m->meta.claims) out.claims.push_back(c);
      } else if (auto* d = std::get_if<RequestDone>(&*a)) {
        done = d->reason;
      }
    }
    engine_->CheckInvariants();
    return out;
  }

  Memory memory_;
  std::unique_ptr<ComputeModel> model_;
  std::unique_ptr<Engine> engine_;
  Instant now_ = Instant::Epoch();
};

TEST(EngineStreamTest, HandsEachFinishedChunkOverThenTheRestWithTheFirstToken) {
  Producer p(/*stream=*/true);
  ConnectorMetadata m = p.Step();
  ASSERT_EQ(m.claims.size(), 1u);
  ASSERT_EQ(m.progress.size(), 1u);
  EXPECT_TRUE(m.progress[0].first);
  EXPECT_EQ(m.progress[0].blocks.size(), 2u);  // tokens 0..7: two full blocks
  EXPECT_EQ(m.progress[0].total_blocks, kBlocks);
  const std::vector<BlockId> first = m.progress[0].blocks;
  m = p.Step();
  ASSERT_EQ(m.progress.size(), 1u);
  EXPECT_FALSE(m.progress[0].first);
  ASSERT_EQ(m.progress[0].blocks.size(), 4u);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), m.progress[0].blocks.begin()));
  m = p.Step();  // the last two tokens and the first token
  EXPECT_TRUE(m.progress.empty());
  ASSERT_EQ(m.readies.size(), 1u);
  EXPECT_TRUE(m.readies[0].streamed);
  EXPECT_EQ(m.readies[0].blocks.size(), kBlocks);
  EXPECT_NE(m.readies[0].first_token, kNoFirstToken);
  EXPECT_EQ(p.done, FinishReason::kLength);
  EXPECT_EQ(p.held_blocks(), kBlocks);  // until every rank is done
  p.Step(Producer::SendFinished());
  EXPECT_EQ(p.held_blocks(), 0u);
  EXPECT_TRUE(p.engine().Idle());
}

TEST(EngineStreamTest, WithoutStreamingItHandsOffWhole) {
  Producer p(/*stream=*/false);
  EXPECT_TRUE(p.Step().progress.empty());
  EXPECT_TRUE(p.Step().progress.empty());
  ConnectorMetadata m = p.Step();
  ASSERT_EQ(m.readies.size(), 1u);
  EXPECT_FALSE(m.readies[0].streamed);
}

TEST(EngineStreamTest, AModelKeepingItsOwnKvHandsOffWhole) {
  Producer p(/*stream=*/true, /*keeps_own_kv=*/true);
  EXPECT_TRUE(p.Step().progress.empty());
  EXPECT_TRUE(p.Step().progress.empty());
  ConnectorMetadata m = p.Step();
  ASSERT_EQ(m.readies.size(), 1u);
  EXPECT_FALSE(m.readies[0].streamed);
}

TEST(EngineStreamTest, AnAbortMidStreamEndsTheSendAndKeepsTheBlocksUntilTheRanksAreDone) {
  Producer p(/*stream=*/true);
  p.Step();
  p.engine().AbortRequest(1);
  ConnectorMetadata m = p.Control();
  // Its send ends: the blocks it has are not the prompt's KV.
  EXPECT_TRUE(m.readies.empty());
  ASSERT_EQ(m.aborts.size(), 1u);
  EXPECT_FALSE(m.aborts[0].reset);
  EXPECT_EQ(p.done, FinishReason::kAborted);  // the client learns now
  EXPECT_EQ(p.held_blocks(), kBlocks);        // a chunk write may read them
  p.Step(Producer::SendFinished());
  EXPECT_EQ(p.held_blocks(), 0u);
  EXPECT_TRUE(p.engine().Idle());
}

TEST(EngineStreamTest, ASendTheRanksEndedMidStreamFreesAtTheFinishWithNoReady) {
  Producer p(/*stream=*/true);
  p.Step();
  // D released it (or a deadline passed): every rank reported it finished.
  ConnectorMetadata m = p.Step(Producer::SendFinished());
  EXPECT_TRUE(m.progress.empty());  // no chunk for a send that ended
  m = p.Step();
  EXPECT_TRUE(m.readies.empty());
  EXPECT_EQ(p.done, FinishReason::kLength);
  EXPECT_EQ(p.held_blocks(), 0u);
  EXPECT_TRUE(p.engine().Idle());
}

TEST(EngineStreamTest, APreemptionMidStreamParksTheBlocksAndResetsTheSend) {
  Producer p(/*stream=*/true);
  p.Step();
  p.engine().ResetPrefixCache(/*reset_running_requests=*/true);
  ConnectorMetadata m = p.Control();
  ASSERT_EQ(m.aborts.size(), 1u);
  EXPECT_TRUE(m.aborts[0].reset);  // D recomputes whatever its policy
  EXPECT_EQ(p.held_blocks(), kBlocks);  // parked: a rank may write from them
  EXPECT_FALSE(p.engine().Idle());
  // The request recomputes; its hand-off is over.
  bool ready = false, progress = false;
  for (int i = 0; i < 6 && !p.done; ++i) {
    m = p.Step();
    ready = ready || !m.readies.empty();
    progress = progress || !m.progress.empty();
  }
  EXPECT_EQ(p.done, FinishReason::kLength);
  EXPECT_FALSE(ready);
  EXPECT_FALSE(progress);
  EXPECT_EQ(p.held_blocks(), kBlocks);  // still parked
  p.Step(Producer::SendFinished());
  EXPECT_EQ(p.held_blocks(), 0u);
  EXPECT_TRUE(p.engine().Idle());
  EXPECT_EQ(p.engine().stats().streams_parked, 1u);
}

}  // namespace
}  // namespace kvrelay::engine
