// router_test.cc — `kvrelay router` between real `kvrelay serve` P and D
// processes on loopback (shm transport, tiny shape). Outputs are checked
// token for token against engine::Reference; engines must end idle with no
// block in use.
//
//   RouterTest.OnePrefillOneDecode      30 requests (stream and not), the
//                                       admin routes, 4xx passed through.
//   RouterTest.TwoPrefillTwoDecode      40 requests at concurrency 8; every
//                                       engine gets work.
//   RouterTest.ClientDisconnectCancelsBothLegs
//                                       a client leaving mid-stream (and
//                                       mid-JSON) aborts D; engines idle.
//   RouterTest.PrefillKilledMidRun      2P1D under load, one P SIGKILLed:
//                                       every client gets output or a clean
//                                       error promptly; D ends idle; new
//                                       requests succeed on the other P.
//   RouterTest.BoundsAreEnforced        --max-inflight (503), --max-body-bytes
//                                       (413).
//   RouterTest.StartsBeforeTheEngines   the router waits for /kv_info.
//   RouterTest.RoleMismatchIsAClearError
//   RouterTest.SigtermCancelsInFlightAndExitsZero
//
// Randomness is seeded; the seed is printed ("[seed] ...") and
// KVRELAY_PROC_SEED replays it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "http/http_client.h"
#include "proc/harness.h"
#include "server/text_codec.h"
#include "server/tokenizer.h"

namespace kvrelay::proctest {
namespace {

using Clock = std::chrono::steady_clock;
using Tokens = std::vector<engine::Token>;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}


// --- HTTP to the router ------------------------------------------------------------

HttpReply HttpPost(uint16_t port, const std::string& path, const std::string& body,
                   std::chrono::milliseconds timeout = 30s) {
  return PostOn(port, path, body, "application/json", timeout);
}

HttpReply HttpGet(uint16_t port, const std::string& path) { return GetOn(port, path); }

// What a client of the router got, read the way an OpenAI client reads it.
struct Answer {
  HttpReply reply;
  bool stream = false;
  bool completion = false;       // a completion with finish_reason
  Tokens tokens;                 // choices[0].token_ids (stream: every chunk's, concatenated)
  Tokens streamed;               // stream: the same (kept for the checks that name it)
  std::string finish_reason;
  bool clean_error = false;      // {"error":{message,type,code}} as the body or last event
  json error;
  bool saw_done = false;         // stream: "data: [DONE]" last
  // The status, time and body (its head and tail: a stream's end matters).
  std::string Describe() const {
    std::string body = reply.raw;
    if (body.size() > 1200) body = body.substr(0, 300) + "\n[...]\n" + body.substr(body.size() - 900);
    char t[32];
    std::snprintf(t, sizeof t, "%.3f", reply.seconds);
    return std::string(stream ? "stream" : "json") +
           (reply.status == 0 ? " no HTTP response: " + reply.error
                              : " HTTP " + std::to_string(reply.status)) +
           " after " + t + " s; finish_reason \"" + finish_reason + "\", " +
           std::to_string(tokens.size()) + " tokens; body: " + body;
  }
};

bool IsErrorObject(const json& j) {
  return j.is_object() && j.contains("error") && j["error"].is_object() &&
         j["error"].contains("message") && j["error"]["message"].is_string() &&
         j["error"].contains("type") && j["error"].contains("code");
}

Answer Read(HttpReply reply, bool stream) {
  Answer a;
  a.stream = stream;
  a.reply = std::move(reply);
  const std::string& raw = a.reply.raw;
  const size_t first = raw.find_first_not_of(" \t\r\n");
  const std::string body = first == std::string::npos ? "" : raw.substr(first);
  auto read_completion = [&](const json& j) {
    if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
        j["choices"].empty()) {
      return;
    }
    const json& c = j["choices"][0];
    if (!c.contains("finish_reason") || !c["finish_reason"].is_string()) return;
    a.completion = true;
    a.finish_reason = c["finish_reason"].get<std::string>();
    if (c.contains("token_ids")) a.tokens = c["token_ids"].get<Tokens>();
  };
  // A 200 stream is SSE (possibly opening with ": keep-alive" comments);
  // anything else, or a reply made whole before streaming began, is JSON.
  if (!stream || a.reply.status != 200 || body.rfind("{", 0) == 0) {
    const json j = json::parse(body, nullptr, false);
    if (IsErrorObject(j)) {
      a.clean_error = true;
      a.error = j["error"];
    } else {
      read_completion(j);
    }
    return a;
  }
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;   // comments
    const std::string data = event.substr(6);
    a.saw_done = false;
    if (data == "[DONE]") {
      a.saw_done = true;
      continue;
    }
    const json j = json::parse(data, nullptr, false);
    if (IsErrorObject(j)) {
      a.clean_error = true;
      a.error = j["error"];
      continue;
    }
    // OpenAI's stream: each chunk carries the tokens since the last; the
    // last choice chunk carries finish_reason; a usage chunk has no choices.
    if (j.is_object() && j.contains("choices") && !j["choices"].empty()) {
      const json& c = j["choices"][0];
      if (c.contains("token_ids")) {
        for (engine::Token t : c["token_ids"].get<Tokens>()) a.streamed.push_back(t);
      }
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
        a.completion = true;
        a.finish_reason = c["finish_reason"].get<std::string>();
      }
    }
  }
  a.tokens = a.streamed;
  return a;
}

