// engine_test.cc — a plain engine (no transfers) against the emulated model:
// batching, chunked prefill, preemption, prefix caching, validation, and the
// lifecycle operations, plus a random-interleaving property.
#include "engine/engine.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/prng.h"
#include "base/status.h"
#include "base/time.h"

namespace kvrelay::engine {
namespace {

// ---------------------------------------------------------------------------
// An in-test KvMemory: one digest per (block index, group). It tracks which
// block lives are allocated, drops content on free / reset / reallocation,
// and counts reads of missing content and writes into blocks not allocated.

class TestMemory final : public KvMemory {
 public:
  void Write(BlockId b, uint32_t group, uint64_t digest) override {
    auto it = live_.find(b.index);
    if (it == live_.end() || it->second != b.generation) ++bad_writes;
    if (group >= kHeadGroups) ++bad_writes;
    content_[{b.index, group}] = digest;
    if (group == 0) write_order.push_back(b.index);
    ++writes;
  }
  uint64_t Read(BlockId b, uint32_t group) const override {
    ++reads;
    auto it = content_.find({b.index, group});
    if (it == content_.end()) {
      ++bad_reads;
      return 0;
    }
    auto l = live_.find(b.index);
    if (l == live_.end() || l->second != b.generation) ++bad_reads;
    return it->second;
  }
  void OnAllocate(BlockId b, TransferId owner) override {
    ++allocates;
    if (!owner.IsZero()) ++foreign_allocates;
    live_[b.index] = b.generation;
    for (uint32_t g = 0; g < kHeadGroups; ++g) content_.erase({b.index, g});
  }
  void OnFree(BlockId b) override {
    ++frees;
    auto it = live_.find(b.index);
    if (it == live_.end() || it->second != b.generation) ++bad_frees;
    live_.erase(b.index);
    for (uint32_t g = 0; g < kHeadGroups; ++g) content_.erase({b.index, g});
  }
  void OnReset() override {
    ++resets;
    live_.clear();
    content_.clear();
  }

  uint64_t writes = 0;
  std::vector<uint32_t> write_order;  // block index of every group-0 write
  mutable uint64_t reads = 0;
  mutable uint64_t bad_reads = 0;
  uint64_t bad_writes = 0;
  uint64_t bad_frees = 0;
  uint64_t allocates = 0;
  uint64_t foreign_allocates = 0;
  uint64_t frees = 0;
  uint64_t resets = 0;

 private:
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> content_;
  std::map<uint32_t, uint32_t> live_;  // index -> generation of its live
};

ModelShape Tiny() {
  ModelShape s;
  KV_CHECK(ModelShapeByName("tiny", &s));
  return s;
}

EngineOptions PlainOptions() {
  EngineOptions o;
  o.role = Role::kPlain;
  o.shape = Tiny();
  return o;
}

std::vector<Token> MakePrompt(uint64_t seed, uint32_t len) {
  std::vector<Token> out;
  for (uint32_t i = 0; i < len; ++i) {
    out.push_back(static_cast<Token>(Mix64(seed * 1000003 + i + 17) % 32000));
  }
  return out;
}

std::vector<Token> Tokens(const std::vector<TokenOut>& outs) {
  std::vector<Token> v;
  for (const TokenOut& t : outs) v.push_back(t.token);
  return v;
}

// ---------------------------------------------------------------------------
// Harness: drives one engine, collects its actions per client / per op.

class Harness {
 public:
  explicit Harness(const EngineOptions& options)
      : options_(options), engine_(std::make_unique<Engine>(options_, &mem)) {}

  struct Client {
    std::vector<Token> prompt;
    uint32_t max_tokens = 0;
    std::vector<TokenOut> tokens;
    std::vector<RequestDone> dones;
    uint64_t tokens_after_done = 0;
  };

  Engine& engine() { return *engine_; }
  const ModelShape& shape() const { return options_.shape; }

