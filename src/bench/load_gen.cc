#include "bench/load_gen.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>
#include <unistd.h>

#include "base/mutex.h"
#include "base/prng.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "http/http_client.h"
#include "os/clock.h"
#include "router/sse_splitter.h"
#include "server/completion_response.h"
#include "server/text_codec.h"
#include "server/tokenizer.h"

namespace kvrelay {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  p.n = v.size();
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  p.max = v.back();
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  return p;
}

struct Spec {
  std::vector<engine::Token> prompt;
  uint32_t max_tokens = 0;
  bool disconnect = false;
  double disconnect_after_s = 0;
  // A chat: its one user message ("" for a completion); `prompt` is then
  // the chat's laid-out ids.
  std::string chat;
};

// The request's path and body (streamed, with usage, when `stream`).
std::pair<const char*, json> RequestOf(const Spec& spec, bool stream) {
  json body = spec.chat.empty()
                  ? json{{"prompt", spec.prompt}, {"max_tokens", spec.max_tokens}}
                  : json{{"messages", {{{"role", "user"}, {"content", spec.chat}}}},
                         {"max_completion_tokens", spec.max_tokens}};
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return {spec.chat.empty() ? "/v1/completions" : "/v1/chat/completions", std::move(body)};
}

Spec MakeSpec(const LoadOptions& o, uint32_t i, uint32_t vocab, const OutputChecker* checker) {
  Prng prng(Mix64(o.seed * 0x9E3779B97F4A7C15ull + i));
  Spec s;
  const uint32_t plen = o.prompt_min + static_cast<uint32_t>(
                                           prng.Uniform(o.prompt_max - o.prompt_min + 1));
  for (uint32_t k = 0; k < plen; ++k) {
    s.prompt.push_back(static_cast<engine::Token>(1 + prng.Uniform(vocab - 1)));
  }
  s.max_tokens = o.output_min + static_cast<uint32_t>(prng.Uniform(o.output_max - o.output_min + 1));
  s.disconnect = prng.Uniform(1'000'000) < static_cast<uint64_t>(o.disconnect_fraction * 1e6);
  // A moment inside a typical request's life: while queued, prefilling,
  // transferring or decoding.
  s.disconnect_after_s = static_cast<double>(prng.Uniform(500)) / 1000.0;  // 0 .. 0.5 s
  // Drawn last, so a completion's draws are those of a load without chats.
  if (prng.Uniform(1'000'000) < static_cast<uint64_t>(o.chat_fraction * 1e6)) {
    // A word per drawn id, less the layout's tokens, scaled once if a real tokenizer cuts
    // words; a chat still outside --prompt-tokens-min/max goes as the completion drawn.
    auto chat_ids = [&](const std::string& text) {
      const server::ChatMessage m{"user", text};
      return checker != nullptr ? checker->ChatPrompt(text)
                                : std::optional(server::EncodeChatText(nullptr, {&m, 1}, vocab));
    };
    const std::optional<std::vector<engine::Token>> empty = chat_ids("");
    const size_t layout = empty ? empty->size() : 0, target = s.prompt.size();
    size_t words = target > layout + 1 ? target - layout : 1;
    for (int attempt = 0; empty && attempt < 2; ++attempt) {
      std::string text;
      for (size_t k = 0; k < words; ++k) {
        text += (k == 0 ? "w" : " w") + std::to_string(s.prompt[k % target]);
      }
      std::optional<std::vector<engine::Token>> ids = chat_ids(text);
      if (!ids) break;
      if (ids->size() >= o.prompt_min && ids->size() <= o.prompt_max) {
        s.chat = std::move(text);
        s.prompt = std::move(*ids);
        break;
      }
      const size_t got = ids->size() > layout ? ids->size() - layout : 1;
      words = std::max<size_t>(1, words * (target > layout ? target - layout : 1) / got);
    }
  }
  return s;
}

// One request's fate.
enum class Fate { kOk, kCleanError, kDisconnected, kFailed };

struct Outcome {
  Fate fate = Fate::kFailed;
  std::string why;
  double ttft_s = -1, e2e_s = 0;
  uint32_t tokens = 0;
  bool whole_exact = false;   // with a checker
};