json CompletionBody(const Tokens& prompt, uint32_t n, bool stream) {
  json b = {{"prompt", prompt}, {"max_tokens", n}};
  if (stream) b["stream"] = true;
  return b;
}

Answer Complete(uint16_t port, const Tokens& prompt, uint32_t n, bool stream,
                std::chrono::milliseconds timeout = 30s) {
  return Read(HttpPost(port, "/v1/completions", CompletionBody(prompt, n, stream).dump(), timeout),
              stream);
}

// The answer is a correct, whole completion of `n` tokens.
::testing::AssertionResult Correct(const Answer& a, const Tokens& prompt, uint32_t n) {
  if (a.reply.status != 200 || !a.completion || a.finish_reason != "length") {
    return ::testing::AssertionFailure() << "not a completion: " << a.Describe();
  }
  const Tokens want = Expected(prompt, 1, n);
  if (a.tokens != want) {
    return ::testing::AssertionFailure() << "wrong tokens: " << a.Describe();
  }
  if (a.stream && (!a.saw_done || a.streamed != want)) {
    return ::testing::AssertionFailure()
           << "stream chunks do not add up, or no [DONE]: " << a.Describe();
  }
  return ::testing::AssertionSuccess();
}

// The answer is a clean error the router made (502 upstream_error, or the
// same object as the body / last SSE event once the response had started).
::testing::AssertionResult CleanError(const Answer& a) {
  if (!a.clean_error) {
    return ::testing::AssertionFailure() << "not a clean error: " << a.Describe();
  }
  if (a.reply.status != 200 && a.reply.status != 502 && a.reply.status != 503) {
    return ::testing::AssertionFailure() << "unexpected status: " << a.Describe();
  }
  if (a.stream && a.reply.status == 200 && !a.saw_done) {
    return ::testing::AssertionFailure() << "error event without [DONE]: " << a.Describe();
  }
  return ::testing::AssertionSuccess();
}

// --- a bare client that can go away mid-response ---------------------------------

