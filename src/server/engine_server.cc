#include "server/engine_server.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "http/http_server.h"
#include "os/clock.h"
#include "os/log.h"
#include "os/thread_priority.h"
#include "server/admin_auth.h"
#include "server/admin_call.h"
#include "server/chat_request.h"
#include "server/client_slots.h"
#include "server/completion_request.h"
#include "server/completion_response.h"
#include "server/kv_release.h"
#include "server/open_requests.h"
#include "server/refused_handoff.h"
#include "server/server_metrics.h"
#include "server/text_codec.h"
#include "server/utf8_stream.h"

namespace kvrelay::server {

using nlohmann::json;
using kvrelay::Log;

namespace {

// At a stop, how long the open requests' responses get to be written after
// the drain aborted them (their pumps run on the HTTP threads).
constexpr std::chrono::milliseconds kLastWordsWait{1000};

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return 400;
    case StatusCode::kAlreadyExists: return 409;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnavailable:
    case StatusCode::kCancelled: return 503;
    default: return 500;
  }
}

const char* RoleName(engine::Role r) {
  switch (r) {
    case engine::Role::kProducer: return "prefill";
    case engine::Role::kConsumer: return "decode";
    case engine::Role::kBoth: return "both";
    case engine::Role::kPlain: return "plain";
  }
  return "?";
}

const char* StateName(engine::EngineState s) {
  switch (s) {
    case engine::EngineState::kActive: return "active";
    case engine::EngineState::kPaused: return "paused";
    case engine::EngineState::kSleeping: return "sleeping";
    case engine::EngineState::kKvReleased: return "kv_released";
  }
  return "?";
}

void SendError(http::Exchange& ex, int code, const std::string& message,
               const char* type = "invalid_request_error") {
  ex.Respond(code, "application/json", ErrorJson(message, type, code));
}

void SendJson(http::Exchange& ex, std::string body, int code = 200) {
  ex.Respond(code, "application/json", std::move(body));
}

// One running completion: its output stream, the client's exchange, and
// what has been sent. The stream's listener and the exchange's client-gone
// callback both lead to it; `mu` serializes its pumps.
struct Pending {
  std::shared_ptr<runtime::RequestStream> stream;
  std::shared_ptr<http::Exchange> exchange;
  uint64_t client = 0;
  std::string id;
  std::string model;
  int64_t created_s = 0;
  uint32_t prompt_tokens = 0;
  bool stream_mode = false;
  bool include_usage = false;
  Api api = Api::kCompletions;
  std::optional<KvTransferOut> kv_out;
  Instant started;
  std::atomic<bool> pump_posted{false};
  Mutex mu;
  size_t cursor GUARDED_BY(mu) = 0;
  std::vector<engine::Token> tokens GUARDED_BY(mu);
  std::vector<uint64_t> versions GUARDED_BY(mu);
  bool stream_started GUARDED_BY(mu) = false;
  bool chunk_sent GUARDED_BY(mu) = false;   // a choice chunk went out (a chat's names the role)
  Utf8Stream text GUARDED_BY(mu);   // stream mode: chunk texts cut between characters
  bool finished GUARDED_BY(mu) = false;   // answered, or the client left
  std::optional<ClientSlots::Lease> slot GUARDED_BY(mu);   // freed when finished
};

// Starts `call` on the engine (engine thread); `clients` are the engine ids
// of an abort_requests call's request ids.
uint64_t StartAdminCall(const AdminCall& call, const std::vector<uint64_t>& clients,
                        engine::Engine& e) {
  return std::visit(
      [&](const auto& c) -> uint64_t {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, PauseCall>) {
          return e.Pause(c.mode, c.clear_cache);
        } else if constexpr (std::is_same_v<T, ResumeCall>) {
          return e.Resume();
        } else if constexpr (std::is_same_v<T, SleepCall>) {
          return e.Sleep(c.level, c.mode);
        } else if constexpr (std::is_same_v<T, WakeUpCall>) {
          return e.WakeUp();
        } else if constexpr (std::is_same_v<T, ResetPrefixCacheCall>) {
          return e.ResetPrefixCache(c.reset_running_requests);
        } else if constexpr (std::is_same_v<T, ReleaseKvCacheMemoryCall>) {
          return e.ReleaseKvCacheMemory();
        } else if constexpr (std::is_same_v<T, AbortRequestsCall>) {
          return e.AbortRequests(clients, c.all);
        } else {
          return e.UpdateWeights(c.version, c.mode);
        }
      },
      call);
}

}  // namespace