std::string RequestIdOf(const LoadOptions& o, uint32_t i) {
  return "load-" + std::to_string(o.seed) + "-" + std::to_string(i);
}

// One streamed request, read as an OpenAI SDK reads it: the tokens are the
// concatenation of the chunks' choices, the finish_reason that of the chunk
// that carries one, the usage that of the chunk after it (asked for), then
// [DONE]. Every token is then checked against the emulated model.
Outcome RunOne(const std::string& url, const Spec& spec, const std::string& request_id,
               const engine::ModelShape& shape, OutputChecker* checker, double timeout_s) {
  Outcome out;
  auto [path, body] = RequestOf(spec, /*stream=*/true);
  body["request_id"] = request_id;
  if (checker != nullptr) body["ignore_eos"] = true;
  http::ClientRequest req;
  req.method = "POST";
  req.target = path;
  req.body = body.dump();
  int status = 0;
  router::SseSplitter sse;
  bool finished = false;   // [DONE] seen
  std::atomic<bool> cut_by_us{false};
  std::string reason;      // the finish_reason of the chunk that had one
  std::string error_message;
  std::string bad;         // a stream that breaks OpenAI's shape
  std::optional<json> usage;
  std::vector<engine::TokenOut> toks;
  const Clock::time_point t0 = Clock::now();
  http::ClientSink sink;
  sink.on_status = [&](int s) { status = s; };
  sink.on_data = [&](std::string_view data) {
    sse.Feed(data);
    while (std::optional<std::string> event = sse.Next()) {
      const std::optional<std::string> data_line = router::SseSplitter::DataOf(*event);
      if (!data_line) continue;
      const std::string& ev = *data_line;
      if (ev == "[DONE]") {
        finished = true;
        continue;
      }
      if (finished && bad.empty()) bad = "an event after [DONE]";
      json j = json::parse(ev, nullptr, false);
      if (j.is_discarded()) {
        if (bad.empty()) bad = "an event that is not JSON: " + ev.substr(0, 80);
        continue;
      }
      if (j.contains("error")) {
        error_message = j["error"].value("message", "error");
        continue;
      }
      const json choices = j.value("choices", json::array());
      if (choices.empty()) {
        if (j.contains("usage")) {
          if (reason.empty() && bad.empty()) bad = "the usage chunk came before the finish";
          usage = j["usage"];
        }
        continue;
      }
      if (usage && bad.empty()) bad = "a choice after the usage chunk";
      if (!reason.empty() && bad.empty()) bad = "a choice after the one with finish_reason";
      const json& c = choices[0];
      // The shape an SDK reads: a chat's chunks carry a delta, a
      // completion's a text.
      const bool chat = !spec.chat.empty();
      const server::Api api = chat ? server::Api::kChat : server::Api::kCompletions;
      if (bad.empty() && (j.value("object", "") != server::ObjectName(api, /*chunk=*/true) ||
                          !c.contains(chat ? "delta" : "text"))) {
        bad = std::string("a chunk not in ") + (chat ? "a chat's" : "a completion's") +
              " shape: " + ev.substr(0, 120);
      }
      const json ids = c.value("token_ids", json::array());
      const json vers = c.value("weights_versions", json::array());
      if (ids.size() != vers.size() && bad.empty()) bad = "token_ids and weights_versions differ";
      for (size_t k = 0; k < ids.size() && k < vers.size(); ++k) {
        toks.push_back(engine::TokenOut{0, ids[k].get<engine::Token>(), vers[k].get<uint64_t>()});
      }
      if (out.ttft_s < 0 && !ids.empty()) out.ttft_s = SecondsSince(t0);
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
        reason = c["finish_reason"].get<std::string>();
      }
    }
    return SecondsSince(t0) < timeout_s;
  };
  http::ClientOptions opts;
  opts.connect_timeout = Duration::Seconds(10);
  opts.idle_timeout = Duration::Nanoseconds(static_cast<int64_t>(timeout_s * 1e9));
  http::BlockingCall call;
  // A client that leaves mid-request, even while no byte arrives: a
  // watchdog cancels the call (its connection closes) at its moment.
  struct Watch {
    Mutex mu;
    CondVar cv;
    bool request_over GUARDED_BY(mu) = false;
  } watch;
  std::thread watchdog;
  if (spec.disconnect) {
    watchdog = std::thread([&] {
      MutexLock lock(&watch.mu);
      if (!watch.cv.WaitFor(&watch.mu, std::chrono::duration<double>(spec.disconnect_after_s),
                            [&]() REQUIRES(watch.mu) { return watch.request_over; })) {
        cut_by_us = true;
        call.Cancel();
      }
    });
  }
  Result<http::ClientResponse> r = call.Run(url, std::move(req), opts, std::move(sink));
  if (watchdog.joinable()) {
    {
      MutexLock lock(&watch.mu);
      watch.request_over = true;
    }
    watch.cv.NotifyAll();
    watchdog.join();
  }
  out.e2e_s = SecondsSince(t0);
  if (cut_by_us) {
    out.fate = Fate::kDisconnected;
    return out;
  }
  if (!r.ok() && status == 0) {
    out.why = "no response: " + r.status().message();
    return out;
  }
  if (status != 200) {
    json j = r.ok() ? json::parse(r->body, nullptr, false) : json();
    if (!j.is_discarded() && j.is_object() && j.contains("error")) {
      out.fate = Fate::kCleanError;
      out.why = j["error"].value("message", "");
    } else {
      out.why = "HTTP " + std::to_string(status) + " without a JSON error";
    }
    return out;
  }
  if (!finished) {
    out.why = out.e2e_s >= timeout_s ? "timed out" : "stream cut off before [DONE]";
    return out;
  }
  if (!bad.empty()) {
    out.why = "not OpenAI's stream: " + bad;
    return out;
  }
  if (!error_message.empty()) {
    out.fate = Fate::kCleanError;
    out.why = error_message;
    return out;
  }
  if (reason.empty()) {
    out.why = "no chunk with a finish_reason";
    return out;
  }
  if (reason == "abort" || reason == "error") {
    out.fate = Fate::kCleanError;
    out.why = reason;
    return out;
  }
  if (!usage || usage->value("completion_tokens", uint64_t{0}) != toks.size() ||
      usage->value("prompt_tokens", uint64_t{0}) != spec.prompt.size()) {
    out.why = "the usage chunk does not count what was streamed";
    return out;
  }
  if (toks.size() != spec.max_tokens) {
    out.why = "got " + std::to_string(toks.size()) + " tokens, asked " +
              std::to_string(spec.max_tokens);
    return out;
  }
  std::string wrong;
  if (checker != nullptr) {
    std::vector<engine::Token> ids;
    std::vector<uint64_t> versions;
    for (const engine::TokenOut& t : toks) {
      ids.push_back(t.token);
      versions.push_back(t.weights_version);
    }
    wrong = checker->Check(spec.prompt, ids, versions, &out.whole_exact);
  } else {
    wrong = engine::CheckOutput(spec.prompt, toks, shape);
  }
  if (!wrong.empty()) {
    out.why = "wrong output: " + wrong;
    return out;
  }
  out.tokens = static_cast<uint32_t>(toks.size());
  out.fate = Fate::kOk;
  return out;
}