class RawClient {
 public:
  ~RawClient() { Close(); }
  bool Connect(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  bool Send(const std::string& path, const std::string& body) {
    const std::string req = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                            "Content-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    return ::send(fd_, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size());
  }
  // Reads until what arrived contains `needle` (after the headers' end when
  // `in_body`), or `timeout`; true if found.
  bool ReadUntil(const std::string& needle, std::chrono::milliseconds timeout,
                 bool in_body = true) {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      const size_t head = buf_.find("\r\n\r\n");
      if (!in_body && buf_.find(needle) != std::string::npos) return true;
      if (in_body && head != std::string::npos &&
          buf_.find(needle, head + 4) != std::string::npos) {
        return true;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return false;
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }
  const std::string& received() const { return buf_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

// --- fixture ------------------------------------------------------------------------

class RouterTest : public ::testing::Test {
 protected:
  RouterTest() : rng_(TestSeed()) {}

  Engine* StartEngine(const std::string& name, const std::string& role,
                      std::vector<std::string> extra = {}, double abort_timeout_s = 30) {
    EngineConfig c;
    c.name = name;
    c.role = role;
    c.transport = "shm";
    c.abort_timeout_s = abort_timeout_s;
    c.extra = std::move(extra);
    std::string err;
    std::unique_ptr<Engine> e = Engine::Start(c, &err);
    EXPECT_NE(e, nullptr) << err;
    if (!e) return nullptr;
    engines_.push_back(std::move(e));
    return engines_.back().get();
  }

  Router* StartRouter(const std::vector<Engine*>& p, const std::vector<Engine*>& d,
                      std::vector<std::string> extra = {}) {
    std::vector<std::string> pu, du;
    for (Engine* e : p) pu.push_back(UrlOf(e->http_port()));
    for (Engine* e : d) du.push_back(UrlOf(e->http_port()));
    std::string err;
    router_ = Router::Start(pu, du, extra, &err);
    EXPECT_NE(router_, nullptr) << err;
    return router_.get();
  }

  // Every engine idle with no block in use, within `bound`.
  void ExpectAllIdle(std::chrono::milliseconds bound = 15s) {
    for (auto& e : engines_) {
      if (!e->proc().Running()) continue;
      EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, bound))
          << e->config().name << " not idle: " << e->DebugState().dump();
    }
  }

  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::unique_ptr<Router> router_;   // destroyed first (members in reverse)
};

// (1) 1P1D: outputs exact, stream or not; the other routes; 4xx as is.
//
// A request only D refuses (here "max_tokens": "x": P's leg carries
// max_tokens 1, so P accepts it) leaves P holding the prefilled KV until its
// --abort-timeout-s: D refuses it before admitting it, and only an admitted
// request tells P it will never pull (an engine gap). P runs with a 4 s
// abort timeout so that the last idle check can wait it out.
TEST_F(RouterTest, OnePrefillOneDecode) {
  Engine* p = StartEngine("P", "prefill", {}, /*abort_timeout_s=*/4);
  Engine* d = StartEngine("D", "decode");
  ASSERT_TRUE(p && d);
  Router* r = StartRouter({p}, {d});
  ASSERT_NE(r, nullptr);

  for (int i = 0; i < 30; ++i) {
    const Tokens prompt = RandomPrompt(rng_, 1 + rng_() % 200);
    const uint32_t n = 1 + static_cast<uint32_t>(rng_() % 32);
    const bool stream = i % 2 == 1;
    const Answer a = Complete(r->port(), prompt, n, stream);
    ASSERT_TRUE(Correct(a, prompt, n)) << "request " << i;
  }
  ExpectAllIdle();
  EXPECT_EQ(r->Outcome("ok"), 30);
  const std::string m = r->Metrics();
  EXPECT_EQ(MetricSum(m, "kvrelay_router_request_latency_seconds_count"), 30);
  EXPECT_EQ(MetricSum(m, "kvrelay_router_time_to_first_token_seconds_count"), 15);
  EXPECT_EQ(MetricSum(m, "kvrelay_router_engine_outstanding_requests"), 0);
  EXPECT_EQ(MetricSum(p->Metrics(), "kvrelay_requests_started_total"), 30);

  // The other routes.
  HttpReply health = HttpGet(r->port(), "/health");
  ASSERT_EQ(health.status, 200) << Describe(health);
  EXPECT_EQ(health.body["status"], "ok");
  EXPECT_EQ(health.body["prefill"][0]["url"], UrlOf(p->http_port()));
  EXPECT_EQ(health.body["decode"][0]["outstanding"], 0);
  HttpReply engines = HttpGet(r->port(), "/engines");
  ASSERT_EQ(engines.status, 200);
  ASSERT_EQ(engines.body.size(), 2u);
  EXPECT_EQ(engines.body[0]["role"], "prefill");
  EXPECT_EQ(engines.body[0]["kv_info"]["engine_id"], p->engine_id());
  EXPECT_EQ(engines.body[1]["kv_info"]["kv_port"], d->ctrl_port());
  HttpReply models = HttpGet(r->port(), "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["data"][0]["id"], "kvrelay-tiny");

  // Bad input: the router's own check, then the engines' 4xx as they sent it.
  HttpReply bad = HttpPost(r->port(), "/v1/completions", "{\"prompt\": [1,");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.raw.find("body is not valid JSON"), std::string::npos) << bad.raw;
  HttpReply engine_said = d->Post("/v1/completions", json{{"prompt", {1, 2}}, {"max_tokens", "x"}});
  for (bool stream : {false, true}) {
    json body = {{"prompt", {1, 2}}, {"max_tokens", "x"}};
    if (stream) body["stream"] = true;
    HttpReply via = HttpPost(r->port(), "/v1/completions", body.dump());
    EXPECT_EQ(via.status, 400);
    EXPECT_EQ(via.raw, engine_said.raw);
  }
  HttpReply too_long = HttpPost(r->port(), "/v1/completions",
                                CompletionBody(Tokens(5000, 3), 1, false).dump());
  EXPECT_EQ(too_long.status, 400) << Describe(too_long);
  EXPECT_GE(r->Outcome("bad_request"), 4);
  ExpectAllIdle(20s);
}

// OpenAI's chat API through the router: both legs go to the engines' chat
// route, P hands the chat's KV to D, and the answer is in chat's shape with
// the tokens the chat's laid-out prompt gives (the same as a plain engine's).
TEST_F(RouterTest, AChatIsHandedOffLikeACompletion) {
  Engine* p = StartEngine("P", "prefill", {}, /*abort_timeout_s=*/4);
  Engine* d = StartEngine("D", "decode");
  Engine* plain = StartEngine("plain", "plain");
  ASSERT_TRUE(p && d && plain);
  Router* r = StartRouter({p}, {d});
  ASSERT_NE(r, nullptr);
  const std::vector<server::ChatMessage> chat = {{"system", "be brief"},
                                                 {"user", "what does a decode engine load"}};
  const Tokens prompt = server::Tokenize(server::ChatPromptText(chat), 32000);
  json messages = json::array();
  for (const server::ChatMessage& m : chat) {
    messages.push_back({{"role", m.role}, {"content", m.content}});
  }
  for (int i = 0; i < 6; ++i) {
    const bool stream = i % 2 == 1;
    const uint32_t n = 3 + static_cast<uint32_t>(i);
    json body = {{"messages", messages}, {"max_completion_tokens", n}, {"stream", stream}};
    const HttpReply via_router = HttpPost(r->port(), "/v1/chat/completions", body.dump());
    const Answer a = Read(via_router, stream);
    ASSERT_TRUE(Correct(a, prompt, n)) << "request " << i;
    const Answer alone = Read(HttpPost(plain->http_port(), "/v1/chat/completions", body.dump()),
                              stream);
    EXPECT_EQ(alone.tokens, a.tokens) << "request " << i;
    if (!stream) {
      EXPECT_EQ(via_router.body["object"], "chat.completion") << a.Describe();
      EXPECT_EQ(via_router.body["choices"][0]["message"]["role"], "assistant");
      EXPECT_EQ(via_router.body["choices"][0]["message"]["content"],
                server::Detokenize(a.tokens));
    } else {
      EXPECT_NE(via_router.raw.find(R"("object":"chat.completion.chunk")"), std::string::npos);
      EXPECT_NE(via_router.raw.find(R"("delta":{"role":"assistant")"), std::string::npos);
    }
  }
  ExpectAllIdle();
  EXPECT_EQ(r->Outcome("ok"), 6);
  EXPECT_EQ(MetricSum(p->Metrics(), "kvrelay_pulls_answered_total", R"(outcome="ok")"), 6);
  EXPECT_EQ(MetricSum(d->Metrics(), "kvrelay_http_chat_requests_total"), 6);
  // A chat the engines refuse is their 400, as they word it.
  const std::string bad = R"({"messages":[{"role":"robot","content":"x"}]})";
  const HttpReply engine_said = HttpPost(d->http_port(), "/v1/chat/completions", bad);
  const HttpReply via = HttpPost(r->port(), "/v1/chat/completions", bad);
  EXPECT_EQ(via.status, 400);
  EXPECT_EQ(via.raw, engine_said.raw);
  ExpectAllIdle(20s);
}

// (2) 2P2D at concurrency 8: outputs exact, every engine used.
// Lifecycle hole 5, at the router: with P paused, a request's P leg waits
// for resume; --max-queue-wait-s ends it with a clean error and cancels
// both legs (the engines' own 300 s bound has not come yet); after resume
// the cluster serves again and both engines drain.
TEST_F(RouterTest, ARequestHeldByAPausedPEndsAtMaxQueueWait) {
  Engine* p = StartEngine("P", "prefill");
  Engine* d = StartEngine("D", "decode");
  ASSERT_TRUE(p && d);
  Router* r = StartRouter({p}, {d}, {"--max-queue-wait-s", "1"});
  ASSERT_NE(r, nullptr);
  HttpReply paused = HttpPost(p->http_port(), "/pause?mode=keep", "");
  ASSERT_EQ(paused.status, 200) << paused.raw;
  const Tokens prompt = RandomPrompt(rng_, 40);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "non-stream");
    const Answer a = Complete(r->port(), prompt, 4, stream, 20s);
    std::printf("[info] %s request held by a paused P answered after %.3f s\n",
                stream ? "a streamed" : "a", a.reply.seconds);
    EXPECT_GE(a.reply.seconds, 0.9) << a.Describe();
    EXPECT_LT(a.reply.seconds, 5.0) << a.Describe();
    EXPECT_TRUE(a.clean_error) << a.Describe();
    EXPECT_NE(a.error.dump().find("max_queue_wait"), std::string::npos) << a.Describe();
  }
  EXPECT_EQ(r->Outcome("queue_wait_expired"), 2);
  ASSERT_EQ(HttpPost(p->http_port(), "/resume", "").status, 200);
  const Answer ok = Complete(r->port(), prompt, 4, false);
  EXPECT_TRUE(Correct(ok, prompt, 4)) << ok.Describe();
  ExpectAllIdle();
}

