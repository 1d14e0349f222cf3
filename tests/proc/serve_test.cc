// serve_test.cc — `kvrelay serve` as a router drives it: real P and D
// processes on loopback, the P/D hand-off done by hand, outputs checked
// token for token against engine::Reference.
//
//   PdTest (shm, tcp, ucx)   sequential and concurrent hand-offs, an abort
//                            on P while D's pull waits, a D client that goes
//                            away mid-load (P slow, or never asked), garbage
//                            on P's control port.
//   TpTest (shm)             P and D with different tp.
//   HttpErrorsTest           malformed requests get 4xx + {"error":{...}}.
//   HttpConnectionsTest      a burst of connections is accepted at once.
//   AdminTest                pause/resume, sleep/wake_up, reset_prefix_cache,
//                            update_weights.
//   LocalLane[Transport]Test control frames on the local lane (shm, tcp,
//                            ucx), ZeroMQ without it, garbage on P's lane;
//                            small tcp writes on P's rank thread.
//   PeerDeathTest            P killed: D answers by --peer-dead-after-s.
//   ShutdownTest             SIGTERM drains and exits 0; open streams end
//                            with finish_reason "abort" and data: [DONE].
//   ShutdownUnderLoadTest    ... also while clients keep coming.
//
// Run against another build: KVRELAY_BIN=/path/to/kvrelay. Only these:
// ctest -L proc.
//
// For ucx, a test is skipped (with the reason) when UCX cannot be used on
// this machine: an engine fails to start with a UCX error, or the first
// hand-off fails with a UCX init error. Randomness is seeded; the seed is
// printed ("[seed] ...") and KVRELAY_PROC_SEED replays it.
#include <signal.h>
#include <sys/wait.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <map>
#include <sstream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "core/wire.h"
#include "proc/harness.h"
#include "runtime/local_lane.h"