  Status Add(uint64_t client, std::vector<Token> prompt, uint32_t max_tokens) {
    RequestSpec spec;
    spec.client = client;
    spec.prompt = prompt;
    spec.max_tokens = max_tokens;
    Status s = engine_->AddRequest(std::move(spec), now);
    if (s.ok()) {
      Client c;
      c.prompt = std::move(prompt);
      c.max_tokens = max_tokens;
      clients[client] = std::move(c);
    }
    return s;
  }
  void MustAdd(uint64_t client, std::vector<Token> prompt, uint32_t max_tokens) {
    Status s = Add(client, std::move(prompt), max_tokens);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  void Drain() {
    while (std::optional<EngineAction> a = engine_->PollAction()) {
      if (const auto* t = std::get_if<TokenOut>(&*a)) {
        Client& c = clients[t->client];
        if (!c.dones.empty()) ++c.tokens_after_done;
        c.tokens.push_back(*t);
        step_tokens[t->client] += 1;
      } else if (const auto* d = std::get_if<RequestDone>(&*a)) {
        clients[d->client].dones.push_back(*d);
      } else if (const auto* o = std::get_if<OpDone>(&*a)) {
        op_dones[o->op].push_back(*o);
        op_order.push_back(o->op);
      } else if (const auto* m = std::get_if<MetadataOut>(&*a)) {
        ++metadata_outs;
        metas.push_back(m->meta);
      }
    }
  }

  Duration Step() {
    step_tokens.clear();
    std::vector<RankReport> reports;
    std::swap(reports, next_reports);
    const Duration d = engine_->Step(reports, now);
    engine_->CheckInvariants();
    const BlockPool& pool = engine_->pool();
    EXPECT_EQ(pool.num_free() + pool.num_referenced() + pool.num_cached_idle(),
              pool.capacity());
    now = now + (d > Duration::Zero() ? d : Duration::Milliseconds(1));
    ++steps;
    Drain();
    return d;
  }

  bool StepUntil(const std::function<bool()>& pred, int max_steps = 20000) {
    Drain();
    for (int i = 0; i < max_steps; ++i) {
      if (pred()) return true;
      Step();
    }
    return pred();
  }
  bool RunToIdle(int max_steps = 20000) {
    return StepUntil([&] { return engine_->Idle(); }, max_steps);
  }
  void StepN(int n) {
    for (int i = 0; i < n; ++i) Step();
  }

  // Lifecycle wrappers that also drain immediate OpDones.
  uint64_t Resume() {
    const uint64_t id = engine_->Resume();
    Drain();
    return id;
  }
  bool OpDoneSeen(uint64_t op) const { return op_dones.count(op) != 0; }
  const OpDone& Op(uint64_t op) const { return op_dones.at(op).at(0); }
  bool RunUntilOp(uint64_t op, int max_steps = 20000) {
    return StepUntil([&] { return OpDoneSeen(op); }, max_steps);
  }

  bool Finished(uint64_t client) const {
    auto it = clients.find(client);
    return it != clients.end() && !it->second.dones.empty();
  }
  bool AllFinished() const {
    for (const auto& [id, c] : clients) {
      if (c.dones.empty()) return false;
    }
    return true;
  }
  uint64_t TotalTokens() const {
    uint64_t n = 0;
    for (const auto& [id, c] : clients) n += c.tokens.size();
    return n;
  }

  // The request finished with kLength exactly once and its output is the
  // reference output under `version`.
  void ExpectReference(uint64_t client, uint64_t version) const {
    SCOPED_TRACE("client " + std::to_string(client));
    const Client& c = clients.at(client);
    ASSERT_EQ(c.dones.size(), 1u);
    EXPECT_EQ(c.dones[0].reason, FinishReason::kLength);
    EXPECT_EQ(c.tokens_after_done, 0u);
    EXPECT_EQ(Tokens(c.tokens), Reference(c.prompt, version, c.max_tokens, options_.shape));
    for (const TokenOut& t : c.tokens) EXPECT_EQ(t.weights_version, version);
    EXPECT_EQ(CheckOutput(c.prompt, c.tokens, options_.shape), "");
  }
  void ExpectAborted(uint64_t client) const {
    SCOPED_TRACE("client " + std::to_string(client));
    const Client& c = clients.at(client);
    ASSERT_EQ(c.dones.size(), 1u);
    EXPECT_EQ(c.dones[0].reason, FinishReason::kAborted);
    EXPECT_EQ(c.tokens_after_done, 0u);
    EXPECT_LT(c.tokens.size(), c.max_tokens);
    // Whatever it emitted before the abort is still correct.
    EXPECT_EQ(CheckOutput(c.prompt, c.tokens, options_.shape), "");
  }
  void ExpectMemoryClean() const {
    EXPECT_EQ(mem.bad_reads, 0u);
    EXPECT_EQ(mem.bad_writes, 0u);
    EXPECT_EQ(mem.bad_frees, 0u);
    EXPECT_EQ(mem.foreign_allocates, 0u);
  }

  TestMemory mem;
  Instant now = Instant::Epoch();
  uint64_t steps = 0;
  uint64_t metadata_outs = 0;
  std::vector<ConnectorMetadata> metas;   // every MetadataOut, in order
  std::vector<RankReport> next_reports;   // what the next Step() gets
  std::map<uint64_t, Client> clients;
  std::map<uint64_t, std::vector<OpDone>> op_dones;
  std::vector<uint64_t> op_order;
  std::map<uint64_t, uint64_t> step_tokens;  // tokens per client in the last step

 private:
  const EngineOptions options_;
  std::unique_ptr<Engine> engine_;
};

// Adds `n` requests with prompts of 1..20 tokens and 1..12 max tokens.
void AddLoad(Harness& h, uint64_t first_client, int n, uint64_t seed) {
  Prng prng(seed);
  for (int i = 0; i < n; ++i) {
    const uint32_t len = static_cast<uint32_t>(prng.Range(1, 20));
    const uint32_t max = static_cast<uint32_t>(prng.Range(1, 12));
    h.MustAdd(first_client + static_cast<uint64_t>(i), MakePrompt(seed * 977 + i, len), max);
  }
}

// ---------------------------------------------------------------------------
// CheckOutput

TEST(CheckOutputTest, AcceptsReferenceRejectsChanges) {
  const ModelShape s = Tiny();
  const std::vector<Token> p = MakePrompt(1, 9);
  const std::vector<Token> ref = Reference(p, 1, 10, s);
  std::vector<TokenOut> outs;
  for (Token t : ref) outs.push_back(TokenOut{7, t, 1});
  EXPECT_EQ(CheckOutput(p, outs, s), "");
  EXPECT_EQ(CheckOutput(p, std::span<const TokenOut>(), s), "");
  // Wrong version for the same tokens.
  std::vector<TokenOut> v2 = outs;
  for (TokenOut& t : v2) t.weights_version = 2;
  EXPECT_NE(CheckOutput(p, v2, s), "");
  // Any token changed.
  for (size_t k = 0; k < outs.size(); ++k) {
    std::vector<TokenOut> bad = outs;
    bad[k].token = (bad[k].token + 1) % s.vocab;
    EXPECT_NE(CheckOutput(p, bad, s), "") << k;
  }
  // Mixed versions: v1 for the first 4, then what the model gives under v2
  // from the (prompt + first 4) sequence.
  std::vector<Token> seq = p;
  seq.insert(seq.end(), ref.begin(), ref.begin() + 4);
  const std::vector<Token> tail = Reference(seq, 2, 6, s);
  std::vector<TokenOut> mixed(outs.begin(), outs.begin() + 4);
  for (Token t : tail) mixed.push_back(TokenOut{7, t, 2});
  EXPECT_EQ(CheckOutput(p, mixed, s), "");
}

// ---------------------------------------------------------------------------
// 1. Plain engine output equals Reference.

TEST(EngineTest, PlainOutputEqualsReference) {
  // Room for every admitted request to grow: a request's blocks come back
  // only after the step that finished it (the step runs as one batch).
  EngineOptions o = PlainOptions();
  o.num_blocks = 128;
  Harness h(o);
  uint64_t client = 1;
  std::vector<uint64_t> ids;
  for (uint32_t len = 1; len <= 20; len += 3) {
    for (uint32_t max : {1u, 2u, 5u, 12u}) {
      h.MustAdd(client, MakePrompt(client, len), max);
      ids.push_back(client++);
    }
  }
  ASSERT_TRUE(h.RunToIdle());
  for (uint64_t c : ids) h.ExpectReference(c, 1);
  EXPECT_TRUE(h.engine().Idle());
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  EXPECT_EQ(h.engine().stats().preemptions, 0u);
  EXPECT_EQ(h.engine().Snapshot().pending_ops, 0u);
  h.ExpectMemoryClean();
}

TEST(EngineTest, SingleRequestsOneAtATime) {
  Harness h(PlainOptions());
  uint64_t client = 1;
  for (uint32_t len = 1; len <= 20; ++len) {
    const uint32_t max = 1 + (len * 7) % 12;
    h.MustAdd(client, MakePrompt(100 + client, len), max);
    ASSERT_TRUE(h.RunToIdle());
    h.ExpectReference(client, 1);
    EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
    ++client;
  }
  h.ExpectMemoryClean();
}

TEST(EngineTest, StepDurationAndNoWorkWhenIdle) {
  EngineOptions o = PlainOptions();
  Harness h(o);
  EXPECT_EQ(h.engine().Step({}, h.now), Duration::Zero());
  h.MustAdd(1, MakePrompt(1, 10), 3);
  EXPECT_TRUE(h.engine().HasWork());
  // First step: 10 prefill tokens.
  EXPECT_EQ(h.Step(), o.step_base + o.step_per_token * 10);
  // Second: one decode token.
  EXPECT_EQ(h.Step(), o.step_base + o.step_per_token * 1);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.Step(), Duration::Zero());
  h.ExpectReference(1, 1);
}

// ---------------------------------------------------------------------------
// 2. Continuous batching + chunked prefill.

TEST(EngineTest, ContinuousBatchingChunkedPrefill) {
  EngineOptions o = PlainOptions();
  o.max_batch_tokens = 8;
  o.num_blocks = 256;
  Harness h(o);
  AddLoad(h, 1, 30, 11);
  // Some arrive while others run.
  h.StepN(5);
  AddLoad(h, 100, 20, 12);
  h.StepN(3);
  AddLoad(h, 200, 10, 13);
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  h.ExpectMemoryClean();
}

TEST(EngineTest, TokenBudgetBoundsEveryStep) {
  EngineOptions o = PlainOptions();
  o.max_batch_tokens = 8;
  Harness h(o);
  AddLoad(h, 1, 12, 21);
  while (!h.engine().Idle()) {
    const Duration d = h.Step();
    EXPECT_LE(d, o.step_base + o.step_per_token * 8);
    ASSERT_LT(h.steps, 10000u);
  }
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
}

TEST(EngineTest, MaxRunningBound) {
  EngineOptions o = PlainOptions();
  o.max_running = 2;
  Harness h(o);
  AddLoad(h, 1, 8, 31);
  while (!h.engine().Idle()) {
    h.Step();
    EXPECT_LE(h.engine().Snapshot().running, 2u);
    ASSERT_LT(h.steps, 10000u);
  }
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
}

// ---------------------------------------------------------------------------
// 3. Preemption under block pressure.

TEST(EngineTest, PreemptionUnderBlockPressure) {
  EngineOptions o = PlainOptions();
  o.num_blocks = 8;  // 32 tokens: exactly the largest request (20 + 12)
  Harness h(o);
  uint64_t client = 1;
  Prng prng(41);
  for (int i = 0; i < 24; ++i) {
    const uint32_t len = static_cast<uint32_t>(prng.Range(1, 20));
    const uint32_t max = static_cast<uint32_t>(prng.Range(1, 12));
    h.MustAdd(client, MakePrompt(500 + client, len), max);
    ++client;
  }
  h.MustAdd(client, MakePrompt(999, 20), 12);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_GT(h.engine().stats().preemptions, 0u);
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  h.ExpectMemoryClean();
}

TEST(EngineTest, PreemptionWithoutPrefixCaching) {
  EngineOptions o = PlainOptions();
  o.num_blocks = 8;
  o.prefix_caching = false;
  Harness h(o);
  AddLoad(h, 1, 20, 43);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_GT(h.engine().stats().preemptions, 0u);
  EXPECT_EQ(h.engine().stats().prefix_hits, 0u);
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  EXPECT_EQ(h.engine().pool().num_cached(), 0u);
  h.ExpectMemoryClean();
}

// The header: "preempting the newest running request (recompute) when the
// pool runs out of blocks". A decoding request emits one token per step
// unless preempted (the budget is ample here), so a step in which an older
// running request emits nothing while a newer one does means the older one
// was preempted in favour of the newer one.
TEST(EngineTest, PreemptsNewestRunningRequest) {
  EngineOptions o = PlainOptions();
  o.num_blocks = 4;
  o.prefix_caching = false;
  Harness h(o);
  // A (older) and B (newer) decode side by side; B reaches a block
  // boundary first when no block is free.
  h.MustAdd(1, MakePrompt(71, 4), 12);  // A: 16 tokens, 4 blocks at the end
  h.MustAdd(2, MakePrompt(72, 6), 10);  // B: 16 tokens
  bool a_done = false;
  int a_gap_while_b_ran = 0;
  for (int i = 0; i < 200 && !h.engine().Idle(); ++i) {
    h.Step();
    if (a_done) continue;
    const bool a_emitted = h.step_tokens.count(1) != 0;
    const bool b_emitted = h.step_tokens.count(2) != 0;
    if (!a_emitted && b_emitted) ++a_gap_while_b_ran;
    a_done = h.Finished(1);
  }
  ASSERT_TRUE(h.engine().Idle());
  h.ExpectReference(1, 1);
  h.ExpectReference(2, 1);
  EXPECT_GT(h.engine().stats().preemptions, 0u);
  // Regression (found by this test, fixed): B (client 2, the newest running request) needs a 3rd block at
  // sequence length 9 while A (client 1) holds 2 and the pool (4 blocks) is
  // full; PreemptNewestExcept(B) picks the newest request *other than B*,
  // i.e. the older A, so A stops emitting while B continues. Expected: B
  // (the newest) is preempted and A never stalls.
  EXPECT_EQ(a_gap_while_b_ran, 0);
}

// ---------------------------------------------------------------------------
// 4. Prefix caching.

TEST(EngineTest, PrefixCachingHitsAndReference) {
  Harness h(PlainOptions());
  const std::vector<Token> prefix = MakePrompt(61, 12);  // 3 full blocks
  std::vector<Token> p1 = prefix;
  p1.push_back(5);
  std::vector<Token> p2 = prefix;
  p2.push_back(6);
  p2.push_back(7);
  h.MustAdd(1, p1, 6);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.engine().stats().prefix_hits, 0u);
  EXPECT_GT(h.engine().pool().num_cached(), 0u);
  h.MustAdd(2, p2, 6);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_GE(h.engine().stats().prefix_hits, 3u);
  h.ExpectReference(1, 1);
  h.ExpectReference(2, 1);
  // The same prompt again: every full block hits, including one made of
  // prompt tokens only.
  const uint64_t before = h.engine().stats().prefix_hits;
  h.MustAdd(3, prefix, 4);  // 12 tokens = exactly 3 full blocks
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.engine().stats().prefix_hits, before + 3);
  h.ExpectReference(3, 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  h.ExpectMemoryClean();
}

TEST(EngineTest, PrefixCachingConcurrentSharers) {
  EngineOptions o = PlainOptions();
  o.max_batch_tokens = 8;
  Harness h(o);
  const std::vector<Token> prefix = MakePrompt(62, 8);
  h.MustAdd(1, prefix, 10);
  h.StepN(3);
  for (uint64_t c = 2; c <= 8; ++c) {
    std::vector<Token> p = prefix;
    for (uint64_t k = 0; k < c; ++k) p.push_back(static_cast<Token>(c * 10 + k));
    h.MustAdd(c, p, 8);
  }
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_GT(h.engine().stats().prefix_hits, 0u);
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  h.ExpectMemoryClean();
}

TEST(EngineTest, PrefixCacheNotUsedAcrossWeightVersions) {
  Harness h(PlainOptions());
  const std::vector<Token> prefix = MakePrompt(63, 12);
  h.MustAdd(1, prefix, 6);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(1, 1);
  const uint64_t op = h.engine().UpdateWeights(2, PauseMode::kWait);
  ASSERT_TRUE(h.RunUntilOp(op));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().weights_version(), 2u);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  const uint64_t hits = h.engine().stats().prefix_hits;
  h.MustAdd(2, prefix, 6);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.engine().stats().prefix_hits, hits);  // nothing under v1 reused
  h.ExpectReference(2, 2);
  // Under v2 the prefix is now cached and hits.
  h.MustAdd(3, prefix, 6);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_GT(h.engine().stats().prefix_hits, hits);
  h.ExpectReference(3, 2);
  h.ExpectMemoryClean();
}

TEST(EngineTest, InitialWeightsVersionFromOptions) {
  EngineOptions o = PlainOptions();
  o.weights_version = 7;
  Harness h(o);
  const std::vector<Token> prefix = MakePrompt(64, 8);
  EXPECT_EQ(h.engine().weights_version(), 7u);
  h.MustAdd(1, prefix, 3);
  h.MustAdd(2, prefix, 3);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(1, 7);
  h.ExpectReference(2, 7);
}

// ---------------------------------------------------------------------------
// 5. Validation errors.