TEST_F(RouterTest, TwoPrefillTwoDecode) {
  Engine* p1 = StartEngine("P1", "prefill");
  Engine* p2 = StartEngine("P2", "prefill");
  Engine* d1 = StartEngine("D1", "decode");
  Engine* d2 = StartEngine("D2", "decode");
  ASSERT_TRUE(p1 && p2 && d1 && d2);
  Router* r = StartRouter({p1, p2}, {d1, d2});
  ASSERT_NE(r, nullptr);

  constexpr int kRequests = 40, kConcurrency = 8;
  std::vector<Tokens> prompts;
  std::vector<uint32_t> ns;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(RandomPrompt(rng_, 1 + rng_() % 300));
    ns.push_back(1 + static_cast<uint32_t>(rng_() % 24));
  }
  std::vector<Answer> answers(kRequests);
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kConcurrency; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < kRequests; i = next++) {
        answers[i] = Complete(r->port(), prompts[i], ns[i], i % 3 == 0);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(Correct(answers[i], prompts[i], ns[i])) << "request " << i;
  }
  double total_p = 0, total_d = 0;
  for (Engine* e : {p1, p2, d1, d2}) {
    const double started = MetricSum(e->Metrics(), "kvrelay_requests_started_total");
    EXPECT_GT(started, 0) << e->config().name << " got no request";
    (e == p1 || e == p2 ? total_p : total_d) += started;
  }
  EXPECT_EQ(total_p, kRequests);
  EXPECT_EQ(total_d, kRequests);
  EXPECT_EQ(r->Outcome("ok"), kRequests);
  ExpectAllIdle();
}

