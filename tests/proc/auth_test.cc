// auth_test.cc — access control across real processes (docs/operations.md,
// "Access control"):
//
//   AdminAuthTest     an engine started with --auth-token-file refuses admin
//                     calls and /debug/* without proof, with a wrong MAC, a
//                     malformed header or a replayed nonce (401 JSON,
//                     counted), and accepts a correctly signed call;
//                     completions, /health and /metrics stay open.
//   TokenFileTest     serve refuses to start with a missing, empty or
//                     group/other-readable token file.
//   ControlAuthTest   P and D with the same token hand off KV; a D with no
//                     token or another one cannot get P's KV (its request
//                     ends with a clean error, nothing leaks: blocks_used
//                     returns to 0 on both); a raw peer's unsigned pull is
//                     refused and counted.
//   WrongEngineTest   a transfer named for one D engine is refused to
//                     another D engine's pull (counted); that D recomputes,
//                     the named D still gets the KV.
//
// The admin MAC is computed here from docs/http.md's formula with base/hmac
// (not with the server's code), so the doc and the code are checked
// against each other. Randomness is seeded; the seed is printed.
#include <sys/stat.h>
#include <zmq.h>

#include <fstream>

#include <gtest/gtest.h>

#include "base/hmac.h"
#include "base/sha256.h"
#include "core/wire.h"
#include "http/http_client.h"
#include "proc/harness.h"

namespace kvrelay::proctest {
namespace {

using Tokens = std::vector<engine::Token>;

std::string WriteToken(const std::string& name, const std::string& token, mode_t mode = 0600) {
  const std::string path = TestDir() + "/" + name;
  {
    std::ofstream f(path);
    f << token << "\n";
  }
  chmod(path.c_str(), mode);
  return path;
}

// docs/http.md: mac = HMAC-SHA256(token, "kvrelay-admin-v1\n" nonce "\n"
// METHOD "\n" target "\n" hex(SHA-256(body))).
std::string DocMac(const std::string& token, const std::string& nonce, const std::string& method,
                   const std::string& target, const std::string& body) {
  const std::string msg = "kvrelay-admin-v1\n" + nonce + "\n" + method + "\n" + target + "\n" +
                          HexOf(Sha256::Hash(body));
  return HexOf(HmacSha256Of(token, msg));
}

struct Signed {
  int status = 0;
  json body;
};

std::string Nonce(uint16_t port) {
  auto r = http::Get("http://127.0.0.1:" + std::to_string(port), "/auth/nonce");
  if (!r.ok() || r->status != 200) return "";
  return json::parse(r->body, nullptr, false).value("nonce", "");
}

// A request with an explicit Authorization header ("" for none).
Signed Call(uint16_t port, const std::string& method, const std::string& target,
            const std::string& body, const std::string& authorization) {
  const http::Client cli("http://127.0.0.1:" + std::to_string(port),
                         http::ClientOptions::Timeouts(Duration::Seconds(3), Duration::Seconds(30)));
  http::Headers h;
  if (!authorization.empty()) h.emplace_back("Authorization", authorization);
  auto r = method == "GET" ? cli.Get(target, h) : cli.Post(target, body, "application/json", h);
  Signed s;
  if (!r.ok()) return s;
  s.status = r->status;
  s.body = json::parse(r->body, nullptr, false);
  return s;
}

std::string Header(const std::string& token, const std::string& nonce, const std::string& method,
                   const std::string& target, const std::string& body) {
  return "KVRELAY-HMAC nonce=" + nonce + ", mac=" + DocMac(token, nonce, method, target, body);
}

Signed SignedCall(uint16_t port, const std::string& token, const std::string& method,
                  const std::string& target, const std::string& body = "") {
  return Call(port, method, target, body, Header(token, Nonce(port), method, target, body));
}

bool SignedIdle(Engine& e, const std::string& token) {
  Signed s = SignedCall(e.http_port(), token, "GET", "/debug/state");
  if (s.status != 200 || !s.body.is_object()) return false;
  return s.body.value("idle", false) && s.body["engine"].value("blocks_used", -1) == 0;
}

void Expect401(const Signed& s, const std::string& what) {
  EXPECT_EQ(s.status, 401) << what;
  ASSERT_TRUE(s.body.is_object()) << what;
  EXPECT_EQ(s.body["error"].value("code", 0), 401) << what;
  EXPECT_EQ(s.body["error"].value("type", ""), "authentication_error") << what;
}

TEST(AdminAuthTest, AdminCallsNeedProofOfTheToken) {
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(TestSeed()));
  const std::string token = "admin-secret-" + std::to_string(TestSeed());
  std::string error;
  EngineConfig c;
  c.name = "p";
  c.role = "both";
  c.extra = {"--auth-token-file", WriteToken("token", token)};
  std::unique_ptr<Engine> e = Engine::Start(c, &error);
  ASSERT_TRUE(e) << error;
  const uint16_t port = e->http_port();