struct EngineServer::Impl {
  // Open requests by id, and the open P legs' transfers (for aborts and
  // the fast abort); registered before the engine gets them.
  OpenRequests open_requests;
  ServerOptions options;
  std::unique_ptr<runtime::Node> node;
  ServerMetrics metrics;
  std::unique_ptr<http::HttpServer> http;
  ParseLimits limits;
  std::unique_ptr<ClientSlots> client_slots;
  int64_t created_s = kvrelay::WallSeconds();
  std::atomic<bool> stopping{false};
  Mutex stop_mu;
  CondVar stop_cv;
  bool stopped GUARDED_BY(stop_mu) = false;

  void Routes();
  void Completions(http::Request req, const std::shared_ptr<http::Exchange>& ex, Api api);
  // Moves a running completion on: what its stream has that the client has
  // not (on an HTTP I/O thread, posted by the stream's listener).
  void Pump(const std::shared_ptr<Pending>& p);
  // Ends `p` once (answered, or the client left); true if this call did.
  bool Finish(Pending& p) REQUIRES(p.mu);
  void ClientLeft(const std::shared_ptr<Pending>& p);
  void Admin(const http::Request& req, http::Exchange& ex);
  // With a token set: false (and a 401 sent) unless the request proves it
  // (admin_auth.h). Admin calls and /debug/* go through it.
  bool Authorized(const http::Request& req, http::Exchange& ex);
  void KvRelease(const http::Request& req, http::Exchange& ex);
  std::unique_ptr<AdminAuth> auth;
  void ReleaseRefused(const std::string& body, const CompletionRequest* parsed);
  void FastAbort(const std::vector<TransferId>& transfers);
  json DebugState();
  std::string Metrics();
  runtime::EngineActor& engine() { return node->engine(); }
};

Result<std::unique_ptr<EngineServer>> EngineServer::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->auth = std::make_unique<AdminAuth>(options.node.auth_token);
  if (impl->options.model_name.empty()) {
    impl->options.model_name = "kvrelay-" + options.node.engine.shape.name;
  }
  impl->limits = ParseLimitsFor(options.node.engine.shape, options.http.limits.max_body_bytes);
  impl->limits.model_name = impl->options.model_name;
  impl->limits.codec = options.codec.get();
  if (options.max_prompt_tokens != 0) {
    impl->limits.max_prompt_tokens =
        std::min(impl->limits.max_prompt_tokens, options.max_prompt_tokens);
  }
  impl->client_slots = std::make_unique<ClientSlots>(options.max_requests_per_client);
  runtime::NodeOptions node_options = options.node;
  node_options.latency = impl->metrics.LatencySink();
  Result<std::unique_ptr<runtime::Node>> node = runtime::Node::Start(node_options);
  if (!node.ok()) return node.status();
  impl->node = std::move(*node);
  http::ServerOptions ho = options.http;
  const int slice_us = options.node.control_slice_us;
  // The I/O threads and workers take up an abort or a lifecycle call
  // without waiting for a core (Node::Start logged it if the kernel keeps
  // no per-thread slice).
  if (slice_us != 0) ho.on_thread_start = [slice_us] { (void)kvrelay::SetThisThreadSliceUs(slice_us); };
  ho.error_body = ErrorBodyFor;
  impl->http = std::make_unique<http::HttpServer>(std::move(ho));
  Impl* raw = impl.get();
  impl->metrics.SetHttpStats([raw] { return raw->http->Stats(); });
  impl->Routes();
  if (Status s = impl->http->Start(); !s.ok()) {
    impl->node->Shutdown(Duration::Zero());
    return s;
  }
  return std::unique_ptr<EngineServer>(new EngineServer(std::move(impl)));
}

EngineServer::EngineServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EngineServer::~EngineServer() { Stop(); }

uint16_t EngineServer::port() const { return impl_->http->port(); }