// (3) A client that leaves mid-stream, or while waiting for its JSON, makes
// the router cancel both legs: D aborts, both engines end idle.
TEST_F(RouterTest, ClientDisconnectCancelsBothLegs) {
  Engine* p = StartEngine("P", "prefill");
  // 5 ms per decode step: 400 tokens take about 2 s.
  Engine* d = StartEngine("D", "decode", {"--step-base-us", "5000"});
  ASSERT_TRUE(p && d);
  Router* r = StartRouter({p}, {d});
  ASSERT_NE(r, nullptr);

  int disconnects = 0;
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "stream" : "json");
    // (The engine counts a request its client left in
    // kvrelay_client_disconnects_total, and aborts it.)
    const double aborted_before = MetricSum(d->Metrics(), "kvrelay_client_disconnects_total");
    RawClient c;
    ASSERT_TRUE(c.Connect(r->port()));
    ASSERT_TRUE(c.Send("/v1/completions",
                       CompletionBody(RandomPrompt(rng_, 100), 400, stream).dump()));
    // Wait until D is generating: a token event, or (JSON: nothing is sent
    // before the end) D's state.
    if (stream) {
      ASSERT_TRUE(c.ReadUntil("\"token_ids\":[", 10s, stream)) << c.received();
    } else {
      ASSERT_TRUE(WaitFor([&] { return d->DebugState()["engine"]["running"] == 1; }, 10s, 2ms))
          << d->DebugState().dump();
    }
    const auto left_at = Clock::now();
    c.Close();
    ++disconnects;
    // D aborts the request promptly (well before its 2 s of decoding end).
    EXPECT_TRUE(WaitFor(
        [&] {
          return MetricSum(d->Metrics(), "kvrelay_client_disconnects_total") > aborted_before;
        },
        10s));
    EXPECT_LT(SecondsSince(left_at), 1.5) << "D's abort came late";
    EXPECT_TRUE(WaitFor([&] { return r->Outcome("client_disconnect") == disconnects; }, 10s))
        << r->Metrics();
    ExpectAllIdle();
  }
  // The router still serves.
  const Tokens prompt = RandomPrompt(rng_, 20);
  EXPECT_TRUE(Correct(Complete(r->port(), prompt, 5, true), prompt, 5));
  ExpectAllIdle();
}

// (3b) An admin abort on D (abort_requests, all) reaches the client as a
// plain engine's abort: 200 with finish_reason "abort" (the JSON body, or the
// stream's last chunk then [DONE]), never a 502; the router counts the
// outcome "aborted".
TEST_F(RouterTest, AnAbortOnDReachesTheClientAsFinishReasonAbort) {
  Engine* p = StartEngine("P", "prefill");
  Engine* d = StartEngine("D", "decode", {"--step-base-us", "5000"});
  ASSERT_TRUE(p && d);
  Router* r = StartRouter({p}, {d});
  ASSERT_NE(r, nullptr);
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "json");
    Answer a;
    std::thread client([&] { a = Complete(r->port(), RandomPrompt(rng_, 60), 400, stream); });
    ASSERT_TRUE(WaitFor([&] { return d->DebugState()["engine"]["running"] == 1; }, 10s, 2ms))
        << d->DebugState().dump();
    HttpReply abort = d->Post("/abort_requests", json::object());
    EXPECT_EQ(abort.status, 200) << Describe(abort);
    client.join();
    EXPECT_EQ(a.reply.status, 200) << a.Describe();
    EXPECT_TRUE(a.completion) << a.Describe();
    EXPECT_EQ(a.finish_reason, "abort") << a.Describe();
    EXPECT_FALSE(a.clean_error) << a.Describe();
    if (stream) {
      EXPECT_TRUE(a.saw_done) << a.Describe();
    }
    EXPECT_LT(a.tokens.size(), 400u) << a.Describe();
  }
  EXPECT_EQ(r->Outcome("aborted"), 2);
  EXPECT_EQ(r->Outcome("decode_failed"), 0);
  ExpectAllIdle();
}