// The headers of an engine's signed /debug/* or admin request ({} without a
// token).
Result<std::vector<std::pair<std::string, std::string>>> AuthHeaders(
    const std::string& base, const std::string& token, const std::string& method,
    const std::string& path, const std::string& body) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (token.empty()) return headers;
  Result<std::string> a = AdminAuthorizationFor(base, token, method, path, body);
  if (!a.ok()) return a.status();
  headers.emplace_back("Authorization", *a);
  return headers;
}

Result<json> GetJson(const std::string& base, const std::string& path,
                     const std::string& token = "") {
  http::ClientRequest req;
  req.target = path;
  if (path.rfind("/debug", 0) == 0) {  // an engine's /debug/*: signed
    auto h = AuthHeaders(base, token, "GET", path, "");
    if (!h.ok()) return h.status();
    req.headers = std::move(*h);
  }
  http::ClientOptions opts;
  opts.connect_timeout = Duration::Seconds(5);
  opts.idle_timeout = Duration::Seconds(30);
  Result<http::ClientResponse> r = http::Fetch(base, std::move(req), opts);
  if (!r.ok()) return Status(StatusCode::kUnavailable, base + path + ": " + r.status().message());
  if (r->status != 200) {
    return Status(StatusCode::kNotFound, base + path + ": HTTP " + std::to_string(r->status));
  }
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded()) return InvalidArgumentError(base + path + ": not JSON");
  return j;
}