TEST(EngineTest, ValidationErrors) {
  EngineOptions o = PlainOptions();
  o.max_waiting = 3;
  Harness h(o);
  EXPECT_EQ(h.Add(1, {}, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Add(1, MakePrompt(1, 4), 0).code(), StatusCode::kInvalidArgument);
  // Longer than the context (1024).
  EXPECT_EQ(h.Add(1, MakePrompt(1, 1000), 25).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.Add(1, MakePrompt(1, 1025), 1).code(), StatusCode::kInvalidArgument);
  // More blocks than the pool (64 blocks of 4 = 256 tokens).
  EXPECT_EQ(h.Add(1, MakePrompt(1, 200), 57).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(h.Add(1, MakePrompt(1, 200), 56).ok());  // exactly 256
  h.engine().AbortRequest(1);
  h.Drain();
  h.clients.clear();
  // Token out of the vocabulary.
  std::vector<Token> bad = MakePrompt(2, 5);
  bad[3] = 32000;
  EXPECT_EQ(h.Add(2, bad, 4).code(), StatusCode::kInvalidArgument);
  bad[3] = 31999;
  EXPECT_TRUE(h.Add(2, bad, 4).ok());
  // Duplicate client.
  EXPECT_EQ(h.Add(2, MakePrompt(3, 5), 4).code(), StatusCode::kAlreadyExists);
  // Transfers on a plain engine.
  {
    RequestSpec spec;
    spec.client = 3;
    spec.prompt = MakePrompt(3, 5);
    spec.max_tokens = 4;
    spec.kv.do_remote_decode = true;
    spec.kv.transfer = TransferId{0, 0x1234};
    EXPECT_EQ(h.engine().AddRequest(spec, h.now).code(), StatusCode::kInvalidArgument);
    spec.kv.do_remote_decode = false;
    spec.kv.do_remote_prefill = true;
    EXPECT_EQ(h.engine().AddRequest(spec, h.now).code(), StatusCode::kInvalidArgument);
  }
  // Waiting queue bound (3).
  EXPECT_TRUE(h.Add(3, MakePrompt(3, 5), 4).ok());
  EXPECT_TRUE(h.Add(4, MakePrompt(4, 5), 4).ok());
  EXPECT_EQ(h.Add(5, MakePrompt(5, 5), 4).code(), StatusCode::kResourceExhausted);
  // Rejected requests leave no trace; accepted ones run.
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(2, 1);
  h.ExpectReference(3, 1);
  h.ExpectReference(4, 1);
  EXPECT_EQ(h.clients.count(5), 0u);
  // A client id can be reused once its request ended.
  EXPECT_TRUE(h.Add(2, MakePrompt(9, 5), 2).ok());
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
}

// A request's fresh blocks come in ascending index order, also after the
// LIFO free list (or the LRU) got the last request's blocks back: adjacent
// blocks are what lets a transfer coalesce them into long runs.
TEST(EngineTest, FreshBlocksOfARequestAscend) {
  for (const bool caching : {false, true}) {
    EngineOptions o = PlainOptions();
    o.prefix_caching = caching;
    o.num_blocks = 16;
    Harness h(o);
    for (uint64_t c = 1; c <= 4; ++c) {
      h.mem.write_order.clear();
      h.MustAdd(c, MakePrompt(100 + c, 40), 1);  // 10 blocks of 4 tokens
      ASSERT_TRUE(h.RunToIdle());
      ASSERT_GE(h.mem.write_order.size(), 10u);
      const std::vector<uint32_t> first(h.mem.write_order.begin(),
                                        h.mem.write_order.begin() + 10);
      EXPECT_TRUE(std::is_sorted(first.begin(), first.end()))
          << "caching " << caching << " request " << c << ": " << ::testing::PrintToString(first);
      EXPECT_EQ(std::adjacent_find(first.begin(), first.end()), first.end());
    }
  }
}

TEST(EngineTest, AbortRequestWhileWaitingAndRunning) {
  Harness h(PlainOptions());
  h.MustAdd(1, MakePrompt(1, 10), 12);
  h.MustAdd(2, MakePrompt(2, 10), 12);
  h.engine().AbortRequest(2);  // waiting
  h.StepN(3);
  h.engine().AbortRequest(1);  // running
  h.engine().AbortRequest(1);  // twice: no second RequestDone
  h.engine().AbortRequest(77);  // unknown: ignored
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectAborted(1);
  h.ExpectAborted(2);
  EXPECT_TRUE(h.clients[2].tokens.empty());
  EXPECT_EQ(h.clients[1].tokens.size(), 3u);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
}

// ---------------------------------------------------------------------------
// D: the first token P handed over with the KV (core/first_token.h).

// Plays P and the data plane for one consumer request: admits it, writes
// the prompt's KV into its load's destination blocks (optionally with one
// block wrong), and ends the load with `first_token`.
struct LoadedRequest {
  uint64_t reads_before_token = 0;  // the memory's reads when the load ended
};
LoadedRequest LoadOnD(Harness& h, uint64_t client, const std::vector<Token>& prompt,
                      uint32_t max_tokens, bool ok, uint32_t first_token,
                      bool corrupt = false) {
  RequestSpec spec;
  spec.client = client;
  spec.prompt = prompt;
  spec.max_tokens = max_tokens;
  spec.kv.do_remote_prefill = true;
  spec.kv.transfer = TransferId{9, client};
  spec.kv.remote_engine = 1;
  EXPECT_TRUE(h.engine().AddRequest(spec, h.now).ok());
  h.clients[client].prompt = prompt;
  h.clients[client].max_tokens = max_tokens;
  h.metas.clear();
  h.Step();
  const LoadOp* load = nullptr;
  for (const ConnectorMetadata& m : h.metas) {
    if (!m.loads.empty()) load = &m.loads[0];
  }
  EXPECT_NE(load, nullptr);
  if (load == nullptr) return {};
  const uint32_t bs = h.shape().block_tokens;
  for (uint32_t i = 0; i < load->dst.size(); ++i) {
    for (uint32_t g = 0; g < kHeadGroups; ++g) {
      const uint64_t digest = BlockDigest(1, prompt, bs, i, g);
      h.mem.Write(load->dst[i], g, corrupt && i == 0 && g == 0 ? digest ^ 1 : digest);
    }
  }
  RankReport r;
  r.finished_recving.push_back(
      LoadDone{load->request, load->transfer, ok, false,
               ok ? TransferResult::kOk : TransferResult::kWriteFailed, first_token});
  h.next_reports.push_back(std::move(r));
  return LoadedRequest{h.mem.reads};
}

EngineOptions ConsumerOptions() {
  EngineOptions o = PlainOptions();
  o.role = Role::kConsumer;
  return o;
}

TEST(EngineProducerTokenTest, DEmitsPsTokenWithoutAStepOnTheLoadedKv) {
  Harness h(ConsumerOptions());
  const std::vector<Token> prompt = MakePrompt(5, 30);
  const Token first = Reference(prompt, 1, 1, h.shape())[0];
  const LoadedRequest l = LoadOnD(h, 1, prompt, 4, true, first);
  h.Step();  // applies the load's end and emits the first token
  ASSERT_EQ(h.clients[1].tokens.size(), 1u);
  EXPECT_EQ(h.mem.reads, l.reads_before_token) << "the first token read no KV";
  EXPECT_EQ(h.engine().stats().producer_tokens, 1u);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_GT(h.mem.reads, l.reads_before_token) << "later tokens read the loaded KV";
  h.ExpectReference(1, 1);
  EXPECT_EQ(h.mem.bad_reads, 0u);
  EXPECT_EQ(h.mem.bad_writes, 0u);
  EXPECT_EQ(h.mem.bad_frees, 0u);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
}

// The loaded KV is still checked: a wrong byte shows from the second token on.
TEST(EngineProducerTokenTest, WrongLoadedKvStillChangesTheOutput) {
  Harness h(ConsumerOptions());
  const std::vector<Token> prompt = MakePrompt(6, 30);
  const std::vector<Token> want = Reference(prompt, 1, 4, h.shape());
  LoadOnD(h, 1, prompt, 4, true, want[0], /*corrupt=*/true);
  ASSERT_TRUE(h.RunToIdle());
  const std::vector<Token> got = Tokens(h.clients[1].tokens);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], want[0]);
  EXPECT_NE(got, want);
  EXPECT_NE(CheckOutput(prompt, h.clients[1].tokens, h.shape()), "");
}

// Where the token is not used, D computes it from the loaded KV as before:
// a request for one token, a token outside the vocabulary, no token, and a
// failed load that recomputes.
TEST(EngineProducerTokenTest, DComputesTheTokenItselfOtherwise) {
  struct Case {
    const char* name;
    uint32_t max_tokens;
    bool ok;
    bool reference_token;    // hand over the right token (else `token`)
    uint32_t token;
  };
  for (const Case& c : {Case{"one token wanted", 1, true, true, 0},
                        Case{"out of vocabulary", 4, true, false, 32000},
                        Case{"none", 4, true, false, kNoFirstToken},
                        Case{"failed load", 4, false, true, 0}}) {
    SCOPED_TRACE(c.name);
    Harness h(ConsumerOptions());
    const std::vector<Token> prompt = MakePrompt(7, 30);
    const uint32_t token = c.reference_token ? Reference(prompt, 1, 1, h.shape())[0] : c.token;
    const LoadedRequest l = LoadOnD(h, 1, prompt, c.max_tokens, c.ok, token);
    ASSERT_TRUE(h.StepUntil([&] { return !h.clients[1].tokens.empty(); }));
    EXPECT_GT(h.mem.reads, l.reads_before_token) << "the first token read the KV";
    ASSERT_TRUE(h.RunToIdle());
    h.ExpectReference(1, 1);
    EXPECT_EQ(h.engine().stats().producer_tokens, 0u);
    EXPECT_EQ(h.engine().stats().loads_recomputed, c.ok ? 0u : 1u);
  }
}

// --compute-first-token: D ignores the token and computes it.
TEST(EngineProducerTokenTest, TheOptionOffComputesTheToken) {
  EngineOptions o = ConsumerOptions();
  o.producer_first_token = false;
  Harness h(o);
  const std::vector<Token> prompt = MakePrompt(9, 30);
  const LoadedRequest l = LoadOnD(h, 1, prompt, 4, true, Reference(prompt, 1, 1, h.shape())[0]);
  ASSERT_TRUE(h.StepUntil([&] { return !h.clients[1].tokens.empty(); }));
  EXPECT_GT(h.mem.reads, l.reads_before_token);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(1, 1);
  EXPECT_EQ(h.engine().stats().producer_tokens, 0u);
}

// P names the token it emitted when it hands the KV over.
TEST(EngineProducerTokenTest, PNamesItsFirstTokenAtReady) {
  EngineOptions o = PlainOptions();
  o.role = Role::kProducer;
  Harness h(o);
  const std::vector<Token> prompt = MakePrompt(8, 30);
  RequestSpec spec;
  spec.client = 1;
  spec.prompt = prompt;
  spec.max_tokens = 4;
  spec.kv.do_remote_decode = true;
  spec.kv.transfer = TransferId{7, 1};
  ASSERT_TRUE(h.engine().AddRequest(spec, h.now).ok());
  ASSERT_TRUE(h.StepUntil([&] { return !h.clients[1].dones.empty(); }));
  ASSERT_EQ(h.clients[1].tokens.size(), 1u);
  const ReadyOp* ready = nullptr;
  for (const ConnectorMetadata& m : h.metas) {
    if (!m.readies.empty()) ready = &m.readies[0];
  }
  ASSERT_NE(ready, nullptr);
  EXPECT_EQ(ready->first_token, h.clients[1].tokens[0].token);
  EXPECT_EQ(ready->first_token, Reference(prompt, 1, 1, h.shape())[0]);
}