  Expect401(Call(port, "POST", "/pause?mode=abort", "", ""), "no header");
  Expect401(Call(port, "GET", "/debug/state", "", ""), "debug/state, no header");
  Expect401(Call(port, "POST", "/resume", "", "Bearer " + token), "the token in clear");
  Expect401(Call(port, "POST", "/resume", "", Header("not-the-token", Nonce(port), "POST",
                                                     "/resume", "")),
            "wrong token");
  Expect401(Call(port, "POST", "/resume", "", Header(token, std::string(32, '0'), "POST",
                                                     "/resume", "")),
            "a nonce the engine never issued");
  // Signed for another call: refused.
  Expect401(Call(port, "POST", "/pause?mode=abort", "",
                 Header(token, Nonce(port), "POST", "/pause?mode=wait", "")),
            "signed for another query");
  // A correct call is accepted once; its replay is refused.
  const std::string nonce = Nonce(port);
  ASSERT_EQ(nonce.size(), 32u);
  const std::string good = Header(token, nonce, "POST", "/pause?mode=abort", "");
  Signed ok = Call(port, "POST", "/pause?mode=abort", "", good);
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
  Expect401(Call(port, "POST", "/pause?mode=abort", "", good), "replayed");
  Signed resumed = SignedCall(port, token, "POST", "/resume");
  EXPECT_EQ(resumed.status, 200) << resumed.body.dump();
  // A body is covered by the MAC.
  const std::string body = R"({"version": 2})";
  Signed uw = SignedCall(port, token, "POST", "/update_weights", body);
  EXPECT_EQ(uw.status, 200) << uw.body.dump();
  const std::string n2 = Nonce(port);
  Expect401(Call(port, "POST", "/update_weights", R"({"version": 3})",
                 Header(token, n2, "POST", "/update_weights", body)),
            "body changed after signing");

  // Open endpoints stay open.
  EXPECT_EQ(e->Get("/health").status, 200);
  EXPECT_EQ(e->Get("/v1/models").status, 200);
  HttpReply plain = e->Post("/v1/completions", PlainBody({1, 2, 3}, 2));
  EXPECT_EQ(plain.status, 200) << Describe(plain);
  const std::string m = e->Metrics();
  EXPECT_GE(MetricSum(m, "kvrelay_admin_auth_refused_total", R"(reason="missing")"), 2);
  EXPECT_GE(MetricSum(m, "kvrelay_admin_auth_refused_total", R"(reason="malformed")"), 1);
  EXPECT_GE(MetricSum(m, "kvrelay_admin_auth_refused_total", R"(reason="bad_mac")"), 3);
  EXPECT_GE(MetricSum(m, "kvrelay_admin_auth_refused_total", R"(reason="unknown_nonce")"), 2);
  EXPECT_TRUE(WaitFor([&] { return SignedIdle(*e, token); }, 10s));
}

TEST(TokenFileTest, ServeRefusesUnsafeOrUnusableFiles) {
  struct Case {
    std::string name, path, expect;
  };
  const std::vector<Case> cases = {
      {"readable by others", WriteToken("open", "tok", 0644), "chmod 600"},
      {"empty", WriteToken("empty", "", 0600), "empty"},
      {"missing", TestDir() + "/no-such-token", "No such file"},
  };
  for (const Case& c : cases) {
    std::string error;
    const uint16_t port = FreePorts(2);
    std::unique_ptr<Proc> p =
        Proc::Start(KvrelayBinary(),
                    {"serve", "--port", std::to_string(port), "--ctrl-port",
                     std::to_string(port + 1), "--auth-token-file", c.path},
                    TestDir() + "/serve-" + std::to_string(port) + ".log", &error);
    ASSERT_TRUE(p) << error;
    std::optional<int> st = p->Wait(10s);
    ASSERT_TRUE(st.has_value()) << c.name << ": serve did not exit";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 2) << c.name;
    EXPECT_NE(p->ReadLog().find(c.expect), std::string::npos) << c.name << ": " << p->ReadLog();
  }
}

class ControlAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = TestSeed();
    std::printf("[seed] %llu\n", static_cast<unsigned long long>(seed_));
    rng_.seed(seed_);
    token_ = "control-secret-" + std::to_string(seed_);
  }
  std::unique_ptr<Engine> Start(const std::string& name, const std::string& role,
                                const std::string& token, double abort_timeout_s = 30) {
    EngineConfig c;
    c.name = name;
    c.role = role;
    c.abort_timeout_s = abort_timeout_s;
    if (!token.empty()) c.extra = {"--auth-token-file", WriteToken(name + ".token", token)};
    std::string error;
    std::unique_ptr<Engine> e = Engine::Start(c, &error);
    EXPECT_TRUE(e) << error;
    return e;
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string token_;
};

TEST_F(ControlAuthTest, SameTokenHandsOffKv) {
  std::unique_ptr<Engine> p = Start("p", "prefill", token_);
  std::unique_ptr<Engine> d = Start("d", "decode", token_);
  ASSERT_TRUE(p && d);
  for (int i = 0; i < 5; ++i) {
    const Tokens prompt = RandomPrompt(rng_, 1 + rng_() % 200);
    const std::string t = NewTransferId(rng_);
    HttpReply pr = p->Post("/v1/completions", PrefillBody(prompt, t, 1));
    ASSERT_EQ(pr.status, 200) << Describe(pr);
    HttpReply dr = d->Post("/v1/completions", DecodeBody(prompt, 6, p->RemotePrefillParams(t)));
    Choice ch = ChoiceOf(dr);
    ASSERT_TRUE(ch.ok) << Describe(dr);
    EXPECT_EQ(ch.tokens, Expected(prompt, 1, 6));
  }
  const std::string dm = d->Metrics();
  EXPECT_GE(MetricSum(dm, "kvrelay_loads_total", R"(outcome="ok")"), 5);
  EXPECT_EQ(MetricSum(p->Metrics(), "kvrelay_handshakes_auth_failed_total"), 0);
  EXPECT_EQ(MetricSum(dm, "kvrelay_handshakes_auth_failed_total"), 0);
  EXPECT_TRUE(WaitFor([&] { return SignedIdle(*p, token_); }, 10s));
  EXPECT_TRUE(WaitFor([&] { return SignedIdle(*d, token_); }, 10s));
}

TEST_F(ControlAuthTest, DWithoutTheTokenGetsNoKv) {
  // P holds a finished prefill for 3 s at most: what no D may pull is
  // released by expiry, never leaked.
  std::unique_ptr<Engine> p = Start("p", "prefill", token_, /*abort_timeout_s=*/3);
  std::unique_ptr<Engine> none = Start("d-none", "decode", "");
  std::unique_ptr<Engine> wrong = Start("d-wrong", "decode", token_ + "-not");
  ASSERT_TRUE(p && none && wrong);
  for (Engine* d : {none.get(), wrong.get()}) {
    SCOPED_TRACE(d->config().name);
    const Tokens prompt = RandomPrompt(rng_, 1 + rng_() % 100);
    const std::string t = NewTransferId(rng_);
    HttpReply pr = p->Post("/v1/completions", PrefillBody(prompt, t, 1));
    ASSERT_EQ(pr.status, 200) << Describe(pr);
    HttpReply dr = d->Post("/v1/completions", DecodeBody(prompt, 4, p->RemotePrefillParams(t)));
    // A clean error (no handshake P would accept), or a recompute: never
    // P's KV. The decoder's load counter says which.
    if (dr.status == 200) {
      Choice ch = ChoiceOf(dr);
      EXPECT_EQ(ch.tokens, Expected(prompt, 1, 4));
    } else {
      EXPECT_EQ(dr.status, 503) << Describe(dr);
      ASSERT_TRUE(dr.is_json()) << Describe(dr);
      EXPECT_TRUE(dr.body.contains("error")) << Describe(dr);
    }
    EXPECT_EQ(MetricSum(d->Metrics(), "kvrelay_loads_total", R"(outcome="ok")"), 0);
    EXPECT_GE(MetricSum(d->Metrics(), "kvrelay_handshakes_auth_failed_total"), 1);
    EXPECT_TRUE(WaitFor(
        [&] { return d == none.get() ? d->IdleAndEmpty() : SignedIdle(*d, token_ + "-not"); },
        10s));
  }
  EXPECT_GE(MetricSum(p->Metrics(), "kvrelay_handshakes_auth_failed_total"), 2);
  EXPECT_EQ(MetricSum(p->Metrics(), "kvrelay_writes_ok_total"), 0);
  EXPECT_EQ(MetricSum(p->Metrics(), "kvrelay_bytes_moved_total"), 0);

  // A raw peer: an unsigned handshake, then a pull: refused, counted,
  // never answered.
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_DEALER);
  const int zero = 0, timeout_ms = 500;
  zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(p->ctrl_port());
  ASSERT_EQ(zmq_connect(sock, ep.c_str()), 0);
  HandshakeMsg hs;
  hs.engine_id = 4242;
  hs.incarnation = 1;
  hs.tp = 1;
  hs.role = 1;
  const engine::ModelShape shape = TinyShape();
  hs.layers = shape.layers;
  hs.kv_heads = shape.kv_heads;
  hs.head_dim = shape.head_dim;
  hs.dtype_bytes = shape.dtype_bytes;
  hs.block_tokens = shape.block_tokens;
  hs.num_blocks = 16;
  PullMsg pull;
  pull.pull_seq = 2;
  pull.items.push_back(PullItem{TransferId{1, 2}, {BlockId{0, 0}}});
  for (const std::vector<uint8_t>& f : {EncodeWire(hs), EncodeWire(pull)}) {
    ASSERT_EQ(zmq_send(sock, f.data(), f.size(), 0), static_cast<int>(f.size()));
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        return MetricSum(p->Metrics(), "kvrelay_pulls_refused_total",
                         R"(reason="unauthenticated")") >= 1;
      },
      5s));
  // P answered the handshake with a challenge at most, never the pull.
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> buf(4096);
    const int n = zmq_recv(sock, buf.data(), buf.size(), 0);
    if (n < 0) break;
    Result<WireMessage> m = DecodeWire({buf.data(), static_cast<size_t>(n)}, WireLimits{});
    ASSERT_TRUE(m.ok());
    EXPECT_FALSE(std::holds_alternative<AnswerMsg>(*m)) << "P answered an unproved pull";
  }
  zmq_close(sock);
  zmq_ctx_term(ctx);

  // Nothing leaks: P's held prefills expire (3 s) and its pool empties.
  EXPECT_TRUE(WaitFor([&] { return SignedIdle(*p, token_); }, 15s))
      << SignedCall(p->http_port(), token_, "GET", "/debug/state").body.dump();
}