ControlOutcome Call(const std::string& engine_url, const std::string& token,
                    const std::string& call, const std::map<std::string, std::string>& params,
                    double at_s, const std::vector<std::string>& some_ids = {}) {
  ControlOutcome c;
  c.call = call;
  c.engine = engine_url;
  c.at_s = at_s;
  std::string path = "/" + call, body;
  if (call == "update_weights") {
    json b = json::object();
    for (const auto& [k, v] : params) {
      if (k == "version") {
        b[k] = std::stoull(v);
      } else {
        b[k] = v;
      }
    }
    body = b.dump();
  } else if (call == "abort_requests") {
    body = params.count("some") ? json{{"request_ids", some_ids}}.dump() : "{}";
  } else {
    char sep = '?';
    for (const auto& [k, v] : params) {
      path += sep + k + "=" + v;
      sep = '&';
    }
  }
  const Clock::time_point t0 = Clock::now();
  auto headers = AuthHeaders(engine_url, token, "POST", path, body);
  if (!headers.ok()) {
    c.detail = headers.status().message();
    return c;
  }
  http::ClientRequest req;
  req.method = "POST";
  req.target = path;
  req.body = body;
  req.headers = std::move(*headers);
  http::ClientOptions opts;
  opts.idle_timeout = Duration::Seconds(900);
  Result<http::ClientResponse> r = http::Fetch(engine_url, std::move(req), opts);
  c.latency_s = SecondsSince(t0);
  if (!r.ok()) {
    c.detail = r.status().message();
    return c;
  }
  c.http_status = r->status;
  json j = json::parse(r->body, nullptr, false);
  c.ok = r->status == 200 && !j.is_discarded() && j.value("ok", false);
  if (!j.is_discarded()) c.detail = j.value("detail", j.dump());
  return c;
}

}  // namespace

bool LoadReport::passed() const {
  if (failed != 0) return false;
  for (const auto& c : checks) {
    if (!c.ok) return false;
  }
  // A call that answered with its result (200 done, 409 refused: e.g.
  // reset_prefix_cache while requests hold blocks) behaved; one that
  // errored, hung or broke the connection did not.
  for (const auto& c : controls) {
    if (c.http_status != 200 && c.http_status != 409) return false;
  }
  return true;
}