// Control(): between steps, while the last step's compute runs, an abort
// and an operation take effect and their metadata leaves at once.

// ---------------------------------------------------------------------------
// D: lifecycle operations with loads in flight (lifecycle.md, rules 1, 4, 5
// and 7). The test plays P and the ranks: it answers the loads the engine
// asks for (LoadOps in its metadata) when and how each test says.

class ConsumerLifecycleTest : public ::testing::Test {
 protected:
  explicit ConsumerLifecycleTest(LoadFailurePolicy policy = LoadFailurePolicy::kFail)
      : h(Options(policy)) {}
  static EngineOptions Options(LoadFailurePolicy policy) {
    EngineOptions o = ConsumerOptions();
    o.load_failure_policy = policy;
    o.num_blocks = 12;
    return o;
  }
  // A remote-prefill request whose KV P computes under weights v1.
  void AddRemote(uint64_t client, uint32_t prompt_len, uint32_t max_tokens) {
    RequestSpec spec;
    spec.client = client;
    spec.prompt = MakePrompt(client * 31, prompt_len);
    spec.max_tokens = max_tokens;
    spec.kv.do_remote_prefill = true;
    spec.kv.transfer = TransferId{9, client};
    spec.kv.remote_engine = 1;
    ASSERT_TRUE(h.engine().AddRequest(spec, h.now).ok());
    h.clients[client].prompt = spec.prompt;
    h.clients[client].max_tokens = max_tokens;
  }
  // Loads the engine asked for since the last call, by client; and whether
  // any metadata since carried abort_transfers.
  std::vector<LoadOp> NewLoads(bool* abort_all = nullptr) {
    std::vector<LoadOp> out;
    for (size_t i = seen_metas_; i < h.metas.size(); ++i) {
      for (const LoadOp& l : h.metas[i].loads) out.push_back(l);
      if (abort_all != nullptr && h.metas[i].abort_all) *abort_all = true;
    }
    seen_metas_ = h.metas.size();
    for (const LoadOp& l : out) open_.push_back(l);
    return out;
  }
  // Ends the open load of `client` as the ranks would report it. ok: P's
  // KV (weights v1) lands first.
  void EndLoad(uint64_t client, bool ok, bool cut_short, TransferResult why) {
    auto it = std::find_if(open_.begin(), open_.end(),
                           [&](const LoadOp& l) { return l.transfer.lo == client; });
    ASSERT_NE(it, open_.end()) << "no open load for client " << client;
    if (ok) {
      const std::vector<Token>& prompt = h.clients[client].prompt;
      for (uint32_t i = 0; i < it->dst.size(); ++i) {
        for (uint32_t g = 0; g < kHeadGroups; ++g) {
          h.mem.Write(it->dst[i], g, BlockDigest(1, prompt, h.shape().block_tokens, i, g));
        }
      }
    }
    if (h.next_reports.empty()) h.next_reports.emplace_back();  // tp 1: one rank
    h.next_reports[0].finished_recving.push_back(
        LoadDone{it->request, it->transfer, ok, cut_short, why, kNoFirstToken});
    open_.erase(it);
  }
  size_t open_loads() const { return open_.size(); }
  void ExpectEveryClientReference() {
    for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
    EXPECT_EQ(h.engine().stats().loads_failed, 0u) << "no request failed";
    EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
    EXPECT_EQ(h.mem.bad_reads, 0u);   // loads allocate for their transfer: no
    EXPECT_EQ(h.mem.bad_writes, 0u);  // foreign_allocates check here
    EXPECT_EQ(h.mem.bad_frees, 0u);
  }

  Harness h;

 private:
  size_t seen_metas_ = 0;
  std::vector<LoadOp> open_;
};

// Rule 7: a wait-mode pause on D does not wait for KV still to come from
// P (P may be paused itself: called first). It returns while the load is
// unanswered; the load goes on and the request decodes after resume.
TEST_F(ConsumerLifecycleTest, PauseWaitDoesNotWaitForALoad) {
  AddRemote(1, 12, 4);
  h.Step();
  ASSERT_EQ(NewLoads().size(), 1u);
  const uint64_t op = h.engine().Pause(PauseMode::kWait, false);
  ASSERT_TRUE(h.RunUntilOp(op, 5)) << "the pause waited for the load";
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(open_loads(), 1u);
  EndLoad(1, true, false, TransferResult::kOk);  // lands while paused
  h.StepN(3);
  EXPECT_TRUE(h.clients[1].tokens.empty()) << "paused: nothing decodes";
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.engine().stats().loads_recomputed, 0u) << "the load was used";
  ExpectEveryClientReference();
}

// Rules 1 and 7 under kv_load_failure_policy=fail: a wait pause with
// clear_cache cuts the unanswered load short at once; the request is kept
// and recomputes after resume, although the policy fails failed loads.
TEST_F(ConsumerLifecycleTest, CutShortLoadUnderTheFailPolicyRecomputes) {
  AddRemote(1, 12, 4);
  h.Step();
  ASSERT_EQ(NewLoads().size(), 1u);
  const uint64_t op = h.engine().Pause(PauseMode::kWait, true);
  h.StepN(2);
  bool abort_all = false;
  NewLoads(&abort_all);
  ASSERT_TRUE(abort_all) << "the reset ends the transfers";
  EXPECT_FALSE(h.OpDoneSeen(op)) << "the load still holds its blocks";
  EndLoad(1, false, true, TransferResult::kAborted);  // the ranks' cut-short answer
  ASSERT_TRUE(h.RunUntilOp(op, 5));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_TRUE(h.clients[1].dones.empty()) << "kept, not failed";
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.engine().stats().loads_recomputed, 1u);
  ExpectEveryClientReference();
}

// A load that P's own cache reset ended (the ranks report it cut short:
// kReset or kMismatch) recomputes under the fail policy, with no operation
// on D at all; an ordinary failure still fails the request.
TEST_F(ConsumerLifecycleTest, AProducersResetRecomputesUnderTheFailPolicy) {
  AddRemote(1, 12, 4);
  AddRemote(2, 8, 3);
  AddRemote(3, 8, 3);
  h.Step();
  ASSERT_EQ(NewLoads().size(), 3u);
  EndLoad(1, false, true, TransferResult::kReset);
  EndLoad(2, false, true, TransferResult::kMismatch);
  EndLoad(3, false, false, TransferResult::kWriteFailed);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(1, 1);
  h.ExpectReference(2, 1);
  ASSERT_EQ(h.clients[3].dones.size(), 1u);
  EXPECT_EQ(h.clients[3].dones[0].reason, FinishReason::kError);
  EXPECT_EQ(h.engine().stats().loads_recomputed, 2u);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
}

// Rule 5: resume fails a cache reset still waiting for a transfer's blocks;
// the cut-short answer that comes later still frees them, and the request
// recomputes.
TEST_F(ConsumerLifecycleTest, ResumeCancelsAResetWhileALoadHoldsBlocks) {
  AddRemote(1, 12, 4);
  h.Step();
  ASSERT_EQ(NewLoads().size(), 1u);
  const uint64_t op = h.engine().Pause(PauseMode::kKeep, true);
  h.StepN(2);
  EXPECT_FALSE(h.OpDoneSeen(op));
  EXPECT_GT(h.engine().pool().num_referenced(), 0u);
  h.Resume();
  ASSERT_TRUE(h.OpDoneSeen(op));
  EXPECT_FALSE(h.Op(op).ok) << "cancelled by resume";
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  EndLoad(1, false, true, TransferResult::kAborted);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.engine().stats().loads_recomputed, 1u);
  ExpectEveryClientReference();
}

// Rule 4: with loads in flight and requests still queued to load, a reset
// cuts the loads short; everything recomputes or loads after resume in
// arrival order (Step() checks the waiting queue's order every step), and
// nothing fails under the fail policy.
TEST_F(ConsumerLifecycleTest, WaitingRequestsRecomputeInOrderAfterAResetWithLoadsInFlight) {
  for (uint64_t c = 1; c <= 6; ++c) AddRemote(c, 16, 3);
  h.Step();
  const std::vector<LoadOp> first = NewLoads();
  ASSERT_GT(first.size(), 0u);
  ASSERT_LT(first.size(), 6u) << "the pool holds only some of the six";
  const uint64_t op = h.engine().Pause(PauseMode::kKeep, true);
  h.StepN(2);
  bool abort_all = false;
  NewLoads(&abort_all);
  ASSERT_TRUE(abort_all);
  // The cut-short answers come newest first: the requeue restores arrival
  // order (Harness::Step checks it after every step).
  for (auto it = first.rbegin(); it != first.rend(); ++it) {
    EndLoad(it->transfer.lo, false, true, TransferResult::kAborted);
  }
  ASSERT_TRUE(h.RunUntilOp(op, 10));
  EXPECT_TRUE(h.Op(op).ok);
  h.Resume();
  // The cut-short ones recompute here; the rest still load from P.
  ASSERT_TRUE(h.StepUntil([&] {
    for (const LoadOp& l : NewLoads()) EndLoad(l.transfer.lo, true, false, TransferResult::kOk);
    return h.AllFinished();
  }));
  EXPECT_EQ(h.engine().stats().loads_recomputed, first.size());
  ExpectEveryClientReference();
}

// Rule 7 on P: a wait-mode pause whose drain can go on only once D pulls
// (every block held for D, nothing running, the oldest request waiting for
// blocks) returns instead of waiting out the transfer timeout — D may be
// paused itself, called first. The request left waiting runs after resume,
// once D's pulls gave the blocks back.
TEST(ProducerLifecycleTest, PauseWaitDoesNotWaitForExportsToFreeBlocks) {
  EngineOptions o = PlainOptions();
  o.role = Role::kProducer;
  o.num_blocks = 8;
  o.prefix_caching = false;
  Harness h(o);
  for (uint64_t c = 1; c <= 3; ++c) {
    RequestSpec spec;
    spec.client = c;
    spec.prompt = MakePrompt(40 + c, 16);  // 4 blocks each: two fill the pool
    spec.max_tokens = 4;
    spec.kv.do_remote_decode = true;
    spec.kv.transfer = TransferId{7, c};
    ASSERT_TRUE(h.engine().AddRequest(spec, h.now).ok());
    h.clients[c].prompt = spec.prompt;
    h.clients[c].max_tokens = 4;
  }
  ASSERT_TRUE(h.StepUntil([&] { return h.Finished(1) && h.Finished(2); }));
  h.StepN(3);
  EXPECT_FALSE(h.Finished(3)) << "no blocks until D pulls";
  EXPECT_EQ(h.engine().Snapshot().held, 2u);
  const uint64_t op = h.engine().Pause(PauseMode::kWait, false);
  ASSERT_TRUE(h.RunUntilOp(op, 5)) << "the drain waited for D's pulls";
  EXPECT_TRUE(h.Op(op).ok);
  h.Resume();
  // D pulls: the ranks report both sends done, and the third request runs.
  RankReport r;
  r.finished_sending = {TransferId{7, 1}, TransferId{7, 2}};
  h.next_reports.push_back(std::move(r));
  ASSERT_TRUE(h.StepUntil([&] { return h.Finished(3); }));
  EXPECT_EQ(h.engine().Snapshot().held, 1u);
}