namespace kvrelay::proctest {
namespace {

using Clock = std::chrono::steady_clock;
using Tokens = std::vector<engine::Token>;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A plain engine (neither P nor D) with `extra` flags; nullptr, with *err
// saying why, if it did not come up.
std::unique_ptr<Engine> StartPlain(std::vector<std::string> extra, std::string* err) {
  EngineConfig c;
  c.name = "plain";
  c.role = "plain";
  c.extra = std::move(extra);
  return Engine::Start(c, err);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// UCX unusable on this machine (as opposed to a kvrelay bug): the errors
// UcxTransport returns when UCX itself cannot be set up.
bool IsUcxInitError(const std::string& text) {
  const std::string t = Lower(text);
  if (t.find("ucx") == std::string::npos) return false;
  for (const char* marker :
       {"ucp_init", "ucp_config_read", "ucp_worker_create", "ucp_worker_get_address", "tls="}) {
    if (t.find(marker) != std::string::npos) return true;
  }
  return false;
}

// An engine that did not start because UcxTransport could not set UCX up:
// its errors read "ucx: <call>: ..." (a crash, say, does not).
bool IsUcxStartError(const std::string& error) {
  return error.find("ucx:") != std::string::npos || IsUcxInitError(error);
}

bool HasTransfer(const json& state, const char* table, const std::string& transfer) {
  if (!state.is_object() || !state.contains("ranks")) return false;
  for (const json& rank : state["ranks"]) {
    if (!rank.contains(table)) continue;
    for (const json& e : rank[table]) {
      if (e.value("transfer", std::string()) == transfer) return true;
    }
  }
  return false;
}

std::string EngineSummary(Engine& e) {
  json s = e.DebugState();
  return e.config().name + " /debug/state: " + (s.is_null() ? "(no answer)" : s.dump());
}

// A well-formed pull, as a sender that never handshook would send it.
std::vector<uint8_t> StrangerPull() {
  PullMsg pull;
  pull.pull_seq = 2;
  PullItem item;
  item.transfer = TransferId{1, 2};
  item.dst = {BlockId{0, 0}};
  pull.items.push_back(item);
  return EncodeWire(pull);
}

// One hand-off's two replies.
struct Handoff {
  Tokens prompt;
  uint32_t n = 0;
  std::string transfer;
  HttpReply p, d;
};

struct PairConfig {
  uint32_t p_tp = 1, d_tp = 1;
  double abort_timeout_s = 30;
  std::vector<std::string> p_extra, d_extra;
};

class ServeFixture : public ::testing::Test {
 protected:
  ServeFixture() : rng_(TestSeed()) {}

  // Starts P then D; fails the test, or skips it when UCX is unusable here.
  // Then runs one small hand-off as a warm-up (the "first request").
  void StartPair(const std::string& transport, const PairConfig& c) {
    transport_ = transport;
    EngineConfig pc;
    pc.name = "P";
    pc.role = "prefill";
    pc.tp = c.p_tp;
    pc.transport = transport;
    pc.abort_timeout_s = c.abort_timeout_s;
    pc.extra = c.p_extra;
    EngineConfig dc = pc;
    dc.name = "D";
    dc.role = "decode";
    dc.tp = c.d_tp;
    dc.extra = c.d_extra;
    std::string err;
    p_ = Engine::Start(pc, &err);
    if (!p_ && transport == "ucx" && IsUcxStartError(err)) {
      GTEST_SKIP() << "UCX unusable here: the P engine did not start: " << err;
    }
    ASSERT_NE(p_, nullptr) << err;
    d_ = Engine::Start(dc, &err);
    if (!d_ && transport == "ucx" && IsUcxStartError(err)) {
      GTEST_SKIP() << "UCX unusable here: the D engine did not start: " << err;
    }
    ASSERT_NE(d_, nullptr) << err;

    Tokens prompt = RandomPrompt(rng_, 9);
    Handoff h = Sequential(prompt, 4);
    const Choice dc_choice = ChoiceOf(h.d);
    const bool good = dc_choice.ok && dc_choice.tokens == Expected(prompt, 1, 4);
    const std::string metrics = d_->Metrics();
    const double failed = MetricSum(metrics, "kvrelay_loads_total", R"(outcome="failed")");
    // (A crashed engine is a failure, whatever its log says.)
    if (transport == "ucx" && (!good || failed > 0) && p_->proc().Running() &&
        d_->proc().Running()) {
      const std::string everything =
          Describe(h.p) + "\n" + Describe(h.d) + "\n" + p_->proc().ReadLog() + d_->proc().ReadLog();
      if (IsUcxInitError(everything)) {
        GTEST_SKIP() << "UCX unusable here: the first hand-off failed with a UCX init error:\n"
                     << Describe(h.p) << "\n" << Describe(h.d);
      }
    }
    ASSERT_TRUE(good) << "warm-up hand-off failed\nP: " << Describe(h.p)
                      << "\nD: " << Describe(h.d);
  }

  // P's leg on a raw socket, as request `id`: true once P's engine holds it
  // (so P accepted it and knows its id). Nothing is written back before the
  // leg ends, so the engine's state is what tells.
  bool OpenPrefillLeg(RawHttp& leg, const Tokens& prompt, const std::string& transfer,
                      const std::string& id) {
    return leg.Connect(p_->http_port()) &&
           leg.Send("POST", "/v1/completions", PrefillBody(prompt, transfer, d_->tp(), id).dump()) &&
           WaitFor([&] { return EngineHolds(*p_); }, 10s, 2ms);
  }

  // The engine has a request waiting or running.
  static bool EngineHolds(Engine& e) {
    json s = e.DebugState();
    return s.is_object() && s["engine"].is_object() &&
           s["engine"].value("running", 0) + s["engine"].value("waiting", 0) > 0;
  }

  // P's leg, then D's with what P returned.
  Handoff Sequential(const Tokens& prompt, uint32_t n) {
    Handoff h;
    h.prompt = prompt;
    h.n = n;
    h.transfer = NewTransferId(rng_);
    h.p = p_->Post("/v1/completions", PrefillBody(prompt, h.transfer, d_->tp()));
    json params = nullptr;
    if (h.p.is_json() && h.p.body.is_object() && h.p.body.contains("kv_transfer_params")) {
      params = h.p.body["kv_transfer_params"];
    }
    h.d = d_->Post("/v1/completions", DecodeBody(prompt, n, params));
    return h;
  }

  // Both legs at once, with the params a router builds itself; the second
  // leg 50 ms after the first. Thread-safe (no shared rng): `transfer` given.
  Handoff Concurrent(const Tokens& prompt, uint32_t n, const std::string& transfer,
                     bool d_first) {
    Handoff h;
    h.prompt = prompt;
    h.n = n;
    h.transfer = transfer;
    auto send_p = [&] {
      h.p = p_->Post("/v1/completions", PrefillBody(prompt, transfer, d_->tp()), 30s);
    };
    auto send_d = [&] {
      h.d = d_->Post("/v1/completions",
                     DecodeBody(prompt, n, p_->RemotePrefillParams(transfer)), 30s);
    };
    std::thread first([&] { d_first ? send_d() : send_p(); });
    std::this_thread::sleep_for(50ms);
    d_first ? send_p() : send_d();
    first.join();
    return h;
  }

  // `count` concurrent hand-offs in parallel threads (prompts of 1..300
  // tokens, 1..16 output tokens).
  std::vector<Handoff> ConcurrentBatch(int count, bool d_first) {
    std::vector<Tokens> prompts;
    std::vector<uint32_t> ns;
    std::vector<std::string> transfers;
    for (int i = 0; i < count; ++i) {
      prompts.push_back(RandomPrompt(rng_, 1 + rng_() % 300));
      ns.push_back(1 + static_cast<uint32_t>(rng_() % 16));
      transfers.push_back(NewTransferId(rng_));
    }
    std::vector<Handoff> out(static_cast<size_t>(count));
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int i = 0; i < count; ++i) {
      threads.emplace_back([&, i] { out[i] = Concurrent(prompts[i], ns[i], transfers[i], d_first); });
    }
    for (auto& t : threads) t.join();
    std::vector<double> p_lat, d_lat;
    for (const Handoff& h : out) {
      p_lat.push_back(h.p.seconds);
      d_lat.push_back(h.d.seconds);
    }
    std::sort(p_lat.begin(), p_lat.end());
    std::sort(d_lat.begin(), d_lat.end());
    std::printf(
        "[info] %d concurrent hand-offs (%s first) in %.3f s; P legs median %.3f max %.3f s, "
        "D legs median %.3f max %.3f s\n",
        count, d_first ? "D" : "P", SecondsSince(t0), p_lat[p_lat.size() / 2], p_lat.back(),
        d_lat[d_lat.size() / 2], d_lat.back());
    return out;
  }

  // P's reply: one token, the reference's first, and the params D needs.
  void CheckPrefillReply(const Handoff& h, uint64_t version = 1) {
    SCOPED_TRACE("P leg of transfer " + h.transfer + ", prompt of " +
                 std::to_string(h.prompt.size()) + " tokens");
    const Choice c = ChoiceOf(h.p);
    ASSERT_TRUE(c.ok) << Describe(h.p);
    EXPECT_EQ(c.finish_reason, "length") << Describe(h.p);
    EXPECT_EQ(c.tokens, Expected(h.prompt, version, 1)) << Describe(h.p);
    EXPECT_EQ(c.versions, std::vector<uint64_t>(c.tokens.size(), version)) << Describe(h.p);
    ASSERT_TRUE(h.p.body.contains("kv_transfer_params")) << Describe(h.p);
    const json& kv = h.p.body["kv_transfer_params"];
    ASSERT_TRUE(kv.is_object()) << Describe(h.p);
    EXPECT_EQ(kv.value("do_remote_prefill", false), true) << kv.dump();
    EXPECT_EQ(kv.value("transfer_id", std::string()), h.transfer) << kv.dump();
    EXPECT_EQ(kv.value("remote_engine_id", uint64_t{0}), p_->engine_id()) << kv.dump();
    EXPECT_EQ(kv.value("remote_host", std::string()), "127.0.0.1") << kv.dump();
    EXPECT_EQ(kv.value("remote_port", uint64_t{0}), p_->ctrl_port()) << kv.dump();
    EXPECT_EQ(kv.value("remote_tp_size", uint64_t{0}), p_->tp()) << kv.dump();
  }

  // D's reply: exactly the reference's tokens, all under `version`.
  void CheckDecodeReply(const Handoff& h, uint64_t version = 1) {
    SCOPED_TRACE("D leg of transfer " + h.transfer + ", prompt of " +
                 std::to_string(h.prompt.size()) + " tokens, max_tokens " +
                 std::to_string(h.n));
    const Choice c = ChoiceOf(h.d);
    ASSERT_TRUE(c.ok) << Describe(h.d);
    EXPECT_EQ(c.finish_reason, "length") << Describe(h.d);
    EXPECT_EQ(c.tokens, Expected(h.prompt, version, h.n)) << Describe(h.d);
    EXPECT_EQ(c.versions, std::vector<uint64_t>(h.n, version)) << Describe(h.d);
  }

  // Both engines drain: nothing running, no transfer, no block in use (the
  // prefix cache may keep blocks). P frees at its next step, so: polled.
  void ExpectBothIdle(std::chrono::milliseconds bound = 15s) {
    const auto t0 = Clock::now();
    const bool idle =
        WaitFor([&] { return p_->IdleAndEmpty() && d_->IdleAndEmpty(); }, bound, 50ms);
    EXPECT_TRUE(idle) << "not idle within " << bound.count() << " ms\n"
                      << EngineSummary(*p_) << "\n" << EngineSummary(*d_);
    if (idle) std::printf("[info] both engines idle after %.3f s\n", SecondsSince(t0));
  }

  // D loaded KV (instead of recomputing everything) and no load failed.
  void ExpectLoadsOk(double at_least) {
    const std::string m = d_->Metrics();
    const double ok = MetricSum(m, "kvrelay_loads_total", R"(outcome="ok")");
    const double failed = MetricSum(m, "kvrelay_loads_total", R"(outcome="failed")");
    const double bytes = MetricSum(p_->Metrics(), "kvrelay_bytes_moved_total");
    std::printf("[info] D loads ok %.0f, failed %.0f; P moved %.0f bytes\n", ok, failed, bytes);
    EXPECT_GE(ok, at_least) << "D's loads (recomputing hides a broken transfer)";
    EXPECT_EQ(failed, 0) << "D's failed loads";
    EXPECT_GT(bytes, 0) << "P's bytes moved";
  }

  std::string transport_;
  std::mt19937_64 rng_;
  std::unique_ptr<Engine> p_, d_;
};

#define START_PAIR(transport, config)                      \
  do {                                                     \
    ASSERT_NO_FATAL_FAILURE(StartPair(transport, config)); \
    if (IsSkipped()) return;                               \
  } while (0)

// --- over every transport -------------------------------------------------------------

class PdTest : public ServeFixture, public ::testing::WithParamInterface<std::string> {
 protected:
  void AbortOnP(const std::string& policy);
};

// 1. P then D, 20 prompts of 1..300 tokens (some sharing prefixes, one
// repeated): D's output is the reference's; afterwards both engines idle.
TEST_P(PdTest, SequentialHandoff) {
  START_PAIR(GetParam(), PairConfig{});
  std::vector<Tokens> prompts;
  for (size_t len : {1, 2, 3, 4, 5, 8, 9, 16, 17, 63, 64, 65, 128, 255, 299, 300}) {
    prompts.push_back(RandomPrompt(rng_, len));
  }
  const Tokens base = prompts.back();   // 300 tokens (a copy: push_back reallocates)
  for (size_t shared : {100, 101, 297}) {
    Tokens p(base.begin(), base.begin() + static_cast<long>(shared));
    Tokens tail = RandomPrompt(rng_, 1 + rng_() % (300 - shared));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  prompts.push_back(base);   // the very same prompt again
  ASSERT_EQ(prompts.size(), 20u);

  for (size_t i = 0; i < prompts.size(); ++i) {
    const uint32_t n = i % 5 == 0 ? 1 : 1 + static_cast<uint32_t>(rng_() % 24);
    Handoff h = Sequential(prompts[i], n);
    SCOPED_TRACE("prompt #" + std::to_string(i));
    CheckPrefillReply(h);
    CheckDecodeReply(h);
  }
  ExpectBothIdle();
  ExpectLoadsOk(10);
}

// 2. Both legs at once, as the router sends them: 20 hand-offs in parallel
// threads, D's leg first and P's 50 ms later, then the other way.
TEST_P(PdTest, ConcurrentLegsDFirst) {
  START_PAIR(GetParam(), PairConfig{});
  std::vector<Handoff> results = ConcurrentBatch(20, /*d_first=*/true);
  for (size_t i = 0; i < results.size(); ++i) {
    SCOPED_TRACE("concurrent hand-off #" + std::to_string(i));
    CheckPrefillReply(results[i]);
    CheckDecodeReply(results[i]);
  }
  ExpectBothIdle();
  ExpectLoadsOk(10);
}

// 2b. D's leg first with P streaming (--stream-chunks, 48-token steps):
// D's pulls wait at P and are written chunk by chunk while the prefill goes
// on; D's output is still the reference's, token for token.
TEST_P(PdTest, StreamedChunksDFirst) {
  PairConfig c;
  c.p_extra = {"--stream-chunks", "--max-batch-tokens", "48"};
  START_PAIR(GetParam(), c);
  std::vector<Handoff> results = ConcurrentBatch(20, /*d_first=*/true);
  for (size_t i = 0; i < results.size(); ++i) {
    SCOPED_TRACE("streamed hand-off #" + std::to_string(i));
    CheckPrefillReply(results[i]);
    CheckDecodeReply(results[i]);
  }
  ExpectBothIdle();
  ExpectLoadsOk(10);
  const std::string m = p_->Metrics();
  const double chunks = MetricSum(m, "kvrelay_prefill_chunks_streamed_total");
  const double writes = MetricSum(m, "kvrelay_chunk_writes_total");
  std::printf("[info] P offered %.0f chunks; %.0f writes of part of a pull\n", chunks, writes);
  EXPECT_GT(chunks, 0);
  EXPECT_GT(writes, 0) << "no pull was written chunk by chunk";
}

TEST_P(PdTest, ConcurrentLegsPFirst) {
  START_PAIR(GetParam(), PairConfig{});
  std::vector<Handoff> results = ConcurrentBatch(20, /*d_first=*/false);
  for (size_t i = 0; i < results.size(); ++i) {
    SCOPED_TRACE("concurrent hand-off #" + std::to_string(i));
    CheckPrefillReply(results[i]);
    CheckDecodeReply(results[i]);
  }
  ExpectBothIdle();
  ExpectLoadsOk(10);
}

// 4. P's request is aborted (POST /abort_requests) while its prefill runs and
// D's pull for it waits: D must answer promptly — recomputing (the default
// policy: correct tokens) or, with --load-failure-policy fail, with "error" —
// not after the 30 s abort timeout.
//
// P's prefill is made slow and chunked (--step-per-token-us, a small
// --max-batch-tokens) so that it spans many steps and the abort lands
// between two of them, before the prefill completes.
void PdTest::AbortOnP(const std::string& policy) {
  std::unique_ptr<Engine>& p = p_;
  std::unique_ptr<Engine>& d = d_;
  const Tokens prompt = RandomPrompt(rng_, 300);
  const uint32_t n = 8;
  const std::string transfer = NewTransferId(rng_);

  // P's leg on a raw socket: its response headers prove P accepted "p1"
  // (and knows its id) before the abort is sent.
  RawHttp p_leg;
  ASSERT_TRUE(OpenPrefillLeg(p_leg, prompt, transfer, "p1")) << "P did not accept the prefill leg";
  const auto p_accepted = Clock::now();

  HttpReply d_reply;
  std::thread d_leg([&] {
    d_reply = d->Post("/v1/completions", DecodeBody(prompt, n, p->RemotePrefillParams(transfer)),
                      40s);
  });
  // D's pull is out (its load is registered) before P is told to abort.
  const bool pulled = WaitFor([&] { return HasTransfer(d->DebugState(), "loads", transfer); },
                              3s, 5ms);
  EXPECT_TRUE(pulled) << "D never registered a load for " << transfer << "\n"
                      << EngineSummary(*d);
  HttpReply abort = p->Post("/abort_requests", json{{"request_ids", {"p1"}}});
  const double abort_sent_after = SecondsSince(p_accepted);
  EXPECT_EQ(abort.status, 200) << Describe(abort);
  d_leg.join();
  std::printf("[info] abort sent %.3f s after P accepted; D answered in %.3f s (%s policy)\n",
              abort_sent_after, d_reply.seconds, policy.c_str());

  // The premise: the abort landed before P's prefill finished.
  const std::string p_body = p_leg.ReadRest(10s);
  EXPECT_NE(p_body.find(R"("finish_reason":"abort")"), std::string::npos)
      << "P's leg did not end aborted (did the prefill finish before the abort landed?): "
      << p_body;

  EXPECT_LT(d_reply.seconds, 5.0) << "D answered only after " << d_reply.seconds
                                  << " s (abort timeout is 30 s): " << Describe(d_reply);
  if (policy == "fail") {
    // The request failed before a byte was sent: its own status.
    EXPECT_EQ(d_reply.status, 503) << Describe(d_reply);
    EXPECT_TRUE(d_reply.is_json() && d_reply.body.contains("error")) << Describe(d_reply);
  } else {
    const Choice c = ChoiceOf(d_reply);
    ASSERT_TRUE(c.ok) << Describe(d_reply);
    EXPECT_EQ(c.finish_reason, "length") << Describe(d_reply);
    EXPECT_EQ(c.tokens, Expected(prompt, 1, n)) << Describe(d_reply);
    EXPECT_EQ(c.versions, std::vector<uint64_t>(n, 1)) << Describe(d_reply);
  }
}

PairConfig SlowPrefillConfig(double abort_timeout_s) {
  PairConfig c;
  c.abort_timeout_s = abort_timeout_s;
  // 300 tokens in chunks of 16 at 4 ms a token: ~1.2 s over ~19 steps.
  c.p_extra = {"--step-per-token-us", "4000", "--max-batch-tokens", "16"};
  return c;
}

TEST_P(PdTest, AbortOnPWhileDPullsRecomputes) {
  START_PAIR(GetParam(), SlowPrefillConfig(30));
  ASSERT_NO_FATAL_FAILURE(AbortOnP("recompute"));
  ExpectBothIdle();
}

TEST_P(PdTest, AbortOnPWhileDPullsFailPolicy) {
  PairConfig c = SlowPrefillConfig(30);
  c.d_extra = {"--load-failure-policy", "fail"};
  START_PAIR(GetParam(), c);
  ASSERT_NO_FATAL_FAILURE(AbortOnP("fail"));
  ExpectBothIdle();
}

// 4b. The fast abort. P's engine models a busy GPU (--busy-steps): an input
// that arrives during a step waits for its end, as in vLLM's engine core.
// Each step takes 3 s. D's pull waits on the send of a prefill that has
// just started its first step, and P gets abort_requests for it. With the
// fast abort (the default), P's server ends the send straight at the
// ranks, and D is answered within a fraction of the step. With
// --no-fast-abort, the engine applies the abort only at the step's end, so
// D waits most of the 3 s: the same test's control, showing the first can
// fail.
class FastAbortTest : public ServeFixture {
 protected:
  // Seconds from the abort's send to D's reply (D recomputes: its policy).
  double AbortDuringBusyStep(bool fast) {
    PairConfig c;
    c.abort_timeout_s = 30;
    c.p_extra = {"--busy-steps", "--step-base-us", "3000000", "--max-batch-tokens", "16"};
    if (!fast) c.p_extra.push_back("--no-fast-abort");
    StartPair("shm", c);
    if (HasFatalFailure()) return -1;
    const Tokens prompt = RandomPrompt(rng_, 64);  // four steps of 16 tokens
    const uint32_t n = 4;
    const std::string transfer = NewTransferId(rng_);
    RawHttp p_leg;
    EXPECT_TRUE(OpenPrefillLeg(p_leg, prompt, transfer, "fast-abort-p"))
        << "P did not accept the prefill leg";
    const auto p_accepted = Clock::now();
    HttpReply d_reply;
    Clock::time_point d_done;
    std::thread d_leg([&] {
      d_reply = d_->Post("/v1/completions",
                         DecodeBody(prompt, n, p_->RemotePrefillParams(transfer)), 40s);
      d_done = Clock::now();
    });
    const bool pulled =
        WaitFor([&] { return HasTransfer(d_->DebugState(), "loads", transfer); }, 2s, 5ms);
    EXPECT_TRUE(pulled) << "D never registered a load for " << transfer;
    const auto abort_sent = Clock::now();
    // abort_requests itself returns when the engine ran it: after the step.
    HttpReply abort;
    std::thread aborter([&] {
      abort = p_->Post("/abort_requests", json{{"request_ids", {"fast-abort-p"}}}, 20s);
    });
    d_leg.join();
    aborter.join();
    const double answered_s = std::chrono::duration<double>(d_done - abort_sent).count();
    std::printf("[info] %s: abort sent %.3f s into P's first 3 s step; D replied %.3f s "
                "after it\n",
                fast ? "fast abort" : "--no-fast-abort",
                std::chrono::duration<double>(abort_sent - p_accepted).count(), answered_s);
    EXPECT_EQ(abort.status, 200) << Describe(abort);
    const std::string p_body = p_leg.ReadRest(10s);
    EXPECT_NE(p_body.find(R"("finish_reason":"abort")"), std::string::npos)
        << "P's leg did not end aborted: " << p_body;
    const Choice choice = ChoiceOf(d_reply);
    EXPECT_TRUE(choice.ok) << Describe(d_reply);
    EXPECT_EQ(choice.finish_reason, "length") << Describe(d_reply);
    EXPECT_EQ(choice.tokens, Expected(prompt, 1, n)) << Describe(d_reply);
    const double fast_aborts = MetricSum(p_->Metrics(), "kvrelay_fast_aborts_total");
    EXPECT_EQ(fast_aborts, fast ? 1 : 0);
    // The rank applied it at once, not at the step's end.
    const std::string metrics = p_->Metrics();
    EXPECT_EQ(MetricSum(metrics, "kvrelay_fast_abort_wait_seconds_count"), fast_aborts);
    EXPECT_LT(MetricSum(metrics, "kvrelay_fast_abort_wait_seconds_sum"), 1.0);
    ExpectBothIdle();
    return answered_s;
  }
};

TEST_F(FastAbortTest, AnswersDWithoutWaitingForTheStep) {
  const double s = AbortDuringBusyStep(true);
  EXPECT_GE(s, 0);
  EXPECT_LT(s, 1.5) << "D's answer waited for P's step";
}

TEST_F(FastAbortTest, WithoutItDWaitsForTheStep) {
  const double s = AbortDuringBusyStep(false);
  EXPECT_GE(s, 1.5) << "the abort did not wait for the busy step: the other test proves nothing";
}

// 5. D's client goes away while D's load waits for a slow prefill: both
// engines end idle with no block in use (P's send ends by the 5 s abort
// timeout at worst), and a hand-off after works.
TEST_P(PdTest, DClientDisconnectsMidLoad) {
  PairConfig c = SlowPrefillConfig(5);
  c.p_extra.insert(c.p_extra.end(), {"--giveup-grace-s", "5"});
  c.d_extra = {"--giveup-grace-s", "5"};
  START_PAIR(GetParam(), c);
  const Tokens prompt = RandomPrompt(rng_, 300);
  const std::string transfer = NewTransferId(rng_);

  RawHttp d_leg;
  ASSERT_TRUE(d_leg.Connect(d_->http_port()));
  ASSERT_TRUE(d_leg.Send("POST", "/v1/completions",
                         DecodeBody(prompt, 8, p_->RemotePrefillParams(transfer)).dump()));
  ASSERT_TRUE(WaitFor([&] { return HasTransfer(d_->DebugState(), "loads", transfer); }, 5s,
                      5ms))
      << "D never registered a load for " << transfer << "\n" << EngineSummary(*d_);

  HttpReply p_reply;
  std::thread p_leg([&] {
    p_reply = p_->Post("/v1/completions", PrefillBody(prompt, transfer, d_->tp()), 30s);
  });
  // P is prefilling (~1.2 s): D's client leaves now.
  EXPECT_TRUE(WaitFor(
      [&] {
        json s = p_->DebugState();
        return s.is_object() && s["engine"].is_object() &&
               s["engine"].value("running", 0) + s["engine"].value("waiting", 0) > 0;
      },
      5s, 5ms))
      << EngineSummary(*p_);
  d_leg.Close();
  const auto left = Clock::now();
  EXPECT_TRUE(WaitFor(
      [&] { return MetricSum(d_->Metrics(), "kvrelay_client_disconnects_total") >= 1; }, 5s))
      << "D did not notice its client leaving";
  p_leg.join();
  EXPECT_EQ(p_reply.status, 200) << Describe(p_reply);
  ExpectBothIdle(20s);
  std::printf("[info] idle %.3f s after D's client left\n", SecondsSince(left));

  Handoff h = Sequential(RandomPrompt(rng_, 40), 6);
  CheckPrefillReply(h);
  CheckDecodeReply(h);
}

// 5b. The same, but P never gets its leg: D's client leaves while the pull
// waits for a prefill that never comes.
TEST_P(PdTest, DClientDisconnectsPNeverAsked) {
  PairConfig c;
  c.abort_timeout_s = 5;
  c.p_extra = {"--giveup-grace-s", "5"};
  c.d_extra = {"--giveup-grace-s", "5"};
  START_PAIR(GetParam(), c);
  const Tokens prompt = RandomPrompt(rng_, 120);
  const std::string transfer = NewTransferId(rng_);
  RawHttp d_leg;
  ASSERT_TRUE(d_leg.Connect(d_->http_port()));
  ASSERT_TRUE(d_leg.Send("POST", "/v1/completions",
                         DecodeBody(prompt, 8, p_->RemotePrefillParams(transfer)).dump()));
  ASSERT_TRUE(WaitFor([&] { return HasTransfer(d_->DebugState(), "loads", transfer); }, 5s,
                      5ms))
      << EngineSummary(*d_);
  d_leg.Close();
  const auto left = Clock::now();
  ExpectBothIdle(20s);
  std::printf("[info] idle %.3f s after D's client left\n", SecondsSince(left));
  Handoff h = Sequential(RandomPrompt(rng_, 40), 6);
  CheckPrefillReply(h);
  CheckDecodeReply(h);
}

// 6. Garbage on P's control port (a ZeroMQ DEALER): random bytes, a valid
// magic with a bad version, a huge payload length, an empty frame, an
// unknown type, extra frames, a pull before any handshake, a handshake with a
// foreign layout, an oversized frame. P keeps serving; each kind of
// malformed frame is logged at most once and always counted.
class Dealer {
 public:
  explicit Dealer(uint16_t port) : ctx_(zmq_ctx_new()) {
    sock_ = zmq_socket(ctx_, ZMQ_DEALER);
    const int zero = 0;
    zmq_setsockopt(sock_, ZMQ_LINGER, &zero, sizeof zero);
    const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
    ok_ = zmq_connect(sock_, ep.c_str()) == 0;
  }
  ~Dealer() {
    zmq_close(sock_);
    zmq_ctx_term(ctx_);
  }
  bool ok() const { return ok_; }
  bool Send(const std::vector<uint8_t>& frame, bool more = false) {
    return zmq_send(sock_, frame.data(), frame.size(), more ? ZMQ_SNDMORE : 0) ==
           static_cast<int>(frame.size());
  }

 private:
  void* ctx_;
  void* sock_;
  bool ok_ = false;
};

void PutU16(std::vector<uint8_t>& f, size_t at, uint16_t v) {
  f[at] = static_cast<uint8_t>(v);
  f[at + 1] = static_cast<uint8_t>(v >> 8);
}
void PutU32(std::vector<uint8_t>& f, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) f[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

TEST_P(PdTest, MalformedWireMessages) {
  START_PAIR(GetParam(), PairConfig{});
  const double malformed_before =
      MetricSum(p_->Metrics(), "kvrelay_control_frames_malformed_total");
  const std::vector<uint8_t> heartbeat = EncodeWire(HeartbeatMsg{7, 1});
  {
    Dealer dealer(p_->ctrl_port());
    ASSERT_TRUE(dealer.ok());
    int malformed_sent = 0;
    for (int round = 0; round < 3; ++round) {
      std::vector<uint8_t> random(1 + rng_() % 200);
      for (auto& b : random) b = static_cast<uint8_t>(rng_());
      if (random.size() >= 4) random[0] ^= 0x80;   // never the magic
      ASSERT_TRUE(dealer.Send(random));

      std::vector<uint8_t> bad_version = heartbeat;
      PutU16(bad_version, 4, kWireVersion + 1);
      ASSERT_TRUE(dealer.Send(bad_version));

      std::vector<uint8_t> huge = heartbeat;
      PutU32(huge, 8, 0xFFFFFFF0u);
      ASSERT_TRUE(dealer.Send(huge));

      ASSERT_TRUE(dealer.Send({}));

      std::vector<uint8_t> unknown_type = heartbeat;
      PutU16(unknown_type, 6, 99);
      ASSERT_TRUE(dealer.Send(unknown_type));
      malformed_sent += 5;

      // One message of two frames: the second is dropped and counted.
      ASSERT_TRUE(dealer.Send(heartbeat, /*more=*/true));
      ASSERT_TRUE(dealer.Send(heartbeat));
      malformed_sent += 1;
    }
    // Well-formed but not allowed: a pull from a sender that never
    // handshook, a handshake whose KV layout is not P's.
    ASSERT_TRUE(dealer.Send(StrangerPull()));
    HandshakeMsg hs;
    hs.engine_id = 4242;
    hs.incarnation = 1;
    hs.tp = 1;
    hs.role = 1;
    hs.transport = 0;
    hs.layers = 99;
    hs.kv_heads = 4;
    hs.head_dim = 8;
    hs.dtype_bytes = 2;
    hs.block_tokens = 4;
    hs.num_blocks = 16;
    ASSERT_TRUE(dealer.Send(EncodeWire(hs)));

    const bool counted = WaitFor(
        [&] {
          return MetricSum(p_->Metrics(), "kvrelay_control_frames_malformed_total") -
                     malformed_before >=
                 malformed_sent;
        },
        5s);
    EXPECT_TRUE(counted) << "kvrelay_control_frames_malformed_total grew by "
                         << MetricSum(p_->Metrics(), "kvrelay_control_frames_malformed_total") -
                                malformed_before
                         << ", expected at least " << malformed_sent;
  }
  {
    // Over ZeroMQ's message size limit (16 MiB): the connection is dropped.
    Dealer big(p_->ctrl_port());
    ASSERT_TRUE(big.ok());
    ASSERT_TRUE(big.Send(std::vector<uint8_t>((16u << 20) + 64, 0xAB)));
  }

  // P still serves: a hand-off, /metrics and /debug/state.
  for (int i = 0; i < 3; ++i) {
    Handoff h = Sequential(RandomPrompt(rng_, 1 + rng_() % 200), 5);
    CheckPrefillReply(h);
    CheckDecodeReply(h);
  }
  HttpReply m = p_->Get("/metrics");
  EXPECT_EQ(m.status, 200) << Describe(m);
  EXPECT_NE(m.raw.find("kvrelay_control_frames_malformed_total"), std::string::npos);
  HttpReply s = p_->Get("/debug/state");
  EXPECT_EQ(s.status, 200) << Describe(s);
  EXPECT_TRUE(s.is_json()) << Describe(s);
  EXPECT_GE(MetricSum(m.raw, "kvrelay_control_unknown_sender_total"), 1);
  EXPECT_GE(MetricSum(m.raw, "kvrelay_handshakes_refused_total"), 1);

  // At most one log line per kind of malformed frame (kind: the status code).
  std::map<std::string, int> per_kind;
  int lines = 0;
  std::istringstream log(p_->proc().ReadLog());
  std::string line;
  const std::string marker = "malformed control frame: ";
  while (std::getline(log, line)) {
    if (line.find("malformed") == std::string::npos) continue;
    ++lines;
    std::string kind = line;
    if (size_t at = line.find(marker); at != std::string::npos) {
      kind = line.substr(at + marker.size());
      kind = kind.substr(0, kind.find(':'));
    } else if (size_t close = line.find("] "); close != std::string::npos) {
      kind = line.substr(close + 2);   // drop the timestamp
    }
    ++per_kind[kind];
  }
  EXPECT_GE(lines, 1) << "no malformed frame was logged";
  for (const auto& [kind, count] : per_kind) {
    EXPECT_LE(count, 1) << "logged " << count << " times: " << kind;
  }
  std::printf("[info] %d log lines about malformed frames, %zu kinds\n", lines, per_kind.size());
  ExpectBothIdle();
}

INSTANTIATE_TEST_SUITE_P(Transports, PdTest, ::testing::Values("shm", "tcp", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// --- 3. tp combinations (shm) ---------------------------------------------------------

class TpTest : public ServeFixture,
               public ::testing::WithParamInterface<std::pair<uint32_t, uint32_t>> {};

TEST_P(TpTest, HandoffAcrossTp) {
  PairConfig c;
  c.p_tp = GetParam().first;
  c.d_tp = GetParam().second;
  START_PAIR("shm", c);
  for (int i = 0; i < 10; ++i) {
    Handoff h = Sequential(RandomPrompt(rng_, 1 + rng_() % 300),
                           1 + static_cast<uint32_t>(rng_() % 16));
    SCOPED_TRACE("sequential #" + std::to_string(i));
    CheckPrefillReply(h);
    CheckDecodeReply(h);
  }
  for (bool d_first : {true, false}) {
    std::vector<Handoff> results = ConcurrentBatch(8, d_first);
    for (size_t i = 0; i < results.size(); ++i) {
      SCOPED_TRACE(std::string("concurrent, ") + (d_first ? "D" : "P") + " first, #" +
                   std::to_string(i));
      CheckPrefillReply(results[i]);
      CheckDecodeReply(results[i]);
    }
  }
  ExpectBothIdle();
  ExpectLoadsOk(10);
}

INSTANTIATE_TEST_SUITE_P(
    Shm, TpTest,
    ::testing::Values(std::make_pair(2u, 1u), std::make_pair(1u, 2u), std::make_pair(4u, 2u),
                      std::make_pair(2u, 4u)),
    [](const ::testing::TestParamInfo<std::pair<uint32_t, uint32_t>>& i) {
      return "P" + std::to_string(i.param.first) + "_D" + std::to_string(i.param.second);
    });

// --- 7. malformed HTTP ------------------------------------------------------------------

class HttpErrorsTest : public ServeFixture {};

// A 4xx (or the given status) with {"error": {"message": "..."}}.
void ExpectJsonError(const HttpReply& r, int status, const std::string& what) {
  SCOPED_TRACE(what);
  if (status != 0) {
    EXPECT_EQ(r.status, status) << Describe(r);
  } else {
    EXPECT_GE(r.status, 400) << Describe(r);
    EXPECT_LT(r.status, 500) << Describe(r);
  }
  ASSERT_TRUE(r.is_json()) << Describe(r);
  ASSERT_TRUE(r.body.is_object() && r.body.contains("error") && r.body["error"].is_object())
      << Describe(r);
  const json& e = r.body["error"];
  ASSERT_TRUE(e.contains("message") && e["message"].is_string()) << Describe(r);
  EXPECT_FALSE(e["message"].get<std::string>().empty()) << Describe(r);
}

TEST_F(HttpErrorsTest, BadRequestsGet4xxAndTheEngineKeepsServing) {
  START_PAIR("shm", PairConfig{});
  const Tokens ok_prompt = RandomPrompt(rng_, 10);
  const json prompt = ok_prompt;
  struct Case {
    std::string name, path, body;
    int status;   // 0: any 4xx
  };
  std::vector<Case> cases = {
      {"truncated JSON", "/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 4)", 400},
      {"not JSON", "/v1/completions", "prompt=1,2,3", 400},
      {"not an object", "/v1/completions", "[1, 2, 3]", 400},
      {"empty body", "/v1/completions", "", 400},
      {"missing prompt", "/v1/completions", R"({"max_tokens": 4})", 400},
      {"empty prompt", "/v1/completions", R"({"prompt": [], "max_tokens": 4})", 400},
      {"max_tokens 0", "/v1/completions",
       json{{"prompt", prompt}, {"max_tokens", 0}}.dump(), 400},
      {"max_tokens negative", "/v1/completions",
       json{{"prompt", prompt}, {"max_tokens", -3}}.dump(), 400},
      {"max_tokens too large", "/v1/completions",
       json{{"prompt", prompt}, {"max_tokens", 100000}}.dump(), 400},
      {"max_tokens not an integer", "/v1/completions",
       json{{"prompt", prompt}, {"max_tokens", 2.5}}.dump(), 400},
      {"prompt longer than the context", "/v1/completions",
       json{{"prompt", RandomPrompt(rng_, 1100)}, {"max_tokens", 1}}.dump(), 400},
      {"prompt + max_tokens over the context", "/v1/completions",
       json{{"prompt", RandomPrompt(rng_, 1000)}, {"max_tokens", 100}}.dump(), 400},
      {"string token id", "/v1/completions", R"({"prompt": [1, "two", 3], "max_tokens": 2})",
       400},
      {"fractional token id", "/v1/completions", R"({"prompt": [1, 2.5, 3], "max_tokens": 2})",
       400},
      {"negative token id", "/v1/completions", R"({"prompt": [1, -2, 3], "max_tokens": 2})",
       400},
      {"token id beyond the vocabulary", "/v1/completions",
       R"({"prompt": [1, 32000, 3], "max_tokens": 2})", 400},
      {"batched prompts", "/v1/completions", R"({"prompt": [[1, 2], [3]], "max_tokens": 2})",
       400},
      {"prompt of the wrong type", "/v1/completions", R"({"prompt": 17, "max_tokens": 2})", 400},
      {"another model", "/v1/completions",
       json{{"prompt", prompt}, {"model", "gpt-17"}}.dump(), 400},
      {"bad transfer_id", "/v1/completions",
       json{{"prompt", prompt},
            {"kv_transfer_params", {{"do_remote_decode", true}, {"transfer_id", "xyz"}}}}
           .dump(),
       400},
      {"do_remote_prefill without its fields", "/v1/completions",
       json{{"prompt", prompt},
            {"kv_transfer_params",
             {{"do_remote_prefill", true}, {"transfer_id", std::string(32, 'a')}}}}
           .dump(),
       400},
      {"bad tp size", "/v1/completions",
       json{{"prompt", prompt},
            {"kv_transfer_params",
             {{"do_remote_decode", true},
              {"transfer_id", std::string(32, 'b')},
              {"consumer_tp_size", 3}}}}
           .dump(),
       400},
      {"unknown pause mode", "/pause?mode=zzz", "", 400},
      {"unknown query parameter", "/pause?mood=abort", "", 400},
      {"bad sleep level", "/sleep?level=7", "", 400},
      {"bad bool", "/reset_prefix_cache?reset_running_requests=maybe", "", 400},
      {"update_weights version 0", "/update_weights", R"({"version": 0})", 400},
      {"update_weights version not a number", "/update_weights", R"({"version": "two"})",
       400},
      {"update_weights unknown field", "/update_weights", R"({"version": 2, "force": true})",
       400},
      {"abort_requests ids not a list", "/abort_requests", R"({"request_ids": 5})", 400},
      {"body on a query-only endpoint", "/resume", R"({"now": true})", 400},
      {"unknown endpoint", "/v1/chat/nothing", "{}", 404},
      {"body over 1 MiB", "/v1/completions",
       R"({"prompt": ")" + std::string((1u << 20) + 100, 'x') + R"("})", 413},
  };
  for (Engine* e : {p_.get(), d_.get()}) {
    for (const Case& c : cases) {
      HttpReply r = e->PostRaw(c.path, c.body);
      ExpectJsonError(r, c.status, e->config().name + ": " + c.name);
    }
    // GET on a POST-only endpoint, and an unknown GET.
    ExpectJsonError(e->Get("/v1/completions"), 0, e->config().name + ": GET /v1/completions");
    ExpectJsonError(e->Get("/no/such/thing"), 404, e->config().name + ": GET unknown");
  }
  // A leg sent to the engine of the wrong role.
  const std::string t = NewTransferId(rng_);
  ExpectJsonError(p_->Post("/v1/completions", DecodeBody(ok_prompt, 4, p_->RemotePrefillParams(t))),
                  0, "do_remote_prefill sent to a prefill engine");
  ExpectJsonError(d_->Post("/v1/completions", PrefillBody(ok_prompt, t, 1)), 0,
                  "do_remote_decode sent to a decode engine");

  // A D leg naming a P engine that is not there (an id no engine has, a
  // port nothing listens on): refused with 503 once the handshake times out.
  json nowhere = p_->RemotePrefillParams(NewTransferId(rng_));
  nowhere["remote_engine_id"] = 4321;
  nowhere["remote_port"] = FreePort();
  HttpReply r = d_->Post("/v1/completions", DecodeBody(ok_prompt, 4, nowhere), 30s);
  EXPECT_LT(r.seconds, 10.0) << Describe(r);
  ExpectJsonError(r, 503, "D leg naming an absent P");

  // Nothing was applied: both engines active, and a hand-off works.
  for (Engine* e : {p_.get(), d_.get()}) {
    json s = e->DebugState();
    ASSERT_TRUE(s.is_object()) << e->config().name;
    EXPECT_EQ(s["engine"].value("state", std::string()), "active") << s.dump();
    EXPECT_EQ(s["engine"].value("weights_version", uint64_t{0}), 1u) << s.dump();
  }
  Handoff h = Sequential(ok_prompt, 6);
  CheckPrefillReply(h);
  CheckDecodeReply(h);
  ExpectBothIdle(30s);
}

// A router opens many connections at once. Each must be accepted at once:
// a SYN the listen queue drops is retried by the client only after 1 s.
TEST(HttpConnectionsTest, BurstOfConnectionsIsAcceptedPromptly) {
  std::string err;
  std::unique_ptr<Engine> e = StartPlain({}, &err);
  ASSERT_NE(e, nullptr) << err;
  constexpr int kClients = 32;
  std::vector<HttpReply> replies(kClients);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (!go.load()) std::this_thread::yield();
      replies[i] = e->Get("/health", 10s);
    });
  }
  while (ready.load() < kClients) std::this_thread::yield();
  go = true;
  for (auto& t : threads) t.join();
  double worst = 0;
  int slow = 0;
  for (const HttpReply& r : replies) {
    EXPECT_EQ(r.status, 200) << Describe(r);
    worst = std::max(worst, r.seconds);
    if (r.seconds >= 0.9) ++slow;
  }
  std::printf("[info] %d simultaneous GET /health: slowest %.3f s, %d took >= 0.9 s\n",
              kClients, worst, slow);
  EXPECT_EQ(slow, 0) << "connections waited for a SYN retry (listen backlog overflowed?); "
                        "slowest "
                     << worst << " s";
}

// serve --port 0 (and no --ctrl-port, no --engine-id): a free HTTP port, tp
// free control ports, a random engine id; the start line prints both ports
// and /kv_info agrees. Two such engines never share an id.
TEST(HttpConnectionsTest, PortZeroPicksFreePortsAndNeverDerivesTheIdFromIt) {
  std::vector<std::unique_ptr<Proc>> procs;
  std::vector<uint32_t> ids;
  for (int i = 0; i < 2; ++i) {
    std::string err;
    const std::string log = TestDir() + "/port0-" + std::to_string(i) + ".log";
    procs.push_back(Proc::Start(KvrelayBinary(),
                                {"serve", "--role", "prefill", "--tp", "2", "--port", "0"}, log,
                                &err));
    ASSERT_NE(procs.back(), nullptr) << err;
    std::smatch m;
    const std::regex start_line(R"(http 127\.0\.0\.1:(\d+), control 127\.0\.0\.1:(\d+)\+rank)");
    std::string text;
    ASSERT_TRUE(WaitFor([&] {
      text = procs.back()->ReadLog();
      return std::regex_search(text, m, start_line);
    }, 20s)) << text;
    const int http_port = std::stoi(m[1].str()), ctrl_port = std::stoi(m[2].str());
    EXPECT_GT(http_port, 0);
    EXPECT_NE(ctrl_port, 1000) << "the control port came from --port 0";
    EXPECT_GT(ctrl_port, 1023);
    HttpReply info = GetOn(static_cast<uint16_t>(http_port), "/kv_info");
    ASSERT_EQ(info.status, 200) << Describe(info);
    EXPECT_EQ(info.body.value("kv_port", 0), ctrl_port);
    ids.push_back(info.body.value("engine_id", 0u));
    EXPECT_NE(ids.back(), 0u);
    EXPECT_NE(ids.back(), static_cast<uint32_t>(http_port));
    EXPECT_LT(ids.back(), 1u << 28);
  }
  EXPECT_NE(ids[0], ids[1]);
}

// --- 8. admin calls ---------------------------------------------------------------------

class AdminTest : public ServeFixture {
 protected:
  void Call(Engine& e, const std::string& path, const json& body = nullptr) {
    HttpReply r = body.is_null() ? e.PostRaw(path, "") : e.Post(path, body);
    EXPECT_EQ(r.status, 200) << e.config().name << " POST " << path << ": " << Describe(r);
    EXPECT_TRUE(r.is_json() && r.body.value("ok", false))
        << e.config().name << " POST " << path << ": " << Describe(r);
  }
  json EngineState(Engine& e) {
    json s = e.DebugState();
    return s.is_object() ? s["engine"] : json();
  }
  bool IsSleeping(Engine& e) {
    HttpReply r = e.Get("/is_sleeping");
    EXPECT_EQ(r.status, 200) << Describe(r);
    return r.is_json() && r.body.value("is_sleeping", false);
  }
  void HandoffWorks(uint64_t version) {
    Handoff h = Sequential(RandomPrompt(rng_, 1 + rng_() % 200),
                           1 + static_cast<uint32_t>(rng_() % 12));
    CheckPrefillReply(h, version);
    CheckDecodeReply(h, version);
  }
};

TEST_F(AdminTest, LifecycleCallsUnderNoLoad) {
  START_PAIR("shm", PairConfig{});
  for (Engine* e : {p_.get(), d_.get()}) {
    SCOPED_TRACE(e->config().name);
    Call(*e, "/pause?mode=abort");
    EXPECT_EQ(EngineState(*e).value("state", std::string()), "paused");
    Call(*e, "/resume");
    EXPECT_EQ(EngineState(*e).value("state", std::string()), "active");
  }
  HandoffWorks(1);

  for (Engine* e : {p_.get(), d_.get()}) {
    SCOPED_TRACE(e->config().name);
    EXPECT_FALSE(IsSleeping(*e));
    Call(*e, "/sleep?level=1");
    EXPECT_TRUE(IsSleeping(*e));
    EXPECT_TRUE(EngineState(*e).value("sleeping", false)) << EngineState(*e).dump();
    Call(*e, "/wake_up");
    EXPECT_FALSE(IsSleeping(*e));
  }
  HandoffWorks(1);
  ExpectBothIdle();

  for (Engine* e : {p_.get(), d_.get()}) {
    SCOPED_TRACE(e->config().name);
    Call(*e, "/reset_prefix_cache");
    const json s = EngineState(*e);
    EXPECT_EQ(s.value("blocks_cached", uint64_t{1}), 0u) << s.dump();
    EXPECT_EQ(s.value("blocks_used", uint64_t{1}), 0u) << s.dump();
  }
  HandoffWorks(1);
  ExpectBothIdle();

  for (Engine* e : {p_.get(), d_.get()}) {
    SCOPED_TRACE(e->config().name);
    Call(*e, "/update_weights", json{{"version", 2}});
    EXPECT_EQ(EngineState(*e).value("weights_version", uint64_t{0}), 2u);
  }
  for (int i = 0; i < 3; ++i) HandoffWorks(2);
  ExpectBothIdle();
}

// Lifecycle hole 5: a request that arrives while the engine is paused
// waits for resume, but never past --max-queue-wait-s: then the client gets
// a clean error (503, an OpenAI error naming the bound: nothing was sent
// before the outcome was known), and the engine counts it; resume serves the
// next request as usual.
TEST_F(AdminTest, ARequestQueuedBehindAPauseEndsAtMaxQueueWait) {
  std::string err;
  std::unique_ptr<Engine> e = StartPlain({"--max-queue-wait-s", "1"}, &err);
  ASSERT_NE(e, nullptr) << err;
  Call(*e, "/pause?mode=keep");
  const Tokens prompt = RandomPrompt(rng_, 40);
  const HttpReply r = e->Post("/v1/completions", PlainBody(prompt, 4), 20s);
  std::printf("[info] a request into a paused engine answered after %.3f s: HTTP %d\n",
              r.seconds, r.status);
  EXPECT_GE(r.seconds, 0.9) << Describe(r);
  EXPECT_LT(r.seconds, 5.0) << Describe(r);
  EXPECT_EQ(r.status, 503) << Describe(r);
  ASSERT_TRUE(r.is_json() && r.body.contains("error")) << Describe(r);
  EXPECT_NE(r.body["error"].value("message", "").find("max_queue_wait"), std::string::npos)
      << Describe(r);
  EXPECT_EQ(MetricSum(e->Metrics(), "kvrelay_requests_queue_wait_expired_total"), 1);
  Call(*e, "/resume");
  const HttpReply ok = e->Post("/v1/completions", PlainBody(prompt, 4));
  const Choice after = ChoiceOf(ok);
  ASSERT_TRUE(after.ok) << Describe(ok);
  EXPECT_EQ(after.tokens, Expected(prompt, 1, 4)) << Describe(ok);
  EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s)) << EngineSummary(*e);
}

// The same calls on a plain engine serving plain requests.
TEST_F(AdminTest, PlainEngineUpdateWeights) {
  std::string err;
  std::unique_ptr<Engine> e = StartPlain({}, &err);
  ASSERT_NE(e, nullptr) << err;
  const Tokens prompt = RandomPrompt(rng_, 50);
  auto check = [&](uint64_t version, uint32_t n) {
    HttpReply r = e->Post("/v1/completions", PlainBody(prompt, n));
    const Choice ch = ChoiceOf(r);
    ASSERT_TRUE(ch.ok) << Describe(r);
    EXPECT_EQ(ch.finish_reason, "length") << Describe(r);
    EXPECT_EQ(ch.tokens, Expected(prompt, version, n)) << Describe(r);
    EXPECT_EQ(ch.versions, std::vector<uint64_t>(n, version)) << Describe(r);
  };
  check(1, 10);
  Call(*e, "/pause?mode=abort");
  Call(*e, "/resume");
  check(1, 10);
  Call(*e, "/sleep?level=1");
  EXPECT_TRUE(IsSleeping(*e));
  Call(*e, "/wake_up");
  EXPECT_FALSE(IsSleeping(*e));
  check(1, 5);
  Call(*e, "/reset_prefix_cache");
  Call(*e, "/update_weights", json{{"version", 2}});
  check(2, 10);
  check(2, 3);
  EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s)) << EngineSummary(*e);
}