http::ServerStats EngineServer::HttpStats() const { return impl_->http->Stats(); }

void EngineServer::Wait() {
  Impl& impl = *impl_;
  MutexLock lock(&impl.stop_mu);
  impl.stop_cv.Wait(&impl.stop_mu, [&]() REQUIRES(impl.stop_mu) { return impl.stopped; });
}

void EngineServer::Stop() {
  {
    Impl& impl = *impl_;
    MutexLock lock(&impl.stop_mu);
    if (impl.stopped) return;
    impl.stopped = true;
  }
  impl_->stopping = true;
  // Drain first so open streams finish (aborted) and P answers its pulls.
  // Each response's last words (an aborted stream's finish_reason "abort"
  // and data: [DONE]) are written by a pump posted to the HTTP threads: wait
  // for those to have run, briefly, then stop the listener, which writes out
  // what ended and closes what is left.
  impl_->node->Shutdown(Duration::Seconds(5));
  impl_->open_requests.WaitUntilNoneOpen(kLastWordsWait);
  impl_->http->Stop();
  impl_->stop_cv.NotifyAll();
}

// --- routes ------------------------------------------------------------------

void EngineServer::Impl::Routes() {
  using http::Run;
  using Ex = std::shared_ptr<http::Exchange>;
  http->Route("POST", "/v1/completions", Run::kWorker,
              [this](http::Request req, Ex ex) {
                Completions(std::move(req), ex, Api::kCompletions);
              });
  http->Route("POST", "/v1/chat/completions", Run::kWorker,
              [this](http::Request req, Ex ex) { Completions(std::move(req), ex, Api::kChat); });
  http->Route("GET", "/v1/models", Run::kInline, [this](http::Request, Ex ex) {
    SendJson(*ex, ModelsJson(options.model_name, created_s, limits.max_context));
  });
  http->Route("GET", "/health", Run::kWorker, [this](http::Request, Ex ex) {
    auto alive = engine().Query([](const engine::Engine&) { return true; });
    if (alive) {
      SendJson(*ex, R"({"status":"ok"})");
    } else {
      SendError(*ex, 503, "engine stopped", "server_error");
    }
  });
  http->Route("GET", "/kv_info", Run::kInline, [this](http::Request, Ex ex) {
    const engine::EngineOptions& eo = options.node.engine;
    SendJson(*ex, json{{"engine_id", eo.engine_id},
                       {"incarnation", eo.incarnation},
                       {"role", RoleName(eo.role)},
                       {"tp", eo.tp},
                       {"kv_host", options.node.advertise_host},
                       {"kv_port", options.node.ctrl_port},
                       {"transport", net::TransportName(options.node.transport)},
                       {"kv_mode", KvModeName(options.node.kv_mode)},
                       {"model", options.model_name},
                       {"model_shape", eo.shape.name},
                       {"max_context", eo.shape.max_context}}
                      .dump());
  });
  http->Route("GET", "/is_sleeping", Run::kWorker, [this](http::Request, Ex ex) {
    auto s = engine().Query([](const engine::Engine& e) { return e.IsSleeping(); });
    if (!s) return SendError(*ex, 503, "engine stopped", "server_error");
    SendJson(*ex, json{{"is_sleeping", *s}}.dump());
  });
  http->Route("GET", "/metrics", Run::kWorker, [this](http::Request, Ex ex) {
    ex->Respond(200, "text/plain; version=0.0.4", Metrics());
  });
  http->Route("GET", "/auth/nonce", Run::kInline, [this](http::Request, Ex ex) {
    SendJson(*ex, json{{"nonce", auth->IssueNonce()},
                       {"expires_in_s", auth->ttl().seconds()},
                       {"auth_required", auth->enabled()}}
                      .dump());
  });
  http->Route("GET", "/debug/state", Run::kWorker, [this](http::Request req, Ex ex) {
    if (!Authorized(req, *ex)) return;
    SendJson(*ex, DebugState().dump(2));
  });
  http->Route("GET", "/debug/pulls", Run::kWorker, [this](http::Request req, Ex ex) {
    if (!Authorized(req, *ex)) return;
    uint64_t after = 0;
    if (req.HasQuery("after")) {
      const std::string v = req.QueryValue("after");
      char* end = nullptr;
      errno = 0;
      after = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0 || v[0] == '-') {
        return SendError(*ex, 400, "after must be a sample number (got '" + v + "')",
                         "invalid_request_error");
      }
    }
    json samples = json::array();
    for (const PullSample& p : metrics.pull_log().Since(after, 10000)) {
      samples.push_back({{"seq", p.seq},
                         {"transfer_id", p.transfer.ToString()},
                         {"rank", p.rank},
                         {"blocks", p.blocks},
                         {"pull_to_answer_s", p.pull_to_answer_s},
                         {"result", std::string(TransferResultName(p.result))},
                         {"answered_mono_ns", p.answered_mono_ns}});
    }
    SendJson(*ex, json{{"last_seq", metrics.pull_log().last_seq()}, {"samples", samples}}.dump());
  });
  http->Route("POST", "/kv_release", Run::kWorker,
              [this](http::Request req, Ex ex) { KvRelease(req, *ex); });
  for (std::string_view path : AdminPaths()) {
    http->Route("POST", std::string(path), Run::kWorker,
                [this](http::Request req, Ex ex) { Admin(req, *ex); });
  }
}