// Lifecycle hole 5: a request that arrives while the engine is paused
// waits for resume — but never past max_queue_wait, after which it ends
// with a clean error. A request that already produced a token is kept.
TEST(QueueWaitTest, ARequestQueuedBehindAPauseEndsAtItsDeadline) {
  EngineOptions o = PlainOptions();
  o.max_queue_wait = Duration::Seconds(2);
  Harness h(o);
  h.MustAdd(1, MakePrompt(1, 8), 50);
  ASSERT_TRUE(h.StepUntil([&] { return !h.clients[1].tokens.empty(); }));
  const uint64_t op = h.engine().Pause(PauseMode::kKeep, false);
  ASSERT_TRUE(h.RunUntilOp(op, 5));
  const Instant paused_at = h.now;
  h.MustAdd(2, MakePrompt(2, 8), 4);
  h.engine().Tick(paused_at + Duration::Milliseconds(1900));
  h.Drain();
  EXPECT_TRUE(h.clients[2].dones.empty()) << "still within its deadline";
  h.engine().Tick(paused_at + Duration::Milliseconds(2100));
  h.Drain();
  ASSERT_EQ(h.clients[2].dones.size(), 1u);
  EXPECT_EQ(h.clients[2].dones[0].reason, FinishReason::kError);
  EXPECT_NE(h.clients[2].dones[0].error.find("max_queue_wait"), std::string::npos);
  EXPECT_TRUE(h.clients[1].dones.empty()) << "a started request is kept";
  EXPECT_EQ(h.engine().stats().queue_wait_expired, 1u);
  h.now = paused_at + Duration::Milliseconds(2200);
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(1, 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
}

// Zero (the engine's default; serve sets 300 s): no bound.
TEST(QueueWaitTest, ZeroWaitsForResumeHoweverLong) {
  Harness h(PlainOptions());
  const uint64_t op = h.engine().Pause(PauseMode::kKeep, false);
  ASSERT_TRUE(h.RunUntilOp(op, 5));
  h.MustAdd(1, MakePrompt(3, 8), 4);
  h.engine().Tick(h.now + Duration::Seconds(100000));
  h.Drain();
  EXPECT_TRUE(h.clients[1].dones.empty());
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(1, 1);
}

TEST(EngineControlTest, AbortOfHeldSendLeavesAtControlNotAtNextStep) {
  EngineOptions o = PlainOptions();
  o.role = Role::kProducer;
  Harness h(o);
  RequestSpec spec;
  spec.client = 1;
  spec.prompt = MakePrompt(1, 10);
  spec.max_tokens = 4;
  spec.kv.do_remote_decode = true;
  spec.kv.transfer = TransferId{7, 0x1234};
  ASSERT_TRUE(h.engine().AddRequest(spec, h.now).ok());
  // P runs the prompt, emits the first token and holds the KV for D.
  ASSERT_TRUE(h.StepUntil([&] { return !h.clients[1].dones.empty(); }));
  ASSERT_EQ(h.engine().Snapshot().held, 1u);
  const uint64_t steps = h.steps;

  h.engine().AbortRequest(1);
  EXPECT_FALSE(h.engine().PollAction().has_value()) << "nothing leaves before Control";
  h.engine().Control();
  std::optional<EngineAction> a = h.engine().PollAction();
  ASSERT_TRUE(a.has_value());
  const auto* m = std::get_if<MetadataOut>(&*a);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->meta.aborts.size(), 1u);
  EXPECT_EQ(m->meta.aborts[0].transfer, spec.kv.transfer);
  EXPECT_FALSE(h.engine().PollAction().has_value());
  EXPECT_EQ(h.steps, steps);
  // A second Control has nothing to send; the blocks stay held until the
  // ranks report the send ended.
  h.engine().Control();
  EXPECT_FALSE(h.engine().PollAction().has_value());
  EXPECT_EQ(h.engine().Snapshot().held, 1u);
}

TEST(EngineControlTest, OperationAnswersAtControlWithoutComputing) {
  Harness h(PlainOptions());
  h.MustAdd(1, MakePrompt(1, 10), 12);
  h.MustAdd(2, MakePrompt(2, 10), 12);
  h.StepN(2);
  const size_t tokens = h.TotalTokens();
  const uint64_t op = h.engine().AbortRequests({1}, false);
  h.engine().Control();
  h.Drain();
  ASSERT_EQ(h.op_dones[op].size(), 1u);
  EXPECT_TRUE(h.op_dones[op][0].ok);
  h.ExpectAborted(1);
  EXPECT_TRUE(h.clients[2].dones.empty());
  EXPECT_EQ(h.TotalTokens(), tokens) << "Control computes nothing";
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(2, 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
}

// ---------------------------------------------------------------------------
// 6. Lifecycle operations on a plain engine under load.

class LifecycleTest : public ::testing::Test {
 protected:
  LifecycleTest() : h(Options()) {}
  static EngineOptions Options() {
    EngineOptions o = PlainOptions();
    o.max_batch_tokens = 16;
    o.num_blocks = 32;
    return o;
  }
  // Load: 10 requests, a few steps in, so some prefill and some decode.
  void StartLoad(uint64_t first = 1, int n = 10, int steps = 4) {
    AddLoad(h, first, n, 1000 + first);
    h.StepN(steps);
    ASSERT_FALSE(h.AllFinished());
    ASSERT_GT(h.TotalTokens(), 0u);
  }
  Harness h;
};

TEST_F(LifecycleTest, PauseAbortThenResume) {
  StartLoad();
  const uint64_t op = h.engine().Pause(PauseMode::kAbort, false);
  ASSERT_TRUE(h.RunUntilOp(op, 5));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kPaused);
  for (const auto& [c, cl] : h.clients) {
    ASSERT_EQ(cl.dones.size(), 1u) << c;
    if (cl.dones[0].reason == FinishReason::kAborted) {
      h.ExpectAborted(c);
    } else {
      h.ExpectReference(c, 1);
    }
  }
  EXPECT_TRUE(h.engine().Idle());
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  // Paused: a new request waits.
  h.MustAdd(100, MakePrompt(100, 7), 4);
  h.StepN(5);
  EXPECT_TRUE(h.clients[100].tokens.empty());
  const uint64_t r = h.Resume();
  ASSERT_TRUE(h.OpDoneSeen(r));
  EXPECT_TRUE(h.Op(r).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 1);
  EXPECT_EQ(h.op_dones.size(), 2u);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, PauseAbortClearCache) {
  StartLoad();
  const uint64_t resets = h.mem.resets;
  const uint64_t op = h.engine().Pause(PauseMode::kAbort, true);
  ASSERT_TRUE(h.RunUntilOp(op, 5));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kPaused);
  EXPECT_EQ(h.mem.resets, resets + 1);
  EXPECT_EQ(h.engine().pool().num_cached(), 0u);
  EXPECT_EQ(h.engine().pool().num_free(), h.engine().pool().capacity());
  h.Resume();
  AddLoad(h, 100, 5, 3);
  ASSERT_TRUE(h.RunToIdle());
  for (uint64_t c = 100; c < 105; ++c) h.ExpectReference(c, 1);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, PauseWaitDrainsThenResume) {
  StartLoad();
  std::set<uint64_t> in_flight;
  for (const auto& [c, cl] : h.clients) {
    if (cl.dones.empty()) in_flight.insert(c);
  }
  const uint64_t op = h.engine().Pause(PauseMode::kWait, false);
  h.Step();
  // A request added during the drain waits.
  h.MustAdd(100, MakePrompt(100, 9), 5);
  ASSERT_TRUE(h.RunUntilOp(op));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kPaused);
  for (uint64_t c : in_flight) h.ExpectReference(c, 1);
  EXPECT_TRUE(h.clients[100].tokens.empty());
  EXPECT_TRUE(h.clients[100].dones.empty());
  h.StepN(10);
  EXPECT_TRUE(h.clients[100].tokens.empty());
  h.Resume();
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, PauseWaitClearCache) {
  StartLoad();
  const uint64_t resets = h.mem.resets;
  const uint64_t op = h.engine().Pause(PauseMode::kWait, true);
  h.Step();
  h.MustAdd(100, MakePrompt(100, 9), 5);
  ASSERT_TRUE(h.RunUntilOp(op));
  EXPECT_TRUE(h.clients[100].tokens.empty());
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.mem.resets, resets + 1);
  EXPECT_EQ(h.engine().pool().num_cached(), 0u);
  for (const auto& [c, cl] : h.clients) {
    if (c != 100) h.ExpectReference(c, 1);
  }
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 1);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, PauseKeepFreezesAndResumes) {
  StartLoad();
  const uint64_t preemptions = h.engine().stats().preemptions;
  const uint64_t op = h.engine().Pause(PauseMode::kKeep, false);
  h.Step();
  ASSERT_TRUE(h.OpDoneSeen(op));  // at once
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kPaused);
  const uint64_t tokens = h.TotalTokens();
  const size_t referenced = h.engine().pool().num_referenced();
  EXPECT_GT(referenced, 0u);  // requests keep their KV
  h.StepN(20);
  EXPECT_EQ(h.TotalTokens(), tokens);
  EXPECT_EQ(h.engine().pool().num_referenced(), referenced);
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  EXPECT_EQ(h.engine().stats().preemptions, preemptions);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, PauseKeepClearCachePreemptsAndResets) {
  StartLoad();
  const uint64_t resets = h.mem.resets;
  const uint64_t op = h.engine().Pause(PauseMode::kKeep, true);
  h.Step();
  ASSERT_TRUE(h.OpDoneSeen(op));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kPaused);
  EXPECT_EQ(h.mem.resets, resets + 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  EXPECT_EQ(h.engine().pool().num_cached(), 0u);
  EXPECT_EQ(h.engine().Snapshot().running, 0u);
  const uint64_t tokens = h.TotalTokens();
  h.StepN(5);
  EXPECT_EQ(h.TotalTokens(), tokens);
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, AbortRequestsAllAndSubset) {
  StartLoad();
  std::vector<uint64_t> subset;
  for (const auto& [c, cl] : h.clients) {
    if (cl.dones.empty() && subset.size() < 3) subset.push_back(c);
  }
  const uint64_t op1 = h.engine().AbortRequests(subset, false);
  ASSERT_TRUE(h.RunUntilOp(op1, 2));
  EXPECT_TRUE(h.Op(op1).ok);
  for (uint64_t c : subset) h.ExpectAborted(c);
  h.Step();
  const uint64_t op2 = h.engine().AbortRequests({}, true);
  ASSERT_TRUE(h.RunUntilOp(op2, 2));
  EXPECT_TRUE(h.Op(op2).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  ASSERT_TRUE(h.RunToIdle(10));
  for (const auto& [c, cl] : h.clients) {
    ASSERT_EQ(cl.dones.size(), 1u) << c;
    if (cl.dones[0].reason == FinishReason::kLength) {
      h.ExpectReference(c, 1);
    } else {
      h.ExpectAborted(c);
    }
  }
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
}

TEST_F(LifecycleTest, SleepLevel1WaitThenWakeUp) {
  StartLoad();
  const uint64_t resets = h.mem.resets;
  const uint64_t op = h.engine().Sleep(1, PauseMode::kWait);
  h.Step();  // the sleep starts draining
  h.MustAdd(100, MakePrompt(100, 6), 4);
  ASSERT_TRUE(h.RunUntilOp(op));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_TRUE(h.engine().IsSleeping());
  EXPECT_EQ(h.engine().state(), EngineState::kSleeping);
  EXPECT_TRUE(h.engine().Snapshot().sleeping);
  EXPECT_GT(h.mem.resets, resets);
  EXPECT_EQ(h.engine().pool().num_free(), h.engine().pool().capacity());
  for (const auto& [c, cl] : h.clients) {
    if (c != 100) h.ExpectReference(c, 1);
  }
  h.StepN(5);
  EXPECT_TRUE(h.clients[100].tokens.empty());
  // resume does not wake a sleeping engine.
  h.Resume();
  EXPECT_TRUE(h.engine().IsSleeping());
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w, 3));
  EXPECT_TRUE(h.Op(w).ok);
  EXPECT_FALSE(h.engine().IsSleeping());
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 1);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, SleepLevel2AbortThenWakeUp) {
  StartLoad();
  const uint64_t op = h.engine().Sleep(2, PauseMode::kAbort);
  ASSERT_TRUE(h.RunUntilOp(op, 5));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_TRUE(h.engine().IsSleeping());
  for (const auto& [c, cl] : h.clients) {
    ASSERT_EQ(cl.dones.size(), 1u) << c;
    if (cl.dones[0].reason == FinishReason::kLength) {
      h.ExpectReference(c, 1);
    } else {
      h.ExpectAborted(c);
    }
  }
  EXPECT_EQ(h.engine().pool().num_free(), h.engine().pool().capacity());
  h.MustAdd(100, MakePrompt(100, 6), 4);
  h.StepN(5);
  EXPECT_TRUE(h.clients[100].tokens.empty());
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w, 3));
  EXPECT_TRUE(h.Op(w).ok);
  EXPECT_FALSE(h.engine().IsSleeping());
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 1);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, SleepLevel0WaitThenWakeUp) {
  StartLoad();
  const uint64_t op = h.engine().Sleep(0, PauseMode::kWait);
  ASSERT_TRUE(h.RunUntilOp(op));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_TRUE(h.engine().IsSleeping());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  h.MustAdd(100, MakePrompt(100, 6), 4);
  h.StepN(3);
  EXPECT_TRUE(h.clients[100].tokens.empty());
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w, 3));
  EXPECT_FALSE(h.engine().IsSleeping());
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 1);
}