// Every /metrics (the router's, P's, D's) after traffic of every kind passes
// Prometheus' own linter (promtool, from scripts/setup --tests).
TEST_F(RouterTest, MetricsPassPromtool) {
  ASSERT_EQ(std::system("command -v promtool >/dev/null"), 0)
      << "promtool is missing: scripts/setup --tests installs it (Debian's prometheus)";
  Engine* p = StartEngine("P", "prefill");
  Engine* d = StartEngine("D", "decode");
  ASSERT_TRUE(p && d);
  Router* r = StartRouter({p}, {d});
  ASSERT_NE(r, nullptr);
  for (int i = 0; i < 6; ++i) (void)Complete(r->port(), RandomPrompt(rng_, 20), 4, i % 2 == 1);
  (void)HttpPost(r->port(), "/v1/completions", "{\"prompt\": [1,");
  (void)HttpPost(r->port(), "/v1/completions", std::string(2 << 20, 'x'));
  ExpectAllIdle();
  const std::vector<std::pair<std::string, std::string>> scrapes = {
      {"router", r->Metrics()}, {"P", p->Metrics()}, {"D", d->Metrics()}};
  for (const auto& [name, text] : scrapes) {
    SCOPED_TRACE(name);
    ASSERT_FALSE(text.empty());
    const std::string file = TestDir() + "/metrics-" + name + ".txt";
    std::ofstream(file) << text;
    const std::string out = TestDir() + "/promtool-" + name + ".txt";
    const int rc = std::system(("promtool check metrics < " + file + " > " + out + " 2>&1").c_str());
    std::ifstream in(out);
    const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(rc, 0) << said;
    EXPECT_TRUE(said.empty()) << said;
  }
}

// (4) 2P1D under load; one P is SIGKILLed. Every client gets its output or
// a clean error within a few seconds, D ends idle with nothing leaked, and
// new requests succeed on the other P.
TEST_F(RouterTest, PrefillKilledMidRun) {
  // P steps of 20 ms so that prefills are in flight when P dies.
  Engine* p1 = StartEngine("P1", "prefill", {"--step-base-us", "20000"}, 10);
  Engine* p2 = StartEngine("P2", "prefill", {"--step-base-us", "20000"}, 10);
  Engine* d = StartEngine("D", "decode", {"--peer-dead-after-s", "2", "--step-base-us", "2000"},
                          10);
  ASSERT_TRUE(p1 && p2 && d);
  Router* r = StartRouter({p1, p2}, {d});
  ASSERT_NE(r, nullptr);

  struct Done {
    Tokens prompt;
    uint32_t n;
    Answer answer;
    Clock::time_point start, end;
  };
  std::mutex mu;
  std::vector<Done> done;
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0};
  std::vector<std::thread> clients;
  std::vector<uint64_t> seeds;
  for (int t = 0; t < 8; ++t) seeds.push_back(rng_());
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937_64 rng(seeds[t]);
      for (int i = 0; !stop; ++i) {
        Done x;
        x.prompt = RandomPrompt(rng, 50 + rng() % 250);
        x.n = 1 + static_cast<uint32_t>(rng() % 40);
        x.start = Clock::now();
        x.answer = Complete(r->port(), x.prompt, x.n, (t + i) % 2 == 0, 40s);
        x.end = Clock::now();
        ++completed;
        std::lock_guard<std::mutex> lock(mu);
        done.push_back(std::move(x));
      }
    });
  }
  ASSERT_TRUE(WaitFor([&] { return completed >= 16; }, 30s));
  // Kill P1 while it has prefills running.
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(r->Metrics(), "kvrelay_router_engine_outstanding_requests",
                     "url=\"" + UrlOf(p1->http_port()) + "\"") > 0;
  }, 10s));
  const int before_kill = completed;
  const auto killed_at = Clock::now();
  p1->proc().Kill(SIGKILL);
  ASSERT_TRUE(p1->proc().Wait(5s).has_value());
  // Keep the load on for a while after the kill.
  EXPECT_TRUE(WaitFor([&] { return completed >= before_kill + 24; }, 30s));
  stop = true;
  for (auto& t : clients) t.join();

  int ok = 0, errors = 0, in_flight_at_kill = 0;
  for (const Done& x : done) {
    const bool good = Correct(x.answer, x.prompt, x.n);
    if (good) {
      ++ok;
    } else {
      EXPECT_TRUE(CleanError(x.answer)) << "neither output nor a clean error";
      ++errors;
    }
    const double took = std::chrono::duration<double>(x.end - x.start).count();
    if (x.start <= killed_at && x.end >= killed_at) {
      ++in_flight_at_kill;
      // Failed at once (P's leg broke), or D gave up on P after 2 s and
      // recomputed: either way within a few seconds of the kill.
      EXPECT_LT(std::chrono::duration<double>(x.end - killed_at).count(), 8.0)
          << x.answer.Describe();
    }
    EXPECT_LT(took, 15.0) << x.answer.Describe();
  }
  std::printf("[router] %zu requests: %d ok, %d clean errors, %d in flight at the kill\n",
              done.size(), ok, errors, in_flight_at_kill);
  EXPECT_GT(in_flight_at_kill, 0);

  // The router took P1 out; new requests all go to P2 and succeed.
  EXPECT_TRUE(WaitFor([&] {
    HttpReply e = HttpGet(r->port(), "/engines");
    return e.status == 200 && e.body.is_array() && e.body[0]["up"] == false;
  }, 10s));
  for (int i = 0; i < 10; ++i) {
    const Tokens prompt = RandomPrompt(rng_, 1 + rng_() % 200);
    const uint32_t n = 1 + static_cast<uint32_t>(rng_() % 16);
    EXPECT_TRUE(Correct(Complete(r->port(), prompt, n, i % 2 == 0), prompt, n));
  }
  ExpectAllIdle(25s);
  const std::string m = r->Metrics();
  EXPECT_EQ(MetricSum(m, "kvrelay_router_requests_total"), static_cast<double>(done.size() + 10));
  EXPECT_EQ(MetricSum(m, "kvrelay_router_inflight_requests"), 0);
}