void EngineServer::Impl::Completions(http::Request req, const std::shared_ptr<http::Exchange>& ex,
                                     Api api) {
  metrics.http_requests->Inc();
  if (api == Api::kChat) metrics.chat_requests->Inc();
  if (stopping.load()) return SendError(*ex, 503, "server is shutting down", "server_error");
  std::optional<ClientSlots::Lease> slot = client_slots->Acquire(req.remote_addr);
  if (!slot) {
    metrics.LimitRejected("requests_per_client");
    ReleaseRefused(req.body, nullptr);
    return SendError(*ex, 429,
                     "too many requests at once from " + req.remote_addr + ": the limit is " +
                         std::to_string(client_slots->max_per_client()) +
                         " per client (--max-requests-per-client)",
                     "rate_limit_error");
  }
  Result<CompletionRequest> parsed = api == Api::kChat ? ParseChatRequest(req.body, limits)
                                                       : ParseCompletionRequest(req.body, limits);
  if (!parsed.ok()) {
    metrics.bad_requests->Inc();
    if (std::string_view limit = ParseErrorLimit(parsed.status()); !limit.empty()) {
      metrics.LimitRejected(limit);
    }
    ReleaseRefused(req.body, nullptr);
    return SendError(*ex, HttpStatusForParseError(parsed.status()), parsed.status().message());
  }
  CompletionRequest cr = std::move(*parsed);
  const engine::EngineOptions& eo = options.node.engine;
  if (cr.has_kv && cr.kv.do_remote_prefill && node->transfers() &&
      eo.role != engine::Role::kProducer) {
    Status s = node->EnsureProducers(cr.kv.remote_engine, cr.remote_host, cr.remote_port,
                                     cr.kv.remote_tp);
    if (!s.ok()) {
      metrics.requests_rejected->Inc();
      return SendError(*ex, 503, s.message(), "server_error");
    }
  }
  engine::RequestSpec spec;
  spec.client = engine().NewClientId();
  spec.prompt = cr.prompt;
  spec.max_tokens = cr.max_tokens;
  spec.sampling = cr.sampling;
  spec.ignore_eos = cr.ignore_eos;
  if (cr.has_kv) spec.kv = cr.kv;
  auto p = std::make_shared<Pending>();
  p->exchange = ex;
  p->client = spec.client;
  p->api = api;
  p->id = cr.request_id.empty() ? std::string(api == Api::kChat ? "chatcmpl-" : "cmpl-") +
                                      std::to_string(eo.engine_id) + "-" +
                                      std::to_string(eo.incarnation) + "-" +
                                      std::to_string(spec.client)
                                : cr.request_id;
  p->model = options.model_name;
  p->created_s = kvrelay::WallSeconds();
  p->prompt_tokens = static_cast<uint32_t>(cr.prompt.size());
  p->stream_mode = cr.stream;
  p->include_usage = cr.stream && cr.include_usage;
  p->started = kvrelay::MonoNow();
  {
    MutexLock lock(&p->mu);
    p->slot = std::move(slot);
  }
  if (cr.has_kv && cr.kv.do_remote_decode) {
    p->kv_out = KvTransferOut{cr.kv.transfer, eo.engine_id, options.node.advertise_host,
                              options.node.ctrl_port, eo.tp};
  }
  std::optional<TransferId> out_transfer;
  if (p->kv_out) out_transfer = p->kv_out->transfer;
  open_requests.Register(p->id, p->client, out_transfer);
  Result<std::shared_ptr<runtime::RequestStream>> stream = engine().Submit(std::move(spec));
  if (open_requests.Submitted(p->id, p->client, stream.ok())) {
    // An abort named it while the engine was taking it: end it now.
    if (out_transfer) FastAbort({*out_transfer});
    engine().Abort(p->client);
  }
  if (!stream.ok()) {
    metrics.requests_rejected->Inc();
    // A duplicate transfer_id belongs to a live load here: leave P alone.
    if (stream.status().code() != StatusCode::kAlreadyExists) ReleaseRefused(req.body, &cr);
    const int code = HttpStatusFor(stream.status());
    return SendError(*ex, code, stream.status().message(),
                     code >= 500 ? "server_error" : "invalid_request_error");
  }
  p->stream = std::move(*stream);
  metrics.requests_started->Inc();
  std::weak_ptr<Pending> weak = p;
  ex->OnClientGone([this, weak] {
    if (std::shared_ptr<Pending> q = weak.lock()) ClientLeft(q);
  });
  // The listener runs on the engine thread: it only posts a pump (once
  // until that pump starts). It holds `p` until the pump that finishes it
  // clears the listener.
  p->stream->SetListener([this, p] {
    if (!p->pump_posted.exchange(true, std::memory_order_acq_rel)) {
      http->Post([this, p] {
        p->pump_posted.store(false, std::memory_order_release);
        Pump(p);
      });
    }
  });
}