LoadReport RunLoad(const LoadOptions& o) {
  LoadReport rep;
  rep.url = o.url;
  rep.seed = o.seed;
  rep.requests = o.requests;
  rep.concurrency = o.concurrency;
  auto check = [&](std::string name, bool ok, std::string detail) {
    rep.checks.push_back(CheckOutcome{std::move(name), ok, std::move(detail)});
  };

  // Who serves: the router's /engines, or the URL itself.
  std::vector<std::string> engines = o.engines;
  std::vector<std::string> p_engines, d_engines;
  if (engines.empty()) {
    if (auto list = GetJson(o.url, "/engines"); list.ok()) {
      for (const json& e : *list) {
        const std::string url = e.value("url", "");
        const std::string role = e.value("role", "");
        engines.push_back(url);
        if (role == "prefill" || role == "both") p_engines.push_back(url);
        if (role == "decode" || role == "both") d_engines.push_back(url);
      }
    } else {
      engines.push_back(o.url);
    }
  }
  if (p_engines.empty() && d_engines.empty()) {
    for (const std::string& e : engines) {
      auto info = GetJson(e, "/kv_info");
      const std::string role = info.ok() ? info->value("role", "") : "";
      if (role == "prefill" || role == "both" || role == "plain") p_engines.push_back(e);
      if (role == "decode" || role == "both" || role == "plain") d_engines.push_back(e);
    }
  }
  engine::ModelShape shape;
  if (o.checker != nullptr) {
    shape.vocab = o.checker->vocab();
  } else {
    auto info = GetJson(engines.front(), "/kv_info");
    if (!info.ok() || !engine::ModelShapeByName(info->value("model_shape", ""), &shape)) {
      check("engines reachable", false,
            info.ok() ? "unknown model shape" : info.status().ToString());
      return rep;
    }
  }

  std::vector<Outcome> outcomes(o.requests);
  std::unique_ptr<std::atomic<uint8_t>[]> in_flight(new std::atomic<uint8_t>[o.requests]);
  for (uint32_t i = 0; i < o.requests; ++i) in_flight[i] = 0;
  std::atomic<uint32_t> next{0}, done{0}, n_ok{0}, n_err{0}, n_disc{0}, n_fail{0}, n_chats{0};
  std::vector<uint8_t> started(o.requests, 0);  // with duration_s, some never start
  std::atomic<uint32_t> clients_left{std::min(o.concurrency, o.requests)};
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> clients;
  for (uint32_t w = 0; w < std::min(o.concurrency, o.requests); ++w) {
    clients.emplace_back([&] {
      struct Left {
        std::atomic<uint32_t>& n;
        ~Left() { --n; }
      } left{clients_left};
      while (true) {
        const uint32_t i = next.fetch_add(1);
        if (i >= o.requests) return;
        if (o.duration_s > 0 && SecondsSince(t0) >= o.duration_s) return;
        started[i] = 1;
        const Spec spec = MakeSpec(o, i, shape.vocab, o.checker.get());
        if (!spec.chat.empty()) ++n_chats;
        in_flight[i] = 1;
        outcomes[i] =
            RunOne(o.url, spec, RequestIdOf(o, i), shape, o.checker.get(), o.request_timeout_s);
        in_flight[i] = 0;
        switch (outcomes[i].fate) {
          case Fate::kOk: ++n_ok; break;
          case Fate::kCleanError: ++n_err; break;
          case Fate::kDisconnected: ++n_disc; break;
          case Fate::kFailed: ++n_fail; break;
        }
        ++done;
        if (o.error_backoff_s > 0 &&
            (outcomes[i].fate == Fate::kCleanError || outcomes[i].fate == Fate::kFailed)) {
          std::this_thread::sleep_for(std::chrono::duration<double>(o.error_backoff_s));
        }
      }
    });
  }
  // Lifecycle calls, in time order, each on every engine of its target.
  Mutex controls_mu;   // guards rep.controls while the control thread runs
  std::thread control([&] {
    std::vector<ControlCall> calls = o.controls;
    std::sort(calls.begin(), calls.end(),
              [](const ControlCall& a, const ControlCall& b) { return a.at_s < b.at_s; });
    for (const ControlCall& c : calls) {
      std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(c.at_s)));
      std::vector<std::string> targets;
      if (c.target == "p" || c.target == "all") targets = p_engines;
      if (c.target == "d" || c.target == "all") {
        for (const auto& e : d_engines) {
          if (std::find(targets.begin(), targets.end(), e) == targets.end()) targets.push_back(e);
        }
      }
      const std::string label = c.ToString();
      std::vector<std::string> some_ids;  // abort_requests some=1: half in flight
      for (uint32_t i = 0; i < o.requests; i += 2) {
        if (in_flight[i]) some_ids.push_back(RequestIdOf(o, i));
      }
      std::vector<std::thread> ts;
      // On "all", one side gets the call `gap_ms` after the other, in the
      // call's order (D first by default), as the simulator's matrix does:
      // every order must return promptly (lifecycle.md, rule 7).
      const bool both = c.target == "all" && !p_engines.empty() && !d_engines.empty();
      const auto gap = std::chrono::milliseconds(both && c.order != "together" ? c.gap_ms : 0);
      for (const std::string& e : targets) {
        const bool is_p = std::find(p_engines.begin(), p_engines.end(), e) != p_engines.end();
        const bool is_d = std::find(d_engines.begin(), d_engines.end(), e) != d_engines.end();
        const bool second = c.order == "p-first" ? is_d && !is_p : is_p && !is_d;
        const auto lag = second ? gap : std::chrono::milliseconds(0);
        ts.emplace_back([&, e, lag] {
          std::this_thread::sleep_for(lag);
          ControlOutcome r = Call(e, o.auth_token, c.call, c.params, SecondsSince(t0), some_ids);
          r.call = label;
          MutexLock lock(&controls_mu);
          rep.controls.push_back(r);
        });
      }
      for (auto& t : ts) t.join();
      // Bring every target back to active (paused → resume; asleep or KV
      // released → wake_up), as an operator would, so the load can end.
      if (c.resume_after_ms >= 0 && c.call != "resume" && c.call != "wake_up") {
        std::this_thread::sleep_for(std::chrono::milliseconds(c.resume_after_ms));
        for (const std::string& e : targets) {
          auto st = GetJson(e, "/debug/state", o.auth_token);
          if (!st.ok() || !(*st)["engine"].is_object()) continue;
          const std::string state = (*st)["engine"].value("state", "");
          const char* back = state == "paused" ? "resume"
                             : (state == "sleeping" || state == "kv_released") ? "wake_up"
                                                                              : nullptr;
          if (back == nullptr) continue;
          ControlOutcome r = Call(e, o.auth_token, back, {}, SecondsSince(t0));
          MutexLock lock(&controls_mu);
          rep.controls.push_back(r);
        }
      }
    }
  });
  // Progress, once a second (one line rewritten on a terminal).
  const bool tty = isatty(2) != 0;
  while (done.load() < o.requests && clients_left.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    static thread_local double last = 0;
    const double now_s = SecondsSince(t0);
    if (o.progress && now_s - last >= 1.0) {
      last = now_s;
      std::fprintf(stderr, "%s[%5.1fs] %u/%u done: %u ok, %u clean errors, %u disconnected, "
                           "%u failed   %s",
                   tty ? "\r" : "",
                   now_s, done.load(), o.requests, n_ok.load(), n_err.load(), n_disc.load(),
                   n_fail.load(), tty ? "" : "\n");
      std::fflush(stderr);
    }
  }
  for (auto& t : clients) t.join();
  control.join();
  rep.duration_s = SecondsSince(t0);
  if (o.progress && tty) std::fprintf(stderr, "\n");

  std::vector<double> ttft, tpot, e2e;
  rep.requests = 0;
  if (o.checker != nullptr) rep.whole_exact = 0;
  if (o.checker != nullptr) rep.checker_summary = o.checker->Summary();
  for (uint32_t i = 0; i < o.requests; ++i) {
    if (!started[i]) continue;
    ++rep.requests;
    const Outcome& x = outcomes[i];
    switch (x.fate) {
      case Fate::kOk:
        ++rep.ok;
        if (x.whole_exact) ++rep.whole_exact;
        rep.output_tokens += x.tokens;
        if (x.ttft_s >= 0) ttft.push_back(x.ttft_s);
        e2e.push_back(x.e2e_s);
        if (x.tokens > 1 && x.ttft_s >= 0) tpot.push_back((x.e2e_s - x.ttft_s) / (x.tokens - 1));
        break;
      case Fate::kCleanError: ++rep.clean_errors; break;
      case Fate::kDisconnected: ++rep.disconnected; break;
      case Fate::kFailed:
        ++rep.failed;
        if (x.why.rfind("no response", 0) == 0 || x.why.rfind("stream cut off", 0) == 0) {
          ++rep.cut_off;
        }
        if (rep.failures.size() < 10) {
          rep.failures.push_back("request " + std::to_string(i) + ": " + x.why);
        }
        break;
    }
  }
  rep.chats = n_chats.load();
  rep.ttft_s = Summarize(ttft);
  rep.tpot_s = Summarize(tpot);
  rep.e2e_s = Summarize(e2e);
  rep.requests_per_s = rep.duration_s > 0 ? rep.requests / rep.duration_s : 0;
  rep.output_tokens_per_s = rep.duration_s > 0 ? rep.output_tokens / rep.duration_s : 0;
  check("load finished (every request: output or a clean error)", rep.failed == 0,
        std::to_string(rep.failed) + " failed");

  // Every engine idle, pool empty (prefix cache aside), within a bound.
  const Clock::time_point idle_t0 = Clock::now();
  for (const std::string& e : engines) {
    std::string last = "no answer";
    int64_t last_blocks = -1;
    bool idle = false;
    while (SecondsSince(idle_t0) < o.idle_timeout_s) {
      auto st = GetJson(e, "/debug/state", o.auth_token);
      if (st.ok()) {
        const json& eng = (*st)["engine"];
        last_blocks = eng.is_object() ? eng.value("blocks_used", int64_t{-1}) : -1;
        idle = st->value("idle", false) && eng.is_object() && eng.value("blocks_used", 1) == 0 &&
               eng.value("state", "") == "active";
        last = "idle=" + std::string(st->value("idle", false) ? "true" : "false") +
               " blocks_used=" + (eng.is_object() ? std::to_string(eng.value("blocks_used", -1)) : "?") +
               " state=" + (eng.is_object() ? eng.value("state", "?") : "?");
        if (idle) break;
      } else {
        last = st.status().ToString();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    rep.blocks_left.push_back({e, last_blocks});
    check("engine " + e + " idle, pool empty", idle,
          idle ? "after " + std::to_string(SecondsSince(idle_t0)).substr(0, 5) + " s" : last);
  }

  // Probes: exact reference output under the engines' weights.
  uint32_t probes_ok = 0;
  std::string probe_why;
  {
    LoadOptions po = o;
    po.disconnect_fraction = 0;
    po.seed = o.seed ^ 0x50524F4245ull;
    for (uint32_t i = 0; i < o.probes; ++i) {
      const Spec spec = MakeSpec(po, i, shape.vocab, o.checker.get());
      auto [path, body] = RequestOf(spec, /*stream=*/false);
      if (o.checker != nullptr) body["ignore_eos"] = true;
      http::ClientOptions opts;
      opts.idle_timeout = Duration::Nanoseconds(static_cast<int64_t>(o.request_timeout_s * 1e9));
      Result<http::ClientResponse> r = http::PostJson(o.url, path, body.dump(), opts);
      if (!r.ok() || r->status != 200) {
        probe_why = r.ok() ? "HTTP " + std::to_string(r->status) + " " + r->body
                           : r.status().message();
        continue;
      }
      json j = json::parse(r->body, nullptr, false);
      if (j.is_discarded() || !j.contains("choices")) {
        probe_why = "malformed response";
        continue;
      }
      const json& c = j["choices"][0];
      const auto ids = c.value("token_ids", std::vector<engine::Token>{});
      const auto vers = c.value("weights_versions", std::vector<uint64_t>{});
      const uint64_t v = vers.empty() ? 1 : vers.front();
      bool exact = false;
      if (o.checker != nullptr) {
        // The checker's rule (first token llama.cpp's; the rest may part
        // at a near tie, as under load: a P still holding an earlier
        // probe's sequence moves where this one's cells land).
        bool whole = false;
        exact = ids.size() == spec.max_tokens &&
                o.checker->Check(spec.prompt, ids, vers, &whole).empty();
      } else {
        exact = ids == engine::Reference(spec.prompt, v, spec.max_tokens, shape);
      }
      if (exact && std::all_of(vers.begin(), vers.end(), [&](uint64_t x) { return x == v; })) {
        ++probes_ok;
      } else {
        probe_why = "probe " + std::to_string(i) + " differs from Reference";
      }
    }
  }
  rep.probes_ok = probes_ok;
  rep.probes = o.probes;
  check(o.checker != nullptr ? "probes pass the checker" : "probes give exactly Reference(...)",
        probes_ok == o.probes,
        std::to_string(probes_ok) + "/" + std::to_string(o.probes) +
            (probe_why.empty() ? "" : " (" + probe_why + ")"));
  return rep;
}

namespace {
std::string Ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", s * 1e3);
  return b;
}
}  // namespace