TEST(WrongEngineTest, ATransferNamedForOneDIsRefusedToAnother) {
  std::printf("[seed] %llu\n", static_cast<unsigned long long>(TestSeed()));
  std::mt19937_64 rng(TestSeed());
  std::string error;
  EngineConfig pc;
  pc.name = "p";
  pc.role = "prefill";
  std::unique_ptr<Engine> p = Engine::Start(pc, &error);
  ASSERT_TRUE(p) << error;
  EngineConfig dc;
  dc.role = "decode";
  dc.name = "d1";
  std::unique_ptr<Engine> d1 = Engine::Start(dc, &error);
  ASSERT_TRUE(d1) << error;
  dc.name = "d2";
  std::unique_ptr<Engine> d2 = Engine::Start(dc, &error);
  ASSERT_TRUE(d2) << error;

  const Tokens prompt = RandomPrompt(rng, 40);
  const std::string t = NewTransferId(rng);
  json pb = PrefillBody(prompt, t, 1);
  pb["kv_transfer_params"]["consumer_engine_id"] = d1->engine_id();
  HttpReply pr = p->Post("/v1/completions", pb);
  ASSERT_EQ(pr.status, 200) << Describe(pr);
  // d2 names the same transfer: P refuses its pull; d2 recomputes.
  HttpReply r2 = d2->Post("/v1/completions", DecodeBody(prompt, 5, p->RemotePrefillParams(t)));
  Choice c2 = ChoiceOf(r2);
  ASSERT_TRUE(c2.ok) << Describe(r2);
  EXPECT_EQ(c2.tokens, Expected(prompt, 1, 5));
  EXPECT_EQ(MetricSum(d2->Metrics(), "kvrelay_loads_total", R"(outcome="ok")"), 0);
  EXPECT_GE(MetricSum(p->Metrics(), "kvrelay_pulls_refused_total", R"(reason="wrong_engine")"),
            1);
  // d1, the engine it was handed to, still gets the KV.
  HttpReply r1 = d1->Post("/v1/completions", DecodeBody(prompt, 5, p->RemotePrefillParams(t)));
  Choice c1 = ChoiceOf(r1);
  ASSERT_TRUE(c1.ok) << Describe(r1);
  EXPECT_EQ(c1.tokens, Expected(prompt, 1, 5));
  EXPECT_GE(MetricSum(d1->Metrics(), "kvrelay_loads_total", R"(outcome="ok")"), 1);
  for (Engine* e : {p.get(), d1.get(), d2.get()}) {
    EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s)) << e->config().name;
  }
}

}  // namespace
}  // namespace kvrelay::proctest