bool EngineServer::Impl::Finish(Pending& p) {
  if (p.finished) return false;
  p.finished = true;
  p.slot.reset();
  return true;
}

void EngineServer::Impl::Pump(const std::shared_ptr<Pending>& p) {
  MutexLock lock(&p->mu);
  if (p->finished) {
    p->stream->SetListener(nullptr);
    return;
  }
  std::vector<engine::TokenOut> got;
  const bool done = p->stream->Wait(&p->cursor, &got, std::chrono::milliseconds(0));
  std::vector<engine::Token> toks;
  std::vector<uint64_t> vers;
  for (const auto& t : got) {
    toks.push_back(t.token);
    vers.push_back(t.weights_version);
  }
  p->tokens.insert(p->tokens.end(), toks.begin(), toks.end());
  p->versions.insert(p->versions.end(), vers.begin(), vers.end());
  const engine::FinishReason reason = done ? p->stream->reason() : engine::FinishReason::kLength;
  const std::string error = done ? p->stream->error() : std::string();
  // A request that failed before its first byte was sent gets an error
  // status; later, a stream's error is an error event (as vLLM's).
  const bool failed = done && reason == engine::FinishReason::kError;
  http::Exchange& ex = *p->exchange;
  if (p->stream_mode) {
    if (failed && !p->stream_started && p->tokens.empty()) {
      SendError(ex, 503, error, "server_error");
    } else {
      std::string out;
      if (!p->stream_started) {
        ex.StartStream(200, "text/event-stream", ": keep-alive\n\n");
        p->stream_started = true;
      }
      std::string text = p->text.Take(DecodeText(limits.codec, toks));
      if (done) text += p->text.Flush();
      const bool first = !p->chunk_sent;
      if (failed) {
        if (!toks.empty() || !text.empty()) {
          out += SseEvent(StreamChunkJson(p->id, p->model, p->created_s, toks, vers, std::nullopt,
                                          text, p->api, first));
          p->chunk_sent = true;
        }
        out += SseEvent(ErrorJson(error, "server_error", 503));
      } else if (done || !toks.empty()) {
        std::optional<engine::FinishReason> finish;
        if (done) finish = reason;
        out += SseEvent(StreamChunkJson(p->id, p->model, p->created_s, toks, vers, finish, text,
                                        p->api, first));
        p->chunk_sent = true;
      }
      if (done && p->include_usage) {
        out += SseEvent(StreamUsageJson(p->id, p->model, p->created_s, p->prompt_tokens,
                                        p->tokens.size(), p->api));
      }
      if (done) out += SseDone();
      ex.Write(std::move(out));
      if (done) ex.End();
    }
  } else if (done) {
    if (failed) {
      SendError(ex, 503, error, "server_error");
    } else {
      CompletionResult r;
      r.id = p->id;
      r.model = p->model;
      r.created_s = p->created_s;
      r.prompt_tokens = p->prompt_tokens;
      r.tokens = p->tokens;
      r.weights_versions = p->versions;
      r.finish_reason = reason;
      r.kv_transfer_params = p->kv_out;
      r.codec = limits.codec;
      r.api = p->api;
      SendJson(ex, CompletionJson(r));
    }
  }
  if (!done) return;
  Finish(*p);
  (void)open_requests.Release(p->id, p->client);
  metrics.RequestFinished(reason, (kvrelay::MonoNow() - p->started).seconds());
  p->stream->SetListener(nullptr);
}

