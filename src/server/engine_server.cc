#include "server/engine_server.h"

#include <httplib.h>

#include <cerrno>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/thread_priority.h"
#include "server/admin_auth.h"
#include "server/admin_call.h"
#include "server/completion_request.h"
#include "server/client_slots.h"
#include "server/completion_response.h"
#include "server/http_listen.h"
#include "server/open_requests.h"
#include "server/refused_handoff.h"
#include "server/server_metrics.h"

namespace kvrelay::server {

using nlohmann::json;
using runtime::Log;

namespace {

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

void SendError(httplib::Response& res, int code, const std::string& message,
               const char* type = "invalid_request_error") {
  res.status = code;
  res.set_content(ErrorJson(message, type, code), "application/json");
}

// One running completion, shared by the content provider and its releaser.
struct Pending {
  std::shared_ptr<runtime::RequestStream> stream;
  uint64_t client = 0;
  std::string id;
  uint32_t prompt_tokens = 0;
  bool stream_mode = false;
  std::optional<KvTransferOut> kv_out;
  size_t cursor = 0;
  std::vector<engine::Token> tokens;
  std::vector<uint64_t> versions;
  runtime::RequestStream* raw() { return stream.get(); }
  std::atomic<bool> finished{false};
  Instant started;
  bool first_token_seen = false;
  std::optional<ClientSlots::Lease> slot;   // freed when the response is done
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
  httplib::Server http;
  std::thread http_thread;
  ParseLimits limits;
  std::unique_ptr<ClientSlots> client_slots;
  int64_t created_s = runtime::WallSeconds();
  std::atomic<int> bound_port{0};
  std::atomic<bool> stopping{false};
  Mutex stop_mu;
  CondVar stop_cv;
  bool stopped GUARDED_BY(stop_mu) = false;

  void Routes();
  void Completions(const httplib::Request& req, httplib::Response& res);
  void Admin(const httplib::Request& req, httplib::Response& res);
  // With a token set: false (and a 401 in `res`) unless the request proves
  // it (admin_auth.h). Admin calls and /debug/* go through it.
  bool Authorized(const httplib::Request& req, httplib::Response& res);
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
  impl->limits = ParseLimitsFor(options.node.engine.shape, options.max_body_bytes);
  impl->limits.model_name = impl->options.model_name;
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
  impl->Routes();
  const uint32_t threads = options.http_threads;
  impl->http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  impl->http.set_payload_max_length(options.max_body_bytes);
  impl->http.set_keep_alive_max_count(1000);
  // Nagle off: httplib sends a head and a body (a response's chunks) in
  // separate send()s, and with Nagle on the second waits for the peer's
  // delayed ACK — 40 ms on Linux (docs/performance.md).
  impl->http.set_tcp_nodelay(true);
  const int port = BindWithBacklog(impl->http, options.http_host, options.http_port);
  if (port <= 0) {
    impl->node->Shutdown(Duration::Zero());
    return Status(StatusCode::kUnavailable, "cannot listen on " + options.http_host + ":" +
                                                std::to_string(options.http_port));
  }
  impl->bound_port = port;
  Impl* raw = impl.get();
  const int slice_us = options.node.control_slice_us;
  impl->http_thread = std::thread([raw, slice_us] {
    // httplib starts its worker threads here, and they inherit the slice:
    // an abort or a lifecycle call is taken up without waiting for a core.
    // (Node::Start logged it if the kernel keeps no per-thread slice.)
    if (slice_us != 0) (void)runtime::SetThisThreadSliceUs(slice_us);
    raw->http.listen_after_bind();
  });
  return std::unique_ptr<EngineServer>(new EngineServer(std::move(impl)));
}

EngineServer::EngineServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EngineServer::~EngineServer() { Stop(); }

uint16_t EngineServer::port() const { return static_cast<uint16_t>(impl_->bound_port.load()); }

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
  // Drain first so open streams finish (aborted) and P answers its pulls;
  // then stop the listener, which waits for handlers to return.
  impl_->node->Shutdown(Duration::Seconds(5));
  impl_->http.stop();
  if (impl_->http_thread.joinable()) impl_->http_thread.join();
  impl_->stop_cv.NotifyAll();
}

// --- routes ------------------------------------------------------------------

void EngineServer::Impl::Routes() {
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Completions(req, res);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelsJson(options.model_name, created_s, limits.max_context),
                    "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    auto alive = engine().Query([](const engine::Engine&) { return true; });
    if (alive) {
      res.set_content(R"({"status":"ok"})", "application/json");
    } else {
      SendError(res, 503, "engine stopped", "server_error");
    }
  });
  http.Get("/kv_info", [this](const httplib::Request&, httplib::Response& res) {
    const engine::EngineOptions& eo = options.node.engine;
    res.set_content(json{{"engine_id", eo.engine_id},
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
                        .dump(),
                    "application/json");
  });
  http.Get("/is_sleeping", [this](const httplib::Request&, httplib::Response& res) {
    auto s = engine().Query([](const engine::Engine& e) { return e.IsSleeping(); });
    if (!s) return SendError(res, 503, "engine stopped", "server_error");
    res.set_content(json{{"is_sleeping", *s}}.dump(), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Metrics(), "text/plain; version=0.0.4");
  });
  http.Get("/auth/nonce", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"nonce", auth->IssueNonce()},
                         {"expires_in_s", auth->ttl().seconds()},
                         {"auth_required", auth->enabled()}}
                        .dump(),
                    "application/json");
  });
  http.Get("/debug/state", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    res.set_content(DebugState().dump(2), "application/json");
  });
  http.Get("/debug/pulls", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    uint64_t after = 0;
    if (req.has_param("after")) {
      const std::string v = req.get_param_value("after");
      char* end = nullptr;
      errno = 0;
      after = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0 || v[0] == '-') {
        return SendError(res, 400, "after must be a sample number (got '" + v + "')",
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
    res.set_content(json{{"last_seq", metrics.pull_log().last_seq()}, {"samples", samples}}.dump(),
                    "application/json");
  });
  for (const char* path : {"/pause", "/resume", "/sleep", "/wake_up", "/reset_prefix_cache",
                           "/release_kv_cache_memory", "/abort_requests", "/update_weights"}) {
    http.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
      Admin(req, res);
    });
  }
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) metrics.LimitRejected("body_bytes");  // httplib refused the body
    std::string msg = res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
                                        : "request failed";
    if (res.status == 413) {
      msg = "request body is longer than the limit of " + std::to_string(options.max_body_bytes) +
            " bytes (--max-body-bytes)";
    }
    res.set_content(ErrorJson(msg, "invalid_request_error", res.status), "application/json");
  });
}