std::string FormatLoadReport(const LoadReport& r) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line,
                "kvrelay bench load: %u requests (%u of them chats) at concurrency %u against %s "
                "(seed %llu)\n",
                r.requests, r.chats, r.concurrency, r.url.c_str(),
                static_cast<unsigned long long>(r.seed));
  s += line;
  std::snprintf(line, sizeof line,
                "  ended: %u with output (checked), %u clean errors, %u disconnected by the "
                "client, %u failed\n",
                r.ok, r.clean_errors, r.disconnected, r.failed);
  s += line;
  if (r.whole_exact >= 0) {
    std::snprintf(line, sizeof line,
                  "  of the %u outputs: %lld equal to the reference token for token%s%s\n",
                  r.ok, static_cast<long long>(r.whole_exact),
                  r.checker_summary.empty() ? "" : "; ", r.checker_summary.c_str());
    s += line;
  }
  std::snprintf(line, sizeof line,
                "  duration %.2f s, %.1f requests/s, %.0f output tokens/s\n", r.duration_s,
                r.requests_per_s, r.output_tokens_per_s);
  s += line;
  s += "  latency (ms)      p50      p90      p99      max\n";
  for (const auto& [name, p] : {std::pair<const char*, const Percentiles*>{"TTFT", &r.ttft_s},
                                {"TPOT", &r.tpot_s},
                                {"end-to-end", &r.e2e_s}}) {
    std::snprintf(line, sizeof line, "  %-12s %8s %8s %8s %8s\n", name, Ms(p->p50).c_str(),
                  Ms(p->p90).c_str(), Ms(p->p99).c_str(), Ms(p->max).c_str());
    s += line;
  }
  for (const auto& c : r.controls) {
    std::snprintf(line, sizeof line, "  control %s on %s at %.2f s: %s in %.1f ms%s%s\n",
                  c.call.c_str(), c.engine.c_str(), c.at_s, c.ok ? "ok" : (c.http_status == 409 ? "refused" : "FAILED"),
                  c.latency_s * 1e3, c.detail.empty() ? "" : " — ", c.detail.c_str());
    s += line;
  }
  for (const auto& c : r.checks) {
    s += std::string("  check: ") + (c.ok ? "PASS  " : "FAIL  ") + c.name +
         (c.detail.empty() ? "" : " (" + c.detail + ")") + "\n";
  }
  for (const auto& f : r.failures) s += "  failure: " + f + "\n";
  s += r.passed() ? "  RESULT: PASS\n" : "  RESULT: FAIL\n";
  return s;
}