// The client went away before its answer: abort the request.
void EngineServer::Impl::ClientLeft(const std::shared_ptr<Pending>& p) {
  {
    MutexLock lock(&p->mu);
    if (!Finish(*p)) return;
  }
  const std::optional<TransferId> transfer = open_requests.Release(p->id, p->client);
  metrics.client_disconnects->Inc();
  metrics.RequestFinished(engine::FinishReason::kAborted,
                          (kvrelay::MonoNow() - p->started).seconds());
  if (transfer) FastAbort({*transfer});
  engine().Abort(p->client);
}

bool EngineServer::Impl::Authorized(const http::Request& req, http::Exchange& ex) {
  const AdminAuthVerdict v =
      auth->Verify(req.method, req.target, req.body, std::string(req.Header("authorization")));
  if (v == AdminAuthVerdict::kOk) return true;
  metrics.AdminAuthRefused(v);
  static const char* kWhy[kAdminAuthVerdicts] = {
      "", "this engine requires an Authorization header (KVRELAY-HMAC; see GET /auth/nonce)",
      "the Authorization header is not 'KVRELAY-HMAC nonce=<32 hex>, mac=<64 hex>'",
      "the nonce is unknown, used or expired: get a fresh one from GET /auth/nonce",
      "the MAC does not check (wrong token, or signed for another request)"};
  Log("admin", "refused %s %s: %s", req.method.c_str(), req.path.c_str(),
      AdminAuthVerdictName(v));
  SendError(ex, 401, kWhy[static_cast<int>(v)], "authentication_error");
  return false;
}

void EngineServer::Impl::Admin(const http::Request& req, http::Exchange& ex) {
  const Instant received = kvrelay::MonoNow();
  if (!Authorized(req, ex)) return;
  Result<AdminCall> call = ParseAdminRequest(req.path, req.query, req.body);
  if (!call.ok()) {
    metrics.bad_requests->Inc();
    return SendError(ex, 400, call.status().message());
  }
  const AdminCall c = *call;
  std::vector<uint64_t> clients;
  if (const auto* a = std::get_if<AbortRequestsCall>(&c)) {
    OpenRequests::Found found = open_requests.Abort(a->request_ids, a->all);
    clients = std::move(found.clients);
    FastAbort(found.transfers);  // the open P legs among them
  }
  runtime::OpResult r = engine().RunOp(
      [c, clients](engine::Engine& e) { return StartAdminCall(c, clients, e); },
      options.op_timeout);
  metrics.AdminCall(AdminCallName(c), r.ok, r.latency_s);
  Log("admin", "%s: %s in %.3f s%s%s", req.path.c_str(), r.ok ? "ok" : "failed", r.latency_s,
      r.detail.empty() ? "" : ": ", r.detail.c_str());
  SendJson(ex,
           json{{"ok", r.ok},
                {"call", AdminCallName(c)},
                {"detail", r.detail},
                {"latency_s", r.latency_s},
                {"received_mono_ns", received.ns()}}
               .dump(),
           r.ok ? 200 : 409);
}