void EngineServer::Impl::Completions(const httplib::Request& req, httplib::Response& res) {
  metrics.http_requests->Inc();
  if (stopping.load()) return SendError(res, 503, "server is shutting down", "server_error");
  std::optional<ClientSlots::Lease> slot = client_slots->Acquire(req.remote_addr);
  if (!slot) {
    metrics.LimitRejected("requests_per_client");
    ReleaseRefused(req.body, nullptr);
    return SendError(res, 429,
                     "too many requests at once from " + req.remote_addr + ": the limit is " +
                         std::to_string(client_slots->max_per_client()) +
                         " per client (--max-requests-per-client)",
                     "rate_limit_error");
  }
  Result<CompletionRequest> parsed = ParseCompletionRequest(req.body, limits);
  if (!parsed.ok()) {
    metrics.bad_requests->Inc();
    if (std::string_view limit = ParseErrorLimit(parsed.status()); !limit.empty()) {
      metrics.LimitRejected(limit);
    }
    ReleaseRefused(req.body, nullptr);
    return SendError(res, HttpStatusForParseError(parsed.status()), parsed.status().message());
  }
  CompletionRequest cr = std::move(*parsed);
  const engine::EngineOptions& eo = options.node.engine;
  if (cr.has_kv && cr.kv.do_remote_prefill && node->transfers() &&
      eo.role != engine::Role::kProducer) {
    Status s = node->EnsureProducers(cr.kv.remote_engine, cr.remote_host, cr.remote_port,
                                     cr.kv.remote_tp);
    if (!s.ok()) {
      metrics.requests_rejected->Inc();
      return SendError(res, 503, s.message(), "server_error");
    }
  }
  engine::RequestSpec spec;
  spec.client = engine().NewClientId();
  spec.prompt = cr.prompt;
  spec.max_tokens = cr.max_tokens;
  if (cr.has_kv) spec.kv = cr.kv;
  auto p = std::make_shared<Pending>();
  p->client = spec.client;
  p->id = cr.request_id.empty() ? "cmpl-" + std::to_string(eo.engine_id) + "-" +
                                      std::to_string(eo.incarnation) + "-" +
                                      std::to_string(spec.client)
                                : cr.request_id;
  p->prompt_tokens = static_cast<uint32_t>(cr.prompt.size());
  p->stream_mode = cr.stream;
  p->started = runtime::MonoNow();
  p->slot = std::move(slot);
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
    return SendError(res, HttpStatusFor(stream.status()), stream.status().message(),
                     HttpStatusFor(stream.status()) >= 500 ? "server_error"
                                                           : "invalid_request_error");
  }
  p->stream = std::move(*stream);
  metrics.requests_started->Inc();
  const auto probe = options.disconnect_probe;
  const std::string model = options.model_name;
  const int64_t created = runtime::WallSeconds();
  auto finish_metrics = [this, p] {
    metrics.RequestFinished(p->raw()->reason(), (runtime::MonoNow() - p->started).seconds());
  };
  auto provider = [p, probe, model, created, finish_metrics](size_t,
                                                             httplib::DataSink& sink) -> bool {
    std::vector<engine::TokenOut> got;
    const bool done = p->raw()->Wait(&p->cursor, &got, probe);
    std::vector<engine::Token> toks;
    std::vector<uint64_t> vers;
    for (const auto& t : got) {
      toks.push_back(t.token);
      vers.push_back(t.weights_version);
    }
    p->tokens.insert(p->tokens.end(), toks.begin(), toks.end());
    p->versions.insert(p->versions.end(), vers.begin(), vers.end());
    auto result = [&] {
      CompletionResult r;
      r.id = p->id;
      r.model = model;
      r.created_s = created;
      r.prompt_tokens = p->prompt_tokens;
      r.tokens = p->tokens;
      r.weights_versions = p->versions;
      r.finish_reason = p->raw()->reason();
      r.error = p->raw()->error();
      r.kv_transfer_params = p->kv_out;
      return r;
    };
    if (p->stream_mode) {
      std::string out;
      if (!toks.empty()) {
        out += SseEvent(StreamChunkJson(p->id, model, created, toks, vers, std::nullopt));
      }
      if (done) {
        // The last event carries the finish and, as vLLM's usage chunk
        // does, the whole result (usage, kv_transfer_params).
        out += SseEvent(CompletionJson(result()));
        out += SseDone();
      } else if (out.empty()) {
        out = ": keep-alive\n\n";  // also probes for a client that left
      }
      if (!sink.write(out.data(), out.size())) return false;
    } else if (!done) {
      // Leading whitespace is valid JSON: it keeps the connection probed.
      if (!sink.write(" ", 1)) return false;
    } else {
      const std::string body = CompletionJson(result());
      if (!sink.write(body.data(), body.size())) return false;
    }
    if (done) {
      p->finished = true;
      finish_metrics();
      sink.done();
    }
    return true;
  };
  auto releaser = [this, p](bool) {
    const std::optional<TransferId> transfer = open_requests.Release(p->id, p->client);
    if (!p->finished.exchange(true)) {
      // The client went away before the end: abort its request.
      metrics.client_disconnects->Inc();
      metrics.RequestFinished(engine::FinishReason::kAborted,
                              (runtime::MonoNow() - p->started).seconds());
      if (transfer) FastAbort({*transfer});
      engine().Abort(p->client);
    }
  };
  res.set_chunked_content_provider(cr.stream ? "text/event-stream" : "application/json",
                                   provider, releaser);
}