// An abort that names a request while the engine is still taking it (its
// handler waits in Submit for the engine loop, here busy in a 2 s step)
// ends that request once the engine has it. The server used to learn a
// request's id only after Submit returned, so this abort found nothing and
// the request ran to its end (server/open_requests.h).
TEST_F(AdminTest, AbortOfARequestBeingSubmittedIsNotLost) {
  std::string err;
  std::unique_ptr<Engine> e = StartPlain({"--busy-steps", "--step-base-us", "2000000"}, &err);
  ASSERT_NE(e, nullptr) << err;
  const Tokens prompt_a = RandomPrompt(rng_, 8), prompt_b = RandomPrompt(rng_, 8);
  HttpReply a, b, abort;
  std::thread first([&] { a = e->Post("/v1/completions", PlainBody(prompt_a, 1), 30s); });
  std::this_thread::sleep_for(400ms);  // A's one 2 s step runs
  std::thread second([&] {
    json body = PlainBody(prompt_b, 4);
    body["request_id"] = "being-submitted";
    b = e->Post("/v1/completions", body, 30s);
  });
  std::this_thread::sleep_for(500ms);  // B's handler waits in Submit
  const auto t0 = Clock::now();
  abort = e->Post("/abort_requests", json{{"request_ids", {"being-submitted"}}}, 30s);
  first.join();
  second.join();
  EXPECT_EQ(abort.status, 200) << Describe(abort);
  // The abort, queued behind the step, returned after it: B was being
  // submitted all along (else this test proves nothing).
  EXPECT_GE(SecondsSince(t0), 0.3) << "the abort did not wait for the step";
  const Choice ca = ChoiceOf(a), cb = ChoiceOf(b);
  EXPECT_TRUE(ca.ok) << Describe(a);
  EXPECT_EQ(ca.finish_reason, "length") << Describe(a);
  EXPECT_EQ(ca.tokens, Expected(prompt_a, 1, 1)) << Describe(a);
  EXPECT_TRUE(cb.ok) << Describe(b);
  EXPECT_EQ(cb.finish_reason, "abort") << "the abort was lost: " << Describe(b);
  EXPECT_LT(cb.tokens.size(), 4u) << Describe(b);
  EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s)) << EngineSummary(*e);
}

