// limits_test.cc — every size a peer controls is bounded, refused cleanly
// and counted, on real `kvrelay serve` and `kvrelay router` processes
// (docs/operations.md, "Limits").
//
//   LimitsTest.EngineBodyAndPrompt      --max-body-bytes (413), --max-prompt-tokens
//                                       (400 naming the limit and the value);
//                                       counted; nothing admitted.
//   LimitsTest.EnginePerClientConcurrency
//                                       --max-requests-per-client (429) while two
//                                       streams run; freed when they end.
//   LimitsTest.RefusedHandoffReleasesP  D refuses a hand-off for a limit: P's
//                                       held KV is released at once, not at
//                                       its abort timeout.
//   LimitsTest.WireLimitsAreCounted     pulls over max_items_per_pull /
//                                       max_blocks_per_item and a handshake over
//                                       max_registration_bytes, sent to P's
//                                       control port: dropped, counted by limit,
//                                       P keeps serving.
//   LimitsTest.RouterLimits             the router's --max-body-bytes (413) and
//                                       --max-requests-per-client (429), counted.
//
// Randomness is seeded; the seed is printed ("[seed] ...") and
// KVRELAY_PROC_SEED replays it.
#include <zmq.h>

#include <thread>

#include <gtest/gtest.h>

#include "core/wire.h"
#include "proc/harness.h"

namespace kvrelay::proctest {
namespace {

using Tokens = std::vector<engine::Token>;

double Limit(const std::string& metrics, const std::string& name, const std::string& limit) {
  return MetricSum(metrics, name, "limit=\"" + limit + "\"");
}
double EngineLimit(Engine& e, const std::string& limit) {
  return Limit(e.Metrics(), "kvrelay_limit_rejections_total", limit);
}

json StreamBody(const Tokens& prompt, uint32_t n) {
  json b = PlainBody(prompt, n);
  b["stream"] = true;
  return b;
}

class LimitsTest : public ::testing::Test {
 protected:
  void SetUp() override { rng_.seed(TestSeed()); }

  Engine* StartEngine(const std::string& name, const std::string& role,
                      std::vector<std::string> extra = {}) {
    EngineConfig c;
    c.name = name;
    c.role = role;
    c.extra = std::move(extra);
    std::string err;
    engines_.push_back(Engine::Start(c, &err));
    EXPECT_NE(engines_.back(), nullptr) << err;
    return engines_.back().get();
  }

  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

TEST_F(LimitsTest, EngineBodyAndPrompt) {
  Engine* e = StartEngine("E", "plain", {"--max-body-bytes", "2000", "--max-prompt-tokens", "20"});
  ASSERT_NE(e, nullptr);
  const double started = MetricSum(e->Metrics(), "kvrelay_requests_started_total");

  HttpReply big = e->PostRaw("/v1/completions", PlainBody(RandomPrompt(rng_, 600), 2).dump());
  EXPECT_EQ(big.status, 413) << Describe(big);
  EXPECT_NE(big.raw.find("--max-body-bytes"), std::string::npos) << Describe(big);
  EXPECT_NE(big.raw.find("2000"), std::string::npos) << Describe(big);

  HttpReply longp = e->Post("/v1/completions", PlainBody(RandomPrompt(rng_, 21), 2));
  EXPECT_EQ(longp.status, 400) << Describe(longp);
  EXPECT_NE(longp.raw.find("prompt has 21 tokens; the limit is 20 (--max-prompt-tokens)"),
            std::string::npos)
      << Describe(longp);

  HttpReply ok = e->Post("/v1/completions", PlainBody(RandomPrompt(rng_, 20), 2));
  EXPECT_EQ(ok.status, 200) << Describe(ok);

  const std::string m = e->Metrics();
  EXPECT_EQ(Limit(m, "kvrelay_limit_rejections_total", "body_bytes"), 1) << m;
  EXPECT_EQ(Limit(m, "kvrelay_limit_rejections_total", "prompt_tokens"), 1) << m;
  EXPECT_EQ(Limit(m, "kvrelay_limit_rejections_total", "requests_per_client"), 0) << m;
  for (const char* wire : {"wire_frame_bytes", "wire_items_per_pull", "wire_blocks_per_item",
                           "wire_registration_bytes"}) {
    EXPECT_NE(m.find(std::string("kvrelay_limit_rejections_total{limit=\"") + wire + "\"}"),
              std::string::npos)
        << wire;
  }
  // Only the request within the limits was admitted.
  EXPECT_EQ(MetricSum(m, "kvrelay_requests_started_total") - started, 1);
  EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s));
}

TEST_F(LimitsTest, EnginePerClientConcurrency) {
  // 20 ms steps: a 150-token stream runs for about 3 s.
  Engine* e = StartEngine("E", "plain", {"--max-requests-per-client", "2", "--step-base-us",
                                         "20000"});
  ASSERT_NE(e, nullptr);
  RawHttp a, b;
  ASSERT_TRUE(a.Connect(e->http_port()));
  ASSERT_TRUE(b.Connect(e->http_port()));
  ASSERT_TRUE(a.Send("POST", "/v1/completions", StreamBody(RandomPrompt(rng_, 8), 150).dump()));
  ASSERT_TRUE(b.Send("POST", "/v1/completions", StreamBody(RandomPrompt(rng_, 8), 150).dump()));
  ASSERT_EQ(a.ReadStatus(10s), 200);
  ASSERT_EQ(b.ReadStatus(10s), 200);

  HttpReply third = e->Post("/v1/completions", PlainBody(RandomPrompt(rng_, 8), 2));
  EXPECT_EQ(third.status, 429) << Describe(third);
  EXPECT_NE(third.raw.find("the limit is 2 per client (--max-requests-per-client)"),
            std::string::npos)
      << Describe(third);
  EXPECT_EQ(EngineLimit(*e, "requests_per_client"), 1);

  // Clients going away free their slots (their requests are aborted).
  a.Close();
  b.Close();
  bool admitted = WaitFor(
      [&] { return e->Post("/v1/completions", PlainBody(RandomPrompt(rng_, 8), 2)).status == 200; },
      10s, 100ms);
  EXPECT_TRUE(admitted);
  EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s));
}