bool EngineServer::Impl::Authorized(const httplib::Request& req, httplib::Response& res) {
  const AdminAuthVerdict v =
      auth->Verify(req.method, req.target, req.body, req.get_header_value("Authorization"));
  if (v == AdminAuthVerdict::kOk) return true;
  metrics.AdminAuthRefused(v);
  static const char* kWhy[kAdminAuthVerdicts] = {
      "", "this engine requires an Authorization header (KVRELAY-HMAC; see GET /auth/nonce)",
      "the Authorization header is not 'KVRELAY-HMAC nonce=<32 hex>, mac=<64 hex>'",
      "the nonce is unknown, used or expired: get a fresh one from GET /auth/nonce",
      "the MAC does not check (wrong token, or signed for another request)"};
  Log("admin", "refused %s %s: %s", req.method.c_str(), req.path.c_str(),
      AdminAuthVerdictName(v));
  SendError(res, 401, kWhy[static_cast<int>(v)], "authentication_error");
  return false;
}

void EngineServer::Impl::Admin(const httplib::Request& req, httplib::Response& res) {
  const Instant received = runtime::MonoNow();
  if (!Authorized(req, res)) return;
  Result<AdminCall> call = ParseAdminRequest(req.path, req.params, req.body);
  if (!call.ok()) {
    metrics.bad_requests->Inc();
    return SendError(res, 400, call.status().message());
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
  res.status = r.ok ? 200 : 409;
  res.set_content(json{{"ok", r.ok},
                       {"call", AdminCallName(c)},
                       {"detail", r.detail},
                       {"latency_s", r.latency_s},
                       {"received_mono_ns", received.ns()}}
                      .dump(),
                  "application/json");
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