// --- the local lane -------------------------------------------------------------------

class LocalLaneTest : public ServeFixture {
 protected:
  void Handoffs(int n) {
    for (int i = 0; i < n; ++i) {
      Handoff h = Sequential(RandomPrompt(rng_, 1 + rng_() % 200), 4);
      CheckPrefillReply(h);
      CheckDecodeReply(h);
    }
  }
  double Metric(Engine& e, const char* name) { return MetricSum(e.Metrics(), name); }
};

// D opens a lane to a P on its host at the first handshake, whatever the
// data transport, and every control frame either way takes it (hellos,
// pulls, answers); none breaks.
class LocalLaneTransportTest : public LocalLaneTest,
                               public ::testing::WithParamInterface<std::string> {};

TEST_P(LocalLaneTransportTest, ControlFramesTakeTheLane) {
  START_PAIR(GetParam(), PairConfig{});
  Handoffs(5);
  for (Engine* e : {p_.get(), d_.get()}) {
    SCOPED_TRACE(e->config().name);
    EXPECT_EQ(Metric(*e, "kvrelay_lanes_opened_total"), 1);
    EXPECT_GE(Metric(*e, "kvrelay_lane_frames_sent_total"), 6);  // the warm-up and 5 answers
    EXPECT_EQ(Metric(*e, "kvrelay_lanes_broken_total"), 0);
  }
  ExpectBothIdle();
  ExpectLoadsOk(6);
}