// A D that dies after P answered and before it pulled cannot release P's KV,
// and P's leg is over, so there is nothing left to cancel on P: the router
// releases the transfer at P (POST /kv_release) once the D leg fails, and P
// ends the send at once instead of at its --abort-timeout-s (60 s here).
// D is stopped (SIGSTOP) first so that it neither pulls nor answers.
TEST_F(RouterTest, ADecodeKilledBeforeItPulledLeavesNothingHeldAtP) {
  Engine* p = StartEngine("P", "prefill", {}, /*abort_timeout_s=*/60);
  Engine* d = StartEngine("D", "decode");
  ASSERT_TRUE(p && d);
  Router* r = StartRouter({p}, {d});
  ASSERT_NE(r, nullptr);

  // The call itself: bad bodies and a D engine are refused with a reason.
  HttpReply bad = p->Post("/kv_release", json{{"transfer_id", "xyz"}});
  EXPECT_EQ(bad.status, 400) << bad.raw;
  EXPECT_NE(bad.raw.find("32 lowercase hex"), std::string::npos) << bad.raw;
  HttpReply on_d = d->Post("/kv_release", json{{"transfer_id", NewTransferId(rng_)}});
  EXPECT_EQ(on_d.status, 400) << on_d.raw;
  EXPECT_NE(on_d.raw.find("role decode"), std::string::npos) << on_d.raw;
  HttpReply unknown = p->Post("/kv_release", json{{"transfer_id", NewTransferId(rng_)}});
  EXPECT_EQ(unknown.status, 200) << unknown.raw;   // a tombstone: a late claim fails fast

  d->proc().Kill(SIGSTOP);
  const Tokens prompt = RandomPrompt(rng_, 120);
  Answer answer;
  std::thread client([&] { answer = Complete(r->port(), prompt, 4, false, 30s); });
  // P prefilled and answered: its leg is over and it holds the KV.
  const std::string p_url = "url=\"" + UrlOf(p->http_port()) + "\"";
  const bool p_answered = WaitFor([&] {
    return MetricSum(p->Metrics(), "kvrelay_requests_started_total") == 1 &&
           MetricSum(r->Metrics(), "kvrelay_router_engine_outstanding_requests", p_url) == 0;
  }, 10s);
  EXPECT_TRUE(p_answered);
  EXPECT_FALSE(p->IdleAndEmpty()) << p->DebugState().dump();
  const auto killed_at = Clock::now();
  d->proc().Kill(SIGKILL);
  ASSERT_TRUE(d->proc().Wait(5s).has_value());
  client.join();
  EXPECT_TRUE(CleanError(answer)) << answer.Describe();
  EXPECT_TRUE(WaitFor([&] { return p->IdleAndEmpty(); }, 10s)) << p->DebugState().dump();
  const double freed_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  std::printf("[router] P freed the KV of a request whose D died %.3f s after the kill "
              "(P's --abort-timeout-s: 60)\n", freed_s);
  EXPECT_LT(freed_s, 10.0);
  EXPECT_EQ(MetricSum(r->Metrics(), "kvrelay_router_transfer_releases_total",
                      "result=\"ok\""), 1);
  EXPECT_EQ(MetricSum(p->Metrics(), "kvrelay_kv_releases_total"), 2);   // with `unknown`
}