// Sleep level 0 keeps the KV cache ("pause scheduling only"), so the
// prefix cache survives it. wake_up then calls KvMemory::OnReset ("every
// block's content is gone") without resetting the pool.
TEST_F(LifecycleTest, SleepLevel0WakeUpThenPrefixHit) {
  const std::vector<Token> prompt = MakePrompt(555, 12);  // 3 full blocks
  h.MustAdd(1, prompt, 4);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(1, 1);
  ASSERT_GT(h.engine().pool().num_cached(), 0u);
  const uint64_t op = h.engine().Sleep(0, PauseMode::kWait);
  ASSERT_TRUE(h.RunUntilOp(op));
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w));
  const uint64_t hits = h.engine().stats().prefix_hits;
  h.MustAdd(2, prompt, 4);
  ASSERT_TRUE(h.RunToIdle());
  // Regression: wake_up used to call memory_->OnReset() after a level-0
  // sleep although the pool was never reset, so the prefix cache kept
  // mapping blocks whose content was gone (client 2 decoded from zeroed KV).
  EXPECT_EQ(h.engine().stats().prefix_hits - hits, 3u);
  h.ExpectReference(2, 1);
  EXPECT_EQ(h.mem.bad_reads, 0u);
}

TEST_F(LifecycleTest, ReleaseKvCacheMemoryThenWakeUp) {
  StartLoad();
  const uint64_t resets = h.mem.resets;
  const uint64_t op = h.engine().ReleaseKvCacheMemory();
  ASSERT_TRUE(h.RunUntilOp(op, 5));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kKvReleased);
  EXPECT_EQ(h.mem.resets, resets + 1);
  EXPECT_EQ(h.engine().pool().num_free(), h.engine().pool().capacity());
  const uint64_t tokens = h.TotalTokens();
  h.StepN(5);
  EXPECT_EQ(h.TotalTokens(), tokens);
  h.Resume();  // does not undo a release
  EXPECT_EQ(h.engine().state(), EngineState::kKvReleased);
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w, 3));
  EXPECT_TRUE(h.Op(w).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, ResetPrefixCacheWithoutRunningReset) {
  StartLoad(1, 10, 2);
  const uint64_t op = h.engine().ResetPrefixCache(false);
  ASSERT_TRUE(h.RunUntilOp(op, 2));
  EXPECT_FALSE(h.Op(op).ok);
  EXPECT_FALSE(h.Op(op).detail.empty());
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  ASSERT_GT(h.engine().pool().num_cached(), 0u);
  const uint64_t op2 = h.engine().ResetPrefixCache(false);
  ASSERT_TRUE(h.RunUntilOp(op2, 2));
  EXPECT_TRUE(h.Op(op2).ok);
  EXPECT_EQ(h.engine().pool().num_cached(), 0u);
  EXPECT_EQ(h.engine().pool().num_free(), h.engine().pool().capacity());
  // Same prompts again: no hits, same output.
  const uint64_t hits = h.engine().stats().prefix_hits;
  h.MustAdd(100, h.clients[1].prompt, h.clients[1].max_tokens);
  ASSERT_TRUE(h.RunToIdle());
  EXPECT_EQ(h.engine().stats().prefix_hits, hits);
  h.ExpectReference(100, 1);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, ResetPrefixCacheWithRunningReset) {
  StartLoad(1, 10, 2);
  const uint64_t op = h.engine().ResetPrefixCache(true);
  ASSERT_TRUE(h.RunUntilOp(op, 2));
  EXPECT_TRUE(h.Op(op).ok);
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, ResetPrefixCacheWhilePausedKeep) {
  StartLoad();
  const uint64_t p = h.engine().Pause(PauseMode::kKeep, false);
  ASSERT_TRUE(h.RunUntilOp(p, 2));
  const uint64_t op = h.engine().ResetPrefixCache(false);
  ASSERT_TRUE(h.RunUntilOp(op, 2));
  EXPECT_FALSE(h.Op(op).ok);  // paused requests hold blocks: false, no crash
  const uint64_t op2 = h.engine().ResetPrefixCache(true);
  ASSERT_TRUE(h.RunUntilOp(op2, 2));
  EXPECT_TRUE(h.Op(op2).ok);
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
}

// Returns "" if the tokens' versions are 1...1 2...2 (either part may be
// empty), else a description.
std::string VersionsMonotone(const std::vector<TokenOut>& tokens) {
  uint64_t last = 1;
  for (size_t k = 0; k < tokens.size(); ++k) {
    const uint64_t v = tokens[k].weights_version;
    if (v != 1 && v != 2) return "token " + std::to_string(k) + " has version " + std::to_string(v);
    if (v < last) return "token " + std::to_string(k) + " goes back to v1";
    last = v;
  }
  return "";
}

TEST_F(LifecycleTest, UpdateWeightsKeepMidGeneration) {
  StartLoad();
  std::map<uint64_t, size_t> before;
  for (const auto& [c, cl] : h.clients) before[c] = cl.tokens.size();
  const uint64_t resets = h.mem.resets;
  const uint64_t op = h.engine().UpdateWeights(2, PauseMode::kKeep);
  ASSERT_TRUE(h.RunUntilOp(op, 3));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().weights_version(), 2u);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  EXPECT_EQ(h.mem.resets, resets + 1);
  ASSERT_TRUE(h.RunToIdle());
  bool some_mixed = false;
  for (const auto& [c, cl] : h.clients) {
    SCOPED_TRACE("client " + std::to_string(c));
    ASSERT_EQ(cl.dones.size(), 1u);
    EXPECT_EQ(cl.dones[0].reason, FinishReason::kLength);
    ASSERT_EQ(cl.tokens.size(), cl.max_tokens);
    // Tokens emitted before the op ran are v1, after are v2 (the op runs at
    // the start of the step after it was called; nothing ran in between).
    for (size_t k = 0; k < cl.tokens.size(); ++k) {
      EXPECT_EQ(cl.tokens[k].weights_version, k < before[c] ? 1u : 2u) << k;
    }
    EXPECT_EQ(VersionsMonotone(cl.tokens), "");
    EXPECT_EQ(CheckOutput(cl.prompt, cl.tokens, h.shape()), "");
    if (before[c] > 0 && before[c] < cl.max_tokens) some_mixed = true;
  }
  EXPECT_TRUE(some_mixed);
  h.MustAdd(100, MakePrompt(100, 10), 5);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 2);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, UpdateWeightsAbort) {
  StartLoad();
  const uint64_t op = h.engine().UpdateWeights(2, PauseMode::kAbort);
  ASSERT_TRUE(h.RunUntilOp(op, 3));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().weights_version(), 2u);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  for (const auto& [c, cl] : h.clients) {
    ASSERT_EQ(cl.dones.size(), 1u) << c;
    if (cl.dones[0].reason == FinishReason::kLength) {
      h.ExpectReference(c, 1);
    } else {
      h.ExpectAborted(c);
      for (const TokenOut& t : cl.tokens) EXPECT_EQ(t.weights_version, 1u);
    }
  }
  h.MustAdd(100, MakePrompt(100, 10), 5);
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 2);
  EXPECT_EQ(h.engine().pool().num_referenced(), 0u);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, UpdateWeightsWait) {
  StartLoad();
  std::set<uint64_t> old_clients;
  for (const auto& [c, cl] : h.clients) old_clients.insert(c);
  const uint64_t op = h.engine().UpdateWeights(2, PauseMode::kWait);
  h.Step();
  h.MustAdd(100, MakePrompt(100, 10), 5);  // during the drain
  ASSERT_TRUE(h.RunUntilOp(op));
  EXPECT_TRUE(h.Op(op).ok);
  EXPECT_EQ(h.engine().weights_version(), 2u);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  for (uint64_t c : old_clients) h.ExpectReference(c, 1);
  EXPECT_TRUE(h.clients[100].tokens.empty());
  ASSERT_TRUE(h.RunToIdle());  // no resume needed
  h.ExpectReference(100, 2);
  h.ExpectMemoryClean();
}