INSTANTIATE_TEST_SUITE_P(Transports, LocalLaneTransportTest,
                         ::testing::Values("shm", "tcp", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// tcp: once P's stream to D is open, a small write runs on P's rank thread
// as a polled write (sent without waiting, its reply polled by the rank's
// loop) instead of a worker; --inline-write-kib 0 sends every one to the
// workers. Either way every load ends ok with P's bytes.
TEST_F(LocalLaneTest, SmallTcpWritesRunOnTheRankThread) {
  for (const bool inline_on : {true, false}) {
    SCOPED_TRACE(inline_on ? "default" : "--inline-write-kib 0");
    PairConfig c;
    if (!inline_on) c.p_extra = {"--inline-write-kib", "0"};
    START_PAIR("tcp", c);
    Handoffs(5);
    const double inline_writes = Metric(*p_, "kvrelay_writes_inline_total");
    const double ok = Metric(*p_, "kvrelay_writes_ok_total");
    EXPECT_GE(ok, 6);  // the warm-up and 5 hand-offs
    if (inline_on) {
      EXPECT_GE(inline_writes, ok - 1) << "only the first (which opens the stream) needs a worker";
    } else {
      EXPECT_EQ(inline_writes, 0);
    }
    EXPECT_EQ(Metric(*p_, "kvrelay_writes_failed_total"), 0);
    ExpectBothIdle();
    ExpectLoadsOk(6);
    d_.reset();
    p_.reset();
  }
}

// Read mode: a small read runs on D's rank thread — an shm copy at once, a
// tcp request polled by the rank's loop once a stream to P is open —
// instead of a worker; --inline-write-kib 0 sends every one to the
// workers. Either way every load ends ok with P's bytes (D's output is
// checked against the reference).
TEST_F(LocalLaneTest, SmallReadsRunOnTheRankThread) {
  for (const std::string transport : {"shm", "tcp"}) {
    for (const bool inline_on : {true, false}) {
      SCOPED_TRACE(transport + (inline_on ? " default" : " --inline-write-kib 0"));
      PairConfig c;
      c.p_extra = {"--kv-mode", "read"};
      c.d_extra = {"--kv-mode", "read"};
      if (!inline_on) c.d_extra.insert(c.d_extra.end(), {"--inline-write-kib", "0"});
      START_PAIR(transport, c);
      Handoffs(5);
      const double inline_reads = Metric(*d_, "kvrelay_reads_inline_total");
      const double ok = Metric(*d_, "kvrelay_reads_ok_total");
      EXPECT_GE(ok, 6);  // the warm-up and 5 hand-offs
      EXPECT_GT(Metric(*d_, "kvrelay_bytes_read_total"), 0);
      if (!inline_on) {
        EXPECT_EQ(inline_reads, 0);
      } else if (transport == "shm") {
        EXPECT_EQ(inline_reads, ok) << "every shm read is a copy on the rank's thread";
      } else {
        EXPECT_GE(inline_reads, ok - 1) << "only the first (which opens the stream) needs a worker";
      }
      EXPECT_EQ(Metric(*d_, "kvrelay_reads_failed_total"), 0);
      ExpectBothIdle();
      const std::string m = d_->Metrics();
      EXPECT_GE(MetricSum(m, "kvrelay_loads_total", R"(outcome="ok")"), 6);
      EXPECT_EQ(MetricSum(m, "kvrelay_loads_total", R"(outcome="failed")"), 0);
      d_.reset();
      p_.reset();
    }
  }
}

// With --no-local-lane on P, D finds no lane there and uses ZeroMQ; on D
// alone, D does not look for one.
TEST_F(LocalLaneTest, WithoutItOnEitherSideEverythingTakesZeroMQ) {
  for (const bool on_p : {true, false}) {
    SCOPED_TRACE(on_p ? "--no-local-lane on P" : "--no-local-lane on D");
    PairConfig c;
    (on_p ? c.p_extra : c.d_extra) = {"--no-local-lane"};
    START_PAIR("shm", c);
    Handoffs(3);
    for (Engine* e : {p_.get(), d_.get()}) {
      SCOPED_TRACE(e->config().name);
      EXPECT_EQ(Metric(*e, "kvrelay_lanes_opened_total"), 0);
      EXPECT_EQ(Metric(*e, "kvrelay_lane_frames_sent_total"), 0);
      EXPECT_GE(Metric(*e, "kvrelay_control_frames_sent_total"), 4);
    }
    ExpectBothIdle();
    d_.reset();
    p_.reset();
  }
}

// Garbage on P's lane is what garbage on its ROUTER is: dropped, counted,
// and P keeps serving.
TEST_F(LocalLaneTest, BadLaneInputIsCountedAndPKeepsServing) {
  START_PAIR("shm", PairConfig{});
  const std::string address = runtime::LaneAddress(p_->engine_id(), 0, p_->ctrl_port());
  const double malformed0 = Metric(*p_, "kvrelay_control_frames_malformed_total");
  const double unknown0 = Metric(*p_, "kvrelay_control_unknown_sender_total");
  const double broken0 = Metric(*p_, "kvrelay_lanes_broken_total");
  auto connect = [&] {
    auto lane = runtime::LocalLane::Connect(address, {});
    EXPECT_TRUE(lane.ok()) << lane.status().ToString();
    return lane.ok() ? std::move(*lane) : nullptr;
  };
  // A connection that never attaches: P closes it after peer_down_after (3 s).
  auto idle = connect();
  ASSERT_NE(idle, nullptr);
  const auto idle_since = Clock::now();
  // A first frame that is not an attach: P closes the lane.
  auto no_attach = connect();
  ASSERT_NE(no_attach, nullptr);
  using runtime::LocalLane;
  ASSERT_EQ(no_attach->Send(EncodeWire(HeartbeatMsg{7, 1})), LocalLane::SendResult::kSent);
  // An attach, then undecodable frames and a pull from an identity that
  // never handshook.
  auto junk = connect();
  ASSERT_NE(junk, nullptr);
  ASSERT_EQ(junk->Send(runtime::LaneAttachFrame("4242:0:1")), LocalLane::SendResult::kSent);
  std::vector<uint8_t> random(64);
  for (auto& b : random) b = static_cast<uint8_t>(rng_());
  random[0] ^= 0x80;  // never the magic
  ASSERT_EQ(junk->Send(random), LocalLane::SendResult::kSent);
  ASSERT_EQ(junk->Send({}), LocalLane::SendResult::kSent);
  ASSERT_EQ(junk->Send(StrangerPull()), LocalLane::SendResult::kSent);
  // A length over max_frame_bytes (16 MiB): P breaks the lane.
  auto huge = connect();
  ASSERT_NE(huge, nullptr);
  ASSERT_EQ(huge->Send(runtime::LaneAttachFrame("4243:0:1")), LocalLane::SendResult::kSent);
  // (P may close the lane on reading the length, before the body is sent.)
  ASSERT_NE(huge->Send(std::vector<uint8_t>((16u << 20) + 64, 0xAB)),
            LocalLane::SendResult::kQueueFull);
  for (int i = 0; i < 1000 && huge->wants_write() && !huge->broken(); ++i) {
    huge->Flush();
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        return Metric(*p_, "kvrelay_control_frames_malformed_total") - malformed0 >= 3 &&
               Metric(*p_, "kvrelay_control_unknown_sender_total") - unknown0 >= 1 &&
               Metric(*p_, "kvrelay_lanes_broken_total") - broken0 >= 2;
      },
      5s))
      << "malformed +" << Metric(*p_, "kvrelay_control_frames_malformed_total") - malformed0
      << ", unknown sender +" << Metric(*p_, "kvrelay_control_unknown_sender_total") - unknown0
      << ", lanes broken +" << Metric(*p_, "kvrelay_lanes_broken_total") - broken0;
  // P closed the lanes it broke: reading them finds the end.
  for (auto* lane : {no_attach.get(), huge.get()}) {
    for (int i = 0; i < 500 && !lane->broken(); ++i) {
      lane->Read([](const uint8_t*, size_t) {});
      std::this_thread::sleep_for(2ms);
    }
    EXPECT_TRUE(lane->broken());
  }
  for (int i = 0; i < 3000 && !idle->broken(); ++i) {
    idle->Read([](const uint8_t*, size_t) {});
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_TRUE(idle->broken()) << "P kept a lane that never attached";
  const double idle_s = SecondsSince(idle_since);
  std::printf("[info] P closed the lane that never attached after %.2f s\n", idle_s);
  EXPECT_GE(idle_s, 2.5);
  // (P counts a broken lane when it sweeps, at its next loop turn.)
  EXPECT_TRUE(WaitFor([&] { return Metric(*p_, "kvrelay_lanes_broken_total") - broken0 >= 3; }, 2s))
      << "lanes broken +" << Metric(*p_, "kvrelay_lanes_broken_total") - broken0;
  Handoffs(3);
  EXPECT_EQ(Metric(*d_, "kvrelay_lanes_broken_total"), 0);
  ExpectBothIdle();
}

// --- P dies ---------------------------------------------------------------------------------

class PeerDeathTest : public ServeFixture {
 protected:
  // Sends a D leg of 6 tokens for a transfer P has not seen, so its pull
  // waits for a prefill that will not come, on a thread that stores D's
  // reply in `*reply`; returns once D's load is live.
  std::thread DLegWaitingForP(const Tokens& prompt, HttpReply* reply) {
    const std::string transfer = NewTransferId(rng_);
    std::thread leg([this, prompt, transfer, reply] {
      *reply = d_->Post("/v1/completions",
                        DecodeBody(prompt, 6, p_->RemotePrefillParams(transfer)), 20s);
    });
    EXPECT_TRUE(
        WaitFor([&] { return HasTransfer(d_->DebugState(), "loads", transfer); }, 5s, 5ms))
        << EngineSummary(*d_);
    return leg;
  }
};

// P is SIGKILLed while D's pull waits for its prefill: D declares P gone
// after --peer-dead-after-s and recomputes (correct tokens) instead of
// waiting out the 30 s abort timeout. A D leg that names the dead P after
// that is also answered promptly.
TEST_F(PeerDeathTest, PKilledWhileDPullsWaits) {
  PairConfig c;
  c.abort_timeout_s = 30;
  c.d_extra = {"--peer-dead-after-s", "2"};
  START_PAIR("shm", c);
  const Tokens prompt = RandomPrompt(rng_, 80);
  HttpReply d_reply;
  std::thread d_leg = DLegWaitingForP(prompt, &d_reply);
  const auto killed = Clock::now();
  p_->proc().Kill(SIGKILL);
  ASSERT_TRUE(p_->proc().Wait(5s).has_value());
  d_leg.join();
  std::printf("[info] D answered %.3f s after P was killed\n", SecondsSince(killed));
  EXPECT_LT(SecondsSince(killed), 10.0) << Describe(d_reply);
  const Choice got = ChoiceOf(d_reply);
  ASSERT_TRUE(got.ok) << Describe(d_reply);
  EXPECT_EQ(got.finish_reason, "length") << Describe(d_reply);
  EXPECT_EQ(got.tokens, Expected(prompt, 1, 6)) << Describe(d_reply);

  // P is known to be gone now: a new leg naming it must not wait 30 s.
  const Tokens prompt2 = RandomPrompt(rng_, 50);
  HttpReply again = d_->Post(
      "/v1/completions", DecodeBody(prompt2, 4, p_->RemotePrefillParams(NewTransferId(rng_))),
      20s);
  std::printf("[info] a leg naming the dead P answered in %.3f s: HTTP %d\n", again.seconds,
              again.status);
  EXPECT_LT(again.seconds, 10.0) << Describe(again);
  if (again.status == 200) {
    const Choice c2 = ChoiceOf(again);
    EXPECT_EQ(c2.finish_reason, "length") << Describe(again);
    EXPECT_EQ(c2.tokens, Expected(prompt2, 1, 4)) << Describe(again);
  } else {
    ExpectJsonError(again, 503, "D leg naming a dead P");
  }
  EXPECT_TRUE(WaitFor([&] { return d_->IdleAndEmpty(); }, 15s)) << EngineSummary(*d_);
}

// Rule 8: a P whose process is gone is dead now. Over the local lane D sees
// the kernel close P's end and checks that P's process is gone, so its
// loads fail (and recompute) at once, not after --peer-dead-after-s (10 s
// by default: the silence timer is for peers that go quiet).
TEST_F(PeerDeathTest, PKilledIsKnownDeadAtOnceOverTheLane) {
  PairConfig c;
  c.abort_timeout_s = 30;
  START_PAIR("shm", c);
  const Tokens prompt = RandomPrompt(rng_, 80);
  HttpReply d_reply;
  std::thread d_leg = DLegWaitingForP(prompt, &d_reply);
  ASSERT_GE(MetricSum(d_->Metrics(), "kvrelay_lane_frames_sent_total"), 1) << "the pair uses the lane";
  const auto killed = Clock::now();
  p_->proc().Kill(SIGKILL);
  d_leg.join();
  const double took = SecondsSince(killed);
  std::printf("[info] D answered %.3f s after P was killed (peer_dead_after 10 s)\n", took);
  EXPECT_LT(took, 3.0) << Describe(d_reply);
  const Choice got = ChoiceOf(d_reply);
  ASSERT_TRUE(got.ok) << Describe(d_reply);
  EXPECT_EQ(got.tokens, Expected(prompt, 1, 6)) << Describe(d_reply);
  EXPECT_GE(MetricSum(d_->Metrics(), "kvrelay_peers_gone_total"), 1);
  ASSERT_TRUE(p_->proc().Wait(5s).has_value());
  EXPECT_TRUE(WaitFor([&] { return d_->IdleAndEmpty(); }, 15s)) << EngineSummary(*d_);
}

// --- SIGTERM ------------------------------------------------------------------------------

class ShutdownTest : public ServeFixture {};

// SIGTERM with a D leg waiting for a P leg that never comes: D answers its
// client (the request ends) and both processes exit 0, promptly.
TEST_F(ShutdownTest, SigtermDrainsAndExitsZero) {
  START_PAIR("shm", PairConfig{});
  const Tokens prompt = RandomPrompt(rng_, 60);
  const std::string transfer = NewTransferId(rng_);
  HttpReply d_reply;
  std::thread d_leg([&] {
    d_reply = d_->Post("/v1/completions", DecodeBody(prompt, 4, p_->RemotePrefillParams(transfer)),
                       30s);
  });
  ASSERT_TRUE(WaitFor([&] { return HasTransfer(d_->DebugState(), "loads", transfer); }, 5s, 5ms))
      << EngineSummary(*d_);
  const auto t0 = Clock::now();
  d_->proc().Kill(SIGTERM);
  d_leg.join();
  std::printf("[info] D's client answered %.3f s after SIGTERM\n", SecondsSince(t0));
  EXPECT_LT(SecondsSince(t0), 10.0);
  EXPECT_NE(d_reply.status, 0) << "D's client got no response: " << Describe(d_reply);
  if (d_reply.status == 200) {
    const Choice c = ChoiceOf(d_reply);
    EXPECT_TRUE(c.ok) << Describe(d_reply);
  }
  std::optional<int> d_status = d_->proc().Wait(10s);
  ASSERT_TRUE(d_status.has_value()) << "D still runs 10 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*d_status) && WEXITSTATUS(*d_status) == 0) << "D status " << *d_status;

  p_->proc().Kill(SIGTERM);
  std::optional<int> p_status = p_->proc().Wait(10s);
  ASSERT_TRUE(p_status.has_value()) << "P still runs 10 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(*p_status) && WEXITSTATUS(*p_status) == 0) << "P status " << *p_status;
  const std::string log = d_->proc().ReadLog();
  EXPECT_NE(log.find("stopped"), std::string::npos) << "D's log has no 'stopped'";
}

// SIGTERM with clients mid-stream: each stream ends as an aborted request
// does — a last chunk with finish_reason "abort", then data: [DONE] — not
// with a cut connection, and the engine exits 0.
TEST_F(ShutdownTest, SigtermEndsOpenStreamsWithAbortAndDone) {
  std::string err;
  std::unique_ptr<Engine> e = StartPlain({"--step-base-us", "5000"}, &err);
  ASSERT_NE(e, nullptr) << err;
  constexpr int kClients = 4;
  std::vector<std::unique_ptr<RawHttp>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawHttp>());
    ASSERT_TRUE(clients.back()->Connect(e->http_port()));
    json body = PlainBody(RandomPrompt(rng_, 20 + 10 * i), 400);
    body["stream"] = true;
    ASSERT_TRUE(clients.back()->Send("POST", "/v1/completions", body.dump()));
  }
  for (auto& cl : clients) ASSERT_EQ(cl->ReadStatus(10s), 200);
  e->proc().Kill(SIGTERM);
  for (int i = 0; i < kClients; ++i) {
    const std::string rest = clients[static_cast<size_t>(i)]->ReadRest(10s);
    EXPECT_NE(rest.find("\"finish_reason\":\"abort\""), std::string::npos)
        << "client " << i << ": " << rest.substr(rest.size() > 600 ? rest.size() - 600 : 0);
    EXPECT_NE(rest.find("data: [DONE]"), std::string::npos) << "client " << i;
  }
  std::optional<int> st = e->proc().Wait(10s);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
}