TEST_F(LimitsTest, RefusedHandoffReleasesP) {
  // P would hold the KV for 60 s; D's prompt limit is below P's.
  EngineConfig pc;
  pc.name = "P";
  pc.role = "prefill";
  pc.abort_timeout_s = 60;
  std::string err;
  engines_.push_back(Engine::Start(pc, &err));
  Engine* p = engines_.back().get();
  ASSERT_NE(p, nullptr) << err;
  Engine* d = StartEngine("D", "decode", {"--max-prompt-tokens", "20"});
  ASSERT_NE(d, nullptr);

  const Tokens prompt = RandomPrompt(rng_, 40);
  const std::string transfer = NewTransferId(rng_);
  HttpReply pre = p->Post("/v1/completions", PrefillBody(prompt, transfer, 1));
  ASSERT_EQ(pre.status, 200) << Describe(pre);
  HttpReply dec = d->Post("/v1/completions", DecodeBody(prompt, 4, p->RemotePrefillParams(transfer)));
  EXPECT_EQ(dec.status, 400) << Describe(dec);
  EXPECT_NE(dec.raw.find("--max-prompt-tokens"), std::string::npos) << Describe(dec);
  EXPECT_EQ(EngineLimit(*d, "prompt_tokens"), 1);
  // D told P to release: P is empty long before its 60 s abort timeout.
  EXPECT_TRUE(WaitFor([&] { return p->IdleAndEmpty(); }, 10s)) << p->DebugState().dump();
  EXPECT_TRUE(WaitFor([&] { return d->IdleAndEmpty(); }, 10s));
}

// A ZeroMQ DEALER on P's control port.
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
  bool Send(const std::vector<uint8_t>& frame) {
    return zmq_send(sock_, frame.data(), frame.size(), 0) == static_cast<int>(frame.size());
  }

 private:
  void* ctx_;
  void* sock_;
  bool ok_ = false;
};