// D refused a hand-off before admitting it (bad body, queue full, ...): P
// holds a READY send for it that no pull will ever come for. Tell P now, as
// D does for an admitted request that ends before its load starts, instead
// of leaving P's blocks pinned until its abort timeout. The release carries
// no prompt fingerprint (the prompt may be what was malformed); transfer
// ids are 128 random bits, so it names only this hand-off.
void EngineServer::Impl::ReleaseRefused(const std::string& body,
                                        const CompletionRequest* parsed) {
  const engine::EngineOptions& eo = options.node.engine;
  if (!node->transfers() || eo.role == engine::Role::kProducer) return;
  KvTransferParams kv;
  std::string host;
  uint16_t port = 0;
  if (parsed != nullptr) {
    if (!parsed->has_kv || !parsed->kv.do_remote_prefill) return;
    kv = parsed->kv;
    host = parsed->remote_host;
    port = parsed->remote_port;
  } else {
    // The body was refused: read just its kv_transfer_params, leniently.
    std::optional<RefusedHandoff> h = ParseRefusedHandoff(body);
    if (!h) return;
    kv = h->kv;
    host = h->host;
    port = h->port;
  }
  if (!node->EnsureProducers(kv.remote_engine, host, port, kv.remote_tp).ok()) return;
  ConnectorMetadata meta;
  meta.unstarted_releases.push_back(
      ReleaseUnstartedOp{kv.transfer, kv.remote_engine, kv.remote_tp, /*prompt_hash=*/0});
  for (const auto& rank : node->ranks()) rank->PostMetadata(meta);
  metrics.refused_releases->Inc();
}

// POST /kv_release: the router saw a request end badly after (or while) P
// prefilled it — above all a D that died before it pulled — and P's KV will
// never be pulled through it. Every rank ends its send (an abort: the send
// table's one end path, so a write in flight finishes first and a late pull
// finds the tombstone); the engine frees the blocks when every rank has
// reported it. Posted, not dropped: unlike the fast abort, nothing else
// would end this send before --abort-timeout-s (kv_release.h).
void EngineServer::Impl::KvRelease(const http::Request& req, http::Exchange& ex) {
  const engine::EngineOptions& eo = options.node.engine;
  if (!node->transfers() || eo.role == engine::Role::kConsumer) {
    metrics.bad_requests->Inc();
    return SendError(ex, 400, "this engine holds no KV for others (role " +
                                  std::string(RoleName(eo.role)) + "): nothing to release",
                     "invalid_request_error");
  }
  Result<TransferId> t = ParseKvRelease(req.body);
  if (!t.ok()) {
    metrics.bad_requests->Inc();
    return SendError(ex, 400, "POST /kv_release: " + t.status().message(),
                     "invalid_request_error");
  }
  ConnectorMetadata meta;
  meta.aborts.push_back(AbortSendOp{*t});
  for (const auto& rank : node->ranks()) rank->PostMetadata(meta);
  metrics.kv_releases->Inc();
  SendJson(ex, json{{"released", true}, {"transfer_id", t->ToString()}}.dump());
}

// The fast abort: an abort of an open P leg (abort_requests, or its client
// gone) also goes straight to every rank actor, ahead of the engine's own,
// so a pull that waits on the send is answered without waiting for the
// engine loop (which may be in a step). The send table decides either way:
// the first abort to reach it ends the send, the other finds it ended; a
// claim that comes after it is refused, and a Ready is refused and
// reported at once, so the engine frees the blocks itself (docs/design.md,
// "The fast abort"). Best effort: a full (or closed) rank inbox drops it,
// and the engine's abort, posted right after, still ends the send.
void EngineServer::Impl::FastAbort(const std::vector<TransferId>& transfers) {
  if (transfers.empty() || !options.fast_abort) return;
  ConnectorMetadata meta;
  for (const TransferId& t : transfers) meta.aborts.push_back(AbortSendOp{t});
  for (const auto& rank : node->ranks()) {
    if (rank->TryPostMetadata(meta)) {
      metrics.fast_aborts->Inc(transfers.size());
    } else {
      metrics.fast_aborts_dropped->Inc(transfers.size());
    }
  }
}