TEST_F(LifecycleTest, ResumeCancelsDrainingPauseWithClearCache) {
  StartLoad();
  const uint64_t op = h.engine().Pause(PauseMode::kWait, true);
  h.Step();
  ASSERT_FALSE(h.OpDoneSeen(op));  // still draining
  const uint64_t resets = h.mem.resets;
  const uint64_t r = h.Resume();
  ASSERT_TRUE(h.OpDoneSeen(op));
  EXPECT_FALSE(h.Op(op).ok);
  EXPECT_EQ(h.Op(op).detail, "cancelled by resume");
  ASSERT_TRUE(h.OpDoneSeen(r));
  EXPECT_TRUE(h.Op(r).ok);
  EXPECT_EQ(h.op_dones[op].size(), 1u);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  h.MustAdd(100, MakePrompt(100, 8), 4);  // admitted: no drain any more
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) h.ExpectReference(c, 1);
  EXPECT_EQ(h.mem.resets, resets);  // the reset never happened
  EXPECT_EQ(h.op_dones[op].size(), 1u);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
}

TEST_F(LifecycleTest, SnapshotCounts) {
  StartLoad();
  size_t unfinished = 0;
  for (const auto& [c, cl] : h.clients) unfinished += cl.dones.empty();
  const EngineSnapshot s = h.engine().Snapshot();
  EXPECT_EQ(s.state, EngineState::kActive);
  EXPECT_FALSE(s.sleeping);
  EXPECT_EQ(s.weights_version, 1u);
  EXPECT_EQ(s.waiting + s.running, unfinished);
  EXPECT_EQ(s.loading + s.held + s.releasing, 0u);
  EXPECT_EQ(s.blocks_used, h.engine().pool().num_referenced());
  EXPECT_EQ(s.blocks_free, h.engine().pool().num_free());
  EXPECT_EQ(s.blocks_cached, h.engine().pool().num_cached_idle());
  EXPECT_EQ(s.pending_ops, 0u);
  h.engine().Pause(PauseMode::kKeep, false);
  h.engine().ResetPrefixCache(false);
  EXPECT_EQ(h.engine().Snapshot().pending_ops, 2u);
  h.Step();
  EXPECT_EQ(h.engine().Snapshot().pending_ops, 0u);
  EXPECT_EQ(h.engine().Snapshot().state, EngineState::kPaused);
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
}

TEST_F(LifecycleTest, ResumeWhenNotPausedIsOk) {
  const uint64_t r = h.Resume();
  ASSERT_TRUE(h.OpDoneSeen(r));
  EXPECT_TRUE(h.Op(r).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  const uint64_t w = h.engine().WakeUp();  // not sleeping: ok, no-op
  ASSERT_TRUE(h.RunUntilOp(w, 2));
  EXPECT_TRUE(h.Op(w).ok);
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
}

TEST_F(LifecycleTest, OpsRunInOrder) {
  StartLoad();
  const uint64_t a = h.engine().Pause(PauseMode::kKeep, false);
  const uint64_t b = h.engine().ResetPrefixCache(true);
  const uint64_t c = h.engine().AbortRequests({1}, false);
  ASSERT_TRUE(h.RunUntilOp(c, 3));
  ASSERT_GE(h.op_order.size(), 3u);
  EXPECT_EQ(h.op_order[0], a);
  EXPECT_EQ(h.op_order[1], b);
  EXPECT_EQ(h.op_order[2], c);
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
}

// pause() then resume(), called in that order before the engine stepped:
// the engine must end up active (the caller resumed last).
TEST_F(LifecycleTest, ResumeRightAfterPauseLeavesEngineActive) {
  StartLoad();
  const uint64_t p = h.engine().Pause(PauseMode::kKeep, false);
  const uint64_t r = h.Resume();
  ASSERT_TRUE(h.RunUntilOp(p, 3));
  ASSERT_TRUE(h.OpDoneSeen(r));
  // Regression: Resume() used to cancel only a head op that had started; a
  // pause queued but not yet run then ran after the resume and left the
  // engine paused forever. Now the queued pause is cancelled.
  EXPECT_FALSE(h.Op(p).ok);
  EXPECT_EQ(h.Op(p).detail, "cancelled by resume");
  EXPECT_EQ(h.engine().state(), EngineState::kActive);
  EXPECT_TRUE(h.RunToIdle(2000));
}

// The drain of a wait-mode operation covers "the requests that arrived
// before the call" (lifecycle.cc); a request added after pause(wait) was
// called is new and must wait for resume.
TEST_F(LifecycleTest, WaitModeCoversOnlyRequestsBeforeTheCall) {
  StartLoad();
  const uint64_t op = h.engine().Pause(PauseMode::kWait, false);
  h.MustAdd(100, MakePrompt(100, 6), 4);  // after the call, before a step
  ASSERT_TRUE(h.RunUntilOp(op));
  EXPECT_TRUE(h.Op(op).ok);
  // Regression (found by this test, fixed): the drain cut-off was taken when the operation started running (the next
  // Step), not when Pause() is called, so client 100 — added after the
  // call — is drained (served to completion) before the pause completes.
  // Expected: client 100 has no tokens until resume.
  EXPECT_TRUE(h.clients[100].tokens.empty());
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 1);
}

// An operation on a sleeping engine must not make it forget it sleeps:
// pause(keep) after sleep(2), then wake_up + resume, must serve again.
TEST_F(LifecycleTest, PauseWhileSleepingLevel2ThenWakeUpResume) {
  const uint64_t s = h.engine().Sleep(2, PauseMode::kWait);
  ASSERT_TRUE(h.RunUntilOp(s));
  ASSERT_TRUE(h.engine().IsSleeping());
  const uint64_t p = h.engine().Pause(PauseMode::kKeep, false);
  ASSERT_TRUE(h.RunUntilOp(p, 3));
  EXPECT_TRUE(h.Op(p).ok);
  // Regression: FinishOp(kPause) used to overwrite kSleeping with kPaused
  // while weights_loaded_ stayed false; wake_up was then a no-op and after
  // resume the engine never scheduled again (found by the property below).
  EXPECT_TRUE(h.engine().IsSleeping());
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w, 3));
  h.Resume();
  h.MustAdd(100, MakePrompt(100, 10), 5);
  ASSERT_TRUE(h.RunToIdle(2000));
  h.ExpectReference(100, 1);
}

// update_weights on an engine that the operator paused (keep): the weights
// change, the engine stays paused until resume() (the usual RL flow is
// pause -> update_weights -> resume).
TEST_F(LifecycleTest, UpdateWeightsWhilePausedStaysPaused) {
  StartLoad();
  const uint64_t p = h.engine().Pause(PauseMode::kKeep, false);
  ASSERT_TRUE(h.RunUntilOp(p, 3));
  ASSERT_EQ(h.engine().state(), EngineState::kPaused);
  const uint64_t u = h.engine().UpdateWeights(2, PauseMode::kKeep);
  ASSERT_TRUE(h.RunUntilOp(u, 3));
  EXPECT_TRUE(h.Op(u).ok);
  EXPECT_EQ(h.engine().weights_version(), 2u);
  const uint64_t tokens = h.TotalTokens();
  h.StepN(5);
  // Regression (found by this test, fixed): FinishOp(kUpdateWeights) sets state_ = kActive unconditionally, so
  // an update on a paused engine resumes it: tokens flow before the
  // operator's resume(). Expected: state kPaused, no tokens until resume().
  EXPECT_EQ(h.engine().state(), EngineState::kPaused);
  EXPECT_EQ(h.TotalTokens(), tokens);
  h.Resume();
  ASSERT_TRUE(h.RunToIdle());
  for (const auto& [c, cl] : h.clients) {
    EXPECT_EQ(CheckOutput(cl.prompt, cl.tokens, h.shape()), "") << c;
    EXPECT_EQ(cl.dones.size(), 1u) << c;
  }
}

// update_weights on a sleeping (level 1) engine: the engine must stay
// asleep until wake_up.
TEST_F(LifecycleTest, UpdateWeightsWhileSleepingStaysAsleep) {
  const uint64_t s = h.engine().Sleep(1, PauseMode::kWait);
  ASSERT_TRUE(h.RunUntilOp(s));
  ASSERT_TRUE(h.engine().IsSleeping());
  h.MustAdd(100, MakePrompt(100, 10), 5);
  const uint64_t u = h.engine().UpdateWeights(2, PauseMode::kKeep);
  ASSERT_TRUE(h.RunUntilOp(u, 3));
  EXPECT_TRUE(h.Op(u).ok);
  h.StepN(5);
  // Regression (found by this test, fixed): FinishOp(kUpdateWeights) sets state_ = kActive: the engine leaves
  // sleep without wake_up (IsSleeping() false) and serves client 100.
  // Expected: still sleeping, no tokens until wake_up.
  EXPECT_TRUE(h.engine().IsSleeping());
  EXPECT_TRUE(h.clients[100].tokens.empty());
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w, 3));
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 2);
}

// update_weights after release_kv_cache_memory: the KV stays released
// until wake_up.
TEST_F(LifecycleTest, UpdateWeightsAfterReleaseKvStaysReleased) {
  const uint64_t r = h.engine().ReleaseKvCacheMemory();
  ASSERT_TRUE(h.RunUntilOp(r));
  ASSERT_EQ(h.engine().state(), EngineState::kKvReleased);
  h.MustAdd(100, MakePrompt(100, 10), 5);
  const uint64_t u = h.engine().UpdateWeights(2, PauseMode::kKeep);
  ASSERT_TRUE(h.RunUntilOp(u, 3));
  h.StepN(5);
  // Regression (found by this test, fixed): as above, the update makes the state kActive and the engine
  // computes into KV memory that was released and never re-acquired by
  // wake_up. Expected: kKvReleased, no tokens until wake_up.
  EXPECT_EQ(h.engine().state(), EngineState::kKvReleased);
  EXPECT_TRUE(h.clients[100].tokens.empty());
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w, 3));
  ASSERT_TRUE(h.RunToIdle());
  h.ExpectReference(100, 2);
}

// sleep(2) discards the weights; update_weights then loads new ones; after
// wake_up the engine must serve again.
TEST_F(LifecycleTest, SleepLevel2ThenUpdateWeightsThenWakeUp) {
  StartLoad();
  const uint64_t s = h.engine().Sleep(2, PauseMode::kWait);
  ASSERT_TRUE(h.RunUntilOp(s));
  ASSERT_TRUE(h.engine().IsSleeping());
  const uint64_t u = h.engine().UpdateWeights(2, PauseMode::kKeep);
  ASSERT_TRUE(h.RunUntilOp(u, 3));
  EXPECT_TRUE(h.Op(u).ok);
  const uint64_t w = h.engine().WakeUp();
  ASSERT_TRUE(h.RunUntilOp(w, 3));
  EXPECT_TRUE(h.Op(w).ok);
  h.Resume();
  h.MustAdd(100, MakePrompt(100, 10), 5);
  // Regression: UpdateWeights left weights_loaded_ == false (from the
  // level-2 sleep) and made the state kActive, and wake_up only acted on
  // kSleeping / kKvReleased, so the engine never scheduled again.
  ASSERT_TRUE(h.RunToIdle(2000));
  h.ExpectReference(100, 2);
}