// --max-inflight: one more request gets 503 (and the router recovers);
// --max-body-bytes: a longer body gets 413 with an error object.
TEST_F(RouterTest, BoundsAreEnforced) {
  Engine* p = StartEngine("P", "prefill");
  Engine* d = StartEngine("D", "decode", {"--step-base-us", "5000"});
  ASSERT_TRUE(p && d);
  Router* r = StartRouter({p}, {d}, {"--max-inflight", "1", "--max-body-bytes", "4000"});
  ASSERT_NE(r, nullptr);
  RawClient c;
  ASSERT_TRUE(c.Connect(r->port()));
  ASSERT_TRUE(c.Send("/v1/completions", CompletionBody(RandomPrompt(rng_, 50), 500, true).dump()));
  ASSERT_TRUE(c.ReadUntil("\"token_ids\":[", 10s)) << c.received();
  const Tokens prompt = RandomPrompt(rng_, 10);
  const Answer busy = Complete(r->port(), prompt, 3, false);
  EXPECT_EQ(busy.reply.status, 503) << busy.Describe();
  EXPECT_TRUE(busy.clean_error) << busy.Describe();
  EXPECT_NE(busy.reply.raw.find("--max-inflight"), std::string::npos);
  HttpReply big = HttpPost(r->port(), "/v1/completions",
                           CompletionBody(Tokens(1000, 12345), 1, false).dump());
  EXPECT_EQ(big.status, 413) << Describe(big);
  EXPECT_TRUE(IsErrorObject(big.body)) << Describe(big);
  c.Close();
  ASSERT_TRUE(WaitFor([&] {
    return MetricSum(r->Metrics(), "kvrelay_router_inflight_requests") == 0;
  }, 10s));
  EXPECT_TRUE(Correct(Complete(r->port(), prompt, 3, false), prompt, 3));
  EXPECT_EQ(r->Outcome("rejected"), 1);
  ExpectAllIdle();
}

// The router may start first: it waits (bounded) for every /kv_info.
TEST_F(RouterTest, StartsBeforeTheEngines) {
  const uint16_t p_port = FreePort(), d_port = FreePort();
  const uint16_t p_ctrl = FreePort(), d_ctrl = FreePort();
  ASSERT_TRUE(p_port && d_port && p_ctrl && d_ctrl);
  std::string err;
  auto router = Router::Start({UrlOf(p_port)}, {UrlOf(d_port)}, {}, &err, /*wait_up=*/false);
  ASSERT_NE(router, nullptr) << err;
  // Not serving yet: the engines are not there.
  EXPECT_NE(HttpGet(router->port(), "/health").status, 200);
  auto serve = [&](const char* role, uint16_t port, uint16_t ctrl) {
    return Proc::Start(KvrelayBinary(),
                       {"serve", "--role", role, "--model-shape", "tiny", "--transport", "shm",
                        "--host", "127.0.0.1", "--port", std::to_string(port), "--ctrl-port",
                        std::to_string(ctrl)},
                       TestDir() + "/" + role + ".log", &err);
  };
  auto p = serve("prefill", p_port, p_ctrl);
  auto d = serve("decode", d_port, d_ctrl);
  ASSERT_TRUE(p && d) << err;
  ASSERT_TRUE(WaitFor([&] { return HttpGet(router->port(), "/health").status == 200; }, 30s))
      << router->proc().ReadLog();
  const Tokens prompt = RandomPrompt(rng_, 30);
  EXPECT_TRUE(Correct(Complete(router->port(), prompt, 8, false), prompt, 8));
  router.reset();   // stop it before the engines
}

// An engine in the wrong list is refused with a message naming it.
TEST_F(RouterTest, RoleMismatchIsAClearError) {
  Engine* p = StartEngine("P", "prefill");
  Engine* d = StartEngine("D", "decode");
  ASSERT_TRUE(p && d);
  std::string err;
  // Swapped: the decode engine given as --prefill.
  auto r = Router::Start({UrlOf(d->http_port())}, {UrlOf(p->http_port())}, {}, &err,
                         /*wait_up=*/false);
  ASSERT_NE(r, nullptr) << err;
  std::optional<int> st = r->proc().Wait(20s);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) != 0);
  const std::string log = r->proc().ReadLog();
  EXPECT_NE(log.find("has role \"decode\" but was given as --prefill"), std::string::npos) << log;
}

// SIGTERM: in-flight clients get a clean end, the engines abort their legs,
// the router exits 0.
TEST_F(RouterTest, SigtermCancelsInFlightAndExitsZero) {
  Engine* p = StartEngine("P", "prefill");
  Engine* d = StartEngine("D", "decode", {"--step-base-us", "5000"});
  ASSERT_TRUE(p && d);
  Router* r = StartRouter({p}, {d});
  ASSERT_NE(r, nullptr);
  RawClient c;
  ASSERT_TRUE(c.Connect(r->port()));
  ASSERT_TRUE(c.Send("/v1/completions", CompletionBody(RandomPrompt(rng_, 50), 500, true).dump()));
  ASSERT_TRUE(c.ReadUntil("\"token_ids\":[", 10s)) << c.received();
  const auto t0 = Clock::now();
  r->proc().Kill(SIGTERM);
  std::optional<int> st = r->proc().Wait(10s);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << r->proc().ReadLog();
  EXPECT_LT(SecondsSince(t0), 5.0);
  EXPECT_TRUE(c.ReadUntil("data: [DONE]", 5s)) << c.received();
  EXPECT_NE(c.received().find("the router is shutting down"), std::string::npos);
  ExpectAllIdle();
}

}  // namespace
}  // namespace kvrelay::proctest