json EngineServer::Impl::DebugState() {
  const engine::EngineOptions& eo = options.node.engine;
  json j;
  j["engine_id"] = eo.engine_id;
  j["incarnation"] = eo.incarnation;
  j["role"] = RoleName(eo.role);
  j["tp"] = eo.tp;
  j["transport"] = net::TransportName(options.node.transport);
  j["kv_mode"] = KvModeName(options.node.kv_mode);
  auto snap = engine().Query([](const engine::Engine& e) {
    return std::make_pair(e.Snapshot(), e.Idle());
  });
  bool idle = true;
  if (snap) {
    const engine::EngineSnapshot& s = snap->first;
    j["engine"] = json{{"state", StateName(s.state)},
                       {"sleeping", s.sleeping},
                       {"weights_version", s.weights_version},
                       {"waiting", s.waiting},
                       {"running", s.running},
                       {"loading", s.loading},
                       {"held", s.held},
                       {"releasing", s.releasing},
                       {"blocks_used", s.blocks_used},
                       {"blocks_free", s.blocks_free},
                       {"blocks_cached", s.blocks_cached},
                       {"pending_ops", s.pending_ops},
                       {"idle", snap->second},
                       {"inbox", engine().inbox_size()}};
    idle = snap->second && s.blocks_used == 0;
  } else {
    j["engine"] = nullptr;
    idle = false;
  }
  json ranks = json::array();
  for (const auto& rank : node->ranks()) {
    std::optional<runtime::RankState> st = rank->State();
    if (!st) {
      idle = false;
      continue;
    }
    json sends = json::array(), loads = json::array(), peers = json::array();
    for (const SendView& s : st->sends) {
      sends.push_back(json{{"transfer", s.transfer.ToString()},
                           {"state", SendStateName(s.state)},
                           {"age_s", (st->now - s.created).seconds()},
                           {"need", s.need},
                           {"pulled", s.pulled},
                           {"writes_in_flight", s.writes_in_flight},
                           {"blocks", s.blocks},
                           {"pull_items", s.items}});
    }
    for (const LoadView& l : st->loads) {
      loads.push_back(json{{"transfer", l.transfer.ToString()},
                           {"age_s", (st->now - l.started).seconds()},
                           {"producers", l.producers},
                           {"unanswered", l.unanswered},
                           {"blocks", l.blocks},
                           {"failed", l.failed},
                           {"released", l.released},
                           {"cut_short", l.cut_short}});
    }
    for (const runtime::PeerView& pv : st->peers) {
      peers.push_back(json{{"engine", pv.engine},
                           {"rank", pv.rank},
                           {"incarnation", pv.peer.generation},
                           {"endpoint", pv.endpoint},
                           {"state", pv.state},
                           {"silent_s", pv.silent_s}});
    }
    json leases = json::array();
    for (const LeaseView& l : st->leases) {
      // Read mode: held_s is how long P has held (or waited for) the KV;
      // until_s how long the lease still runs (P frees by then at the latest).
      leases.push_back(json{{"transfer", l.transfer.ToString()},
                            {"state", LeaseStateName(l.state)},
                            {"held_s", (st->now - l.created).seconds()},
                            {"until_s", l.state == LeaseState::kWaiting
                                            ? 0.0
                                            : (l.until - st->now).seconds()},
                            {"need", l.need},
                            {"readers", l.readers},
                            {"done", l.done},
                            {"unfinished", l.unfinished},
                            {"blocks", l.blocks}});
    }
    if (!st->sends.empty() || !st->loads.empty() || !st->leases.empty()) idle = false;
    ranks.push_back(json{{"rank", st->rank},
                         {"leases", leases},
                         {"lease_max_hold_s", st->lease_stats.max_hold_ns / 1e9},
                         {"sends", sends},
                         {"loads", loads},
                         {"peers", peers},
                         {"writes_in_flight", st->writes_in_flight},
                         {"queued_for_sender", st->queued_for_sender},
                         {"tombstones", st->tombstones},
                         {"inbox", rank->inbox_size()}});
  }
  j["ranks"] = ranks;
  j["idle"] = idle;
  return j;
}

std::string EngineServer::Impl::Metrics() {
  return metrics.Render(*node);
}

}  // namespace kvrelay::server