// ---------------------------------------------------------------------------
// 7. Property: random interleavings of requests, aborts, steps and lifecycle
// operations on a plain engine with a small pool.

enum class Act : uint8_t {
  kAdd, kAbort, kStep, kAbortRequests, kPause, kResume, kSleep, kWakeUp,
  kReleaseKv, kResetPrefix, kUpdateWeights, kControl,
};

struct RandomOp {
  Act act = Act::kStep;
  uint8_t a = 0;
  uint8_t b = 0;
};

rc::Gen<RandomOp> GenRandomOp(bool with_sleep0) {
  return rc::gen::apply(
      [with_sleep0](int kind, uint8_t a, uint8_t b) {
        RandomOp op;
        op.a = a;
        op.b = b;
        // Mostly requests and steps; lifecycle operations about 1 in 3.
        if (kind < 6) {
          op.act = Act::kAdd;
        } else if (kind < 7) {
          op.act = Act::kAbort;
        } else if (kind < 16) {
          op.act = Act::kStep;
        } else if (kind < 25) {
          static constexpr Act kLifecycle[] = {
              Act::kAbortRequests, Act::kPause,     Act::kResume,      Act::kSleep,
              Act::kWakeUp,        Act::kReleaseKv, Act::kResetPrefix, Act::kUpdateWeights,
              Act::kResume,
          };
          op.act = kLifecycle[kind - 16];
        } else {
          op.act = Act::kControl;  // what arrived takes effect mid-compute
        }
        if (op.act == Act::kSleep && !with_sleep0 && op.a % 3 == 0) op.a += 1;
        return op;
      },
      rc::gen::inRange(0, 27), rc::gen::arbitrary<uint8_t>(), rc::gen::arbitrary<uint8_t>());
}

std::string Describe(const RandomOp& op) {
  const char* names[] = {"Add", "Abort", "Step", "AbortRequests", "Pause", "Resume", "Sleep",
                         "WakeUp", "ReleaseKv", "ResetPrefix", "UpdateWeights", "Control"};
  return std::string(names[static_cast<int>(op.act)]) + "(" + std::to_string(op.a) + "," +
         std::to_string(op.b) + ")";
}

// How the final phase drains the engine.
enum class DrainStyle {
  kOnce,       // resume + wake_up once, then step until idle (bounded)
  kRetry,      // resume + wake_up repeated while draining
  kHasWork,    // like the simulator: one step after resume + wake_up, then
               // step only while HasWork(); must reach Idle()
};

// Runs `ops` on a plain engine with a small pool, checking after every
// step: invariants, no tokens from a non-active engine, token versions; at
// the end drains and checks every request and operation got exactly one
// answer, outputs are right, the pool is empty.
void RunInterleaving(const std::vector<RandomOp>& ops, DrainStyle style) {
  EngineOptions o = PlainOptions();
  o.num_blocks = 8;
  o.max_batch_tokens = 8;
  o.max_running = 6;
  Harness h(o);
  const ModelShape& shape = h.shape();
  uint64_t next_client = 1;
  uint64_t next_version = 2;
  std::vector<uint64_t> issued_ops;
  std::vector<std::vector<Token>> families = {MakePrompt(901, 12), MakePrompt(902, 12)};
  bool step_ok = true;
  std::string step_why;
  auto checked_step = [&] {
    const EngineState before = h.engine().state();
    const uint64_t v_before = h.engine().weights_version();
    const bool ops_pending = h.engine().Snapshot().pending_ops > 0;
    std::map<uint64_t, size_t> counts;
    for (const auto& [c, cl] : h.clients) counts[c] = cl.tokens.size();
    h.Step();
    const uint64_t v_after = h.engine().weights_version();
    for (const auto& [c, cl] : h.clients) {
      for (size_t k = counts[c]; k < cl.tokens.size(); ++k) {
        const uint64_t v = cl.tokens[k].weights_version;
        if (v < v_before || v > v_after) {
          step_ok = false;
          step_why = "client " + std::to_string(c) + " token " + std::to_string(k) +
                     " has version " + std::to_string(v);
        }
        if (before != EngineState::kActive && !ops_pending) {
          step_ok = false;
          step_why = "client " + std::to_string(c) + " got a token while state " +
                     std::to_string(static_cast<int>(before));
        }
      }
    }
  };
  for (const RandomOp& op : ops) {
    switch (op.act) {
      case Act::kAdd: {
        const uint32_t len = 1 + op.a % 12;
        const uint32_t max = 1 + op.b % 8;
        std::vector<Token> prompt;
        if (op.a & 0x80) {
          // Shares a prefix with others, for prefix-cache hits.
          const auto& f = families[(op.b >> 4) & 1];
          prompt.assign(f.begin(), f.begin() + len);
        } else {
          prompt = MakePrompt(next_client * 31 + op.b, len);
        }
        Status s = h.Add(next_client++, prompt, max);
        RC_ASSERT(s.ok());
        break;
      }
      case Act::kAbort:
        if (next_client > 1) h.engine().AbortRequest(1 + op.a % (next_client - 1));
        break;
      case Act::kStep:
        for (int i = 0; i <= op.a % 4; ++i) checked_step();
        break;
      case Act::kAbortRequests: {
        std::vector<uint64_t> subset;
        for (uint64_t c = 1; c < next_client; ++c) {
          if ((c + op.b) % 3 == 0) subset.push_back(c);
        }
        issued_ops.push_back(h.engine().AbortRequests(subset, op.a % 4 == 0));
        break;
      }
      case Act::kPause:
        issued_ops.push_back(
            h.engine().Pause(static_cast<PauseMode>(op.a % 3), (op.b & 1) != 0));
        break;
      case Act::kResume:
        issued_ops.push_back(h.Resume());
        break;
      case Act::kSleep:
        issued_ops.push_back(h.engine().Sleep(op.a % 3, (op.b & 1) ? PauseMode::kAbort
                                                                   : PauseMode::kWait));
        break;
      case Act::kWakeUp:
        issued_ops.push_back(h.engine().WakeUp());
        break;
      case Act::kReleaseKv:
        issued_ops.push_back(h.engine().ReleaseKvCacheMemory());
        break;
      case Act::kResetPrefix:
        issued_ops.push_back(h.engine().ResetPrefixCache((op.b & 1) != 0));
        break;
      case Act::kUpdateWeights:
        issued_ops.push_back(
            h.engine().UpdateWeights(next_version++, static_cast<PauseMode>(op.a % 3)));
        break;
      case Act::kControl:
        h.engine().Control();
        break;
    }
    h.Drain();
    if (!step_ok) RC_FAIL(step_why);
  }
  // Final: resume, wake_up, drain.
  issued_ops.push_back(h.Resume());
  issued_ops.push_back(h.engine().WakeUp());
  bool idle = false;
  if (style == DrainStyle::kHasWork) {
    checked_step();
    for (int i = 0; i < 20000 && h.engine().HasWork(); ++i) checked_step();
    idle = h.engine().Idle();
  } else {
    for (int round = 0; round < 50 && !idle; ++round) {
      for (int i = 0; i < 400 && !h.engine().Idle(); ++i) checked_step();
      idle = h.engine().Idle();
      if (idle || style != DrainStyle::kRetry) break;
      issued_ops.push_back(h.Resume());
      issued_ops.push_back(h.engine().WakeUp());
    }
  }
  h.Drain();
  if (!step_ok) RC_FAIL(step_why);
  if (!idle) {
    const EngineSnapshot snap = h.engine().Snapshot();
    RC_FAIL("not idle: state " + std::to_string(static_cast<int>(snap.state)) + " waiting " +
            std::to_string(snap.waiting) + " running " + std::to_string(snap.running) +
            " ops " + std::to_string(snap.pending_ops) +
            " has_work " + std::to_string(h.engine().HasWork()));
  }
  RC_ASSERT(h.engine().pool().num_referenced() == 0u);
  RC_ASSERT(h.engine().state() == EngineState::kActive);
  for (const auto& [c, cl] : h.clients) {
    RC_ASSERT(cl.dones.size() == 1u);
    RC_ASSERT(cl.tokens_after_done == 0u);
    RC_ASSERT(cl.tokens.size() <= cl.max_tokens);
    // Every emitted token, complete or not, comes from the right KV.
    const std::string why = CheckOutput(cl.prompt, cl.tokens, shape);
    if (!why.empty()) RC_FAIL("client " + std::to_string(c) + ": " + why);
    if (cl.dones[0].reason == FinishReason::kLength) {
      RC_ASSERT(cl.tokens.size() == cl.max_tokens);
    } else {
      RC_ASSERT(cl.dones[0].reason == FinishReason::kAborted);
    }
  }
  for (uint64_t id : issued_ops) {
    RC_ASSERT(h.op_dones.count(id) == 1u);
    RC_ASSERT(h.op_dones.at(id).size() == 1u);
  }
  RC_ASSERT(h.op_dones.size() == issued_ops.size());
  RC_ASSERT(h.mem.bad_writes == 0u);
  RC_ASSERT(h.mem.bad_frees == 0u);
  RC_ASSERT(h.mem.bad_reads == 0u);
  RC_ASSERT(h.mem.foreign_allocates == 0u);
  // A probe after the storm gives the reference output under the current
  // weights.
  const std::vector<Token> probe = MakePrompt(4242, 9);
  RC_ASSERT(h.Add(100000, probe, 5).ok());
  RC_ASSERT(h.RunToIdle(2000));
  RC_ASSERT(Tokens(h.clients.at(100000).tokens) ==
            Reference(probe, h.engine().weights_version(), 5, shape));
}

void ShowOps(const std::vector<RandomOp>& ops) {
  std::string s;
  for (const RandomOp& op : ops) s += Describe(op) + " ";
  RC_LOG() << s << "\n";
}

// As the brief states it: one resume + wake_up at the end, then step until
// idle (bounded).
RC_GTEST_PROP(EnginePropertyTest, RandomInterleavingsDrain, ()) {
  const auto ops = *rc::gen::container<std::vector<RandomOp>>(GenRandomOp(true));
  ShowOps(ops);
  RunInterleaving(ops, DrainStyle::kOnce);
}

// resume + wake_up repeated while draining, no level-0 sleep.
RC_GTEST_PROP(EnginePropertyTest, RandomInterleavingsDrainRetryResumeNoSleep0, ()) {
  const auto ops = *rc::gen::container<std::vector<RandomOp>>(GenRandomOp(false));
  ShowOps(ops);
  RunInterleaving(ops, DrainStyle::kRetry);
}

// Driven as the simulator drives an engine: after resume + wake_up, steps
// only while HasWork(); the engine must not go quiet before it is idle.
RC_GTEST_PROP(EnginePropertyTest, RandomInterleavingsHasWorkDriven, ()) {
  const auto ops = *rc::gen::container<std::vector<RandomOp>>(GenRandomOp(true));
  ShowOps(ops);
  RunInterleaving(ops, DrainStyle::kHasWork);
}

}  // namespace
}  // namespace kvrelay::engine