// SIGTERM while clients keep coming — completions, /health, /debug/state,
// /metrics, and clients that leave mid-request: the process drains and
// exits 0 (it must not crash on a request that arrives while it stops).
class ShutdownUnderLoadTest : public ServeFixture {
 protected:
  void HammerThenTerm(Engine& victim, const std::function<void(int, std::mt19937_64&)>& request) {
    std::atomic<bool> stop{false};
    std::atomic<int> sent{0};
    std::vector<std::thread> threads;
    const uint64_t seed = rng_();
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        std::mt19937_64 rng(seed + static_cast<uint64_t>(i));
        while (!stop) {
          request(i, rng);
          ++sent;
        }
      });
    }
    threads.emplace_back([&] {
      while (!stop) {
        victim.Get("/health", 2s);
        victim.Get("/debug/state", 2s);
        victim.Get("/metrics", 2s);
      }
    });
    threads.emplace_back([&] {
      std::mt19937_64 rng(seed + 100);
      while (!stop) {   // clients that go away mid-request
        RawHttp r;
        if (!r.Connect(victim.http_port())) continue;
        r.Send("POST", "/v1/completions", PlainBody(RandomPrompt(rng, 64), 40).dump());
        r.ReadStatus(100ms);
      }
    });
    // Let the load build up (part of the scenario, not a timing guess).
    std::this_thread::sleep_for(500ms);
    const int before = sent.load();
    victim.proc().Kill(SIGTERM);
    const auto t0 = Clock::now();
    std::optional<int> st = victim.proc().Wait(20s);
    const double exit_s = SecondsSince(t0);
    stop = true;
    for (auto& t : threads) t.join();
    std::printf("[info] %d requests before SIGTERM; %s exited %.3f s after it (clients joined "
                "%.3f s after it)\n",
                before, victim.config().name.c_str(), exit_s, SecondsSince(t0));
    ASSERT_TRUE(st.has_value()) << victim.config().name << " still runs 20 s after SIGTERM";
    // The drain answers every pull and ends every load; nothing in it waits
    // for a timeout (its bound is 5 s).
    EXPECT_LT(exit_s, 4.0) << victim.config().name << " took " << exit_s << " s to exit";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
        << victim.config().name << " ended with "
        << (WIFSIGNALED(*st) ? std::string("signal ") + strsignal(WTERMSIG(*st))
                             : "exit " + std::to_string(WEXITSTATUS(*st)));
  }
};

TEST_F(ShutdownUnderLoadTest, PlainEngine) {
  std::string err;
  std::unique_ptr<Engine> e = StartPlain({"--step-per-token-us", "200"}, &err);
  ASSERT_NE(e, nullptr) << err;
  HammerThenTerm(*e, [&](int, std::mt19937_64& rng) {
    e->Post("/v1/completions", PlainBody(RandomPrompt(rng, 1 + rng() % 200), 16), 5s);
  });
}

TEST_F(ShutdownUnderLoadTest, DecodeEngine) {
  START_PAIR("shm", PairConfig{});
  HammerThenTerm(*d_, [&](int i, std::mt19937_64& rng) {
    Concurrent(RandomPrompt(rng, 1 + rng() % 200), 8, NewTransferId(rng), i % 2 == 0);
  });
}

TEST_F(ShutdownUnderLoadTest, PrefillEngine) {
  START_PAIR("shm", PairConfig{});
  HammerThenTerm(*p_, [&](int i, std::mt19937_64& rng) {
    Concurrent(RandomPrompt(rng, 1 + rng() % 200), 8, NewTransferId(rng), i % 2 == 0);
  });
}

}  // namespace
}  // namespace kvrelay::proctest