std::string LoadReportJson(const LoadReport& r) {
  auto pj = [](const Percentiles& p) {
    return json{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"max", p.max},
                {"mean", p.mean}, {"n", p.n}};
  };
  json controls = json::array(), checks = json::array();
  for (const auto& c : r.controls) {
    controls.push_back(json{{"call", c.call}, {"engine", c.engine}, {"ok", c.ok},
                            {"http_status", c.http_status}, {"latency_s", c.latency_s},
                            {"at_s", c.at_s}, {"detail", c.detail}});
  }
  for (const auto& c : r.checks) {
    checks.push_back(json{{"name", c.name}, {"ok", c.ok}, {"detail", c.detail}});
  }
  return json{{"url", r.url},
              {"seed", r.seed},
              {"requests", r.requests},
              {"concurrency", r.concurrency},
              {"ok", r.ok},
              {"clean_errors", r.clean_errors},
              {"disconnected", r.disconnected},
              {"chats", r.chats},
              {"failed", r.failed},
              {"cut_off", r.cut_off},
              {"failures", r.failures},
              {"duration_s", r.duration_s},
              {"requests_per_s", r.requests_per_s},
              {"output_tokens_per_s", r.output_tokens_per_s},
              {"ttft_s", pj(r.ttft_s)},
              {"tpot_s", pj(r.tpot_s)},
              {"e2e_s", pj(r.e2e_s)},
              {"controls", controls},
              {"checks", checks},
              {"probes_ok", r.probes_ok},
              {"whole_exact", r.whole_exact},
              {"checker_summary", r.checker_summary},
              {"probes", r.probes},
              {"passed", r.passed()}}
      .dump(2);
}

}  // namespace kvrelay