TEST_F(LimitsTest, WireLimitsAreCounted) {
  Engine* p = StartEngine("P", "prefill");
  ASSERT_NE(p, nullptr);
  const WireLimits defaults;
  const double malformed_before =
      MetricSum(p->Metrics(), "kvrelay_control_frames_malformed_total");

  PullMsg many;   // one transfer over the limit, each a release (no blocks)
  many.pull_seq = 3;
  for (uint32_t i = 0; i <= defaults.max_items_per_pull; ++i) {
    many.items.push_back(PullItem{TransferId{1, i + 1}, {}, 0});
  }
  PullMsg wide;   // one transfer with one block over the limit
  wide.pull_seq = 2;
  wide.items.push_back(
      PullItem{TransferId{2, 2}, std::vector<BlockId>(defaults.max_blocks_per_item + 1), 0});
  HandshakeMsg hs;  // a registration one byte over the limit
  hs.engine_id = 4242;
  hs.incarnation = 1;
  hs.tp = 1;
  hs.role = 1;
  hs.registration.assign(defaults.max_registration_bytes + 1, 0x5A);
  {
    Dealer dealer(p->ctrl_port());
    ASSERT_TRUE(dealer.ok());
    ASSERT_TRUE(dealer.Send(EncodeWire(many)));
    ASSERT_TRUE(dealer.Send(EncodeWire(wide)));
    ASSERT_TRUE(dealer.Send(EncodeWire(hs)));
    const bool counted = WaitFor(
        [&] {
          const std::string m = p->Metrics();
          return Limit(m, "kvrelay_limit_rejections_total", "wire_items_per_pull") >= 1 &&
                 Limit(m, "kvrelay_limit_rejections_total", "wire_blocks_per_item") >= 1 &&
                 Limit(m, "kvrelay_limit_rejections_total", "wire_registration_bytes") >= 1;
        },
        10s);
    EXPECT_TRUE(counted) << p->Metrics();
  }
  const std::string m = p->Metrics();
  EXPECT_GE(MetricSum(m, "kvrelay_control_frames_malformed_total") - malformed_before, 3);
  EXPECT_EQ(MetricSum(m, "kvrelay_handshakes_total"), 0);   // the handshake was not applied
  // P still serves.
  HttpReply ok = p->Post("/v1/completions", PlainBody(RandomPrompt(rng_, 8), 1));
  EXPECT_EQ(ok.status, 200) << Describe(ok);
  EXPECT_TRUE(WaitFor([&] { return p->IdleAndEmpty(); }, 10s));
}

TEST_F(LimitsTest, RouterLimits) {
  Engine* p = StartEngine("P", "prefill");
  Engine* d = StartEngine("D", "decode", {"--step-base-us", "20000"});
  ASSERT_TRUE(p && d);
  const uint16_t port = FreePort();
  std::string err;
  auto router = Proc::Start(
      KvrelayBinary(),
      {"router", "--host", "127.0.0.1", "--port", std::to_string(port), "--prefill",
       "http://127.0.0.1:" + std::to_string(p->http_port()), "--decode",
       "http://127.0.0.1:" + std::to_string(d->http_port()), "--max-body-bytes", "3000",
       "--max-requests-per-client", "1"},
      TestDir() + "/router.log", &err);
  ASSERT_NE(router, nullptr) << err;
  // The router's API is the engine's: reuse the harness's HTTP helpers by
  // pointing a RawHttp and MetricSum at its port.
  auto get = [&](const std::string& path) {
    RawHttp h;
    if (!h.Connect(port) || !h.Send("GET", path, "") || h.ReadStatus(5s) != 200) return std::string();
    return h.ReadRest(5s);
  };
  auto post = [&](const std::string& body, std::string* rest) {
    RawHttp h;
    if (!h.Connect(port) || !h.Send("POST", "/v1/completions", body)) return -1;
    const int status = h.ReadStatus(10s);
    *rest = h.ReadRest(10s);
    return status;
  };
  ASSERT_TRUE(WaitFor([&] { return !get("/health").empty(); }, 30s)) << router->ReadLog();

  std::string rest;
  EXPECT_EQ(post(PlainBody(RandomPrompt(rng_, 900), 2).dump(), &rest), 413) << rest;
  EXPECT_NE(rest.find("--max-body-bytes"), std::string::npos) << rest;

  RawHttp hold;
  ASSERT_TRUE(hold.Connect(port));
  ASSERT_TRUE(hold.Send("POST", "/v1/completions", StreamBody(RandomPrompt(rng_, 8), 150).dump()));
  ASSERT_EQ(hold.ReadStatus(10s), 200);
  EXPECT_EQ(post(PlainBody(RandomPrompt(rng_, 8), 2).dump(), &rest), 429) << rest;
  EXPECT_NE(rest.find("--max-requests-per-client"), std::string::npos) << rest;

  const std::string m = get("/metrics");
  EXPECT_EQ(Limit(m, "kvrelay_router_limit_rejections_total", "body_bytes"), 1) << m;
  EXPECT_EQ(Limit(m, "kvrelay_router_limit_rejections_total", "requests_per_client"), 1) << m;
  hold.Close();
  EXPECT_TRUE(WaitFor(
      [&] { return post(PlainBody(RandomPrompt(rng_, 8), 2).dump(), &rest) == 200; }, 10s,
      100ms))
      << rest;
  EXPECT_TRUE(WaitFor([&] { return p->IdleAndEmpty() && d->IdleAndEmpty(); }, 10s));
}

}  // namespace
}  // namespace kvrelay::proctest
