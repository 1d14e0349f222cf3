#include "router/router_server.h"

#include <atomic>
#include <thread>
#include <unordered_map>

#include "base/mutex.h"
#include "http/http_client.h"
#include "http/http_server.h"
#include "os/clock.h"
#include "os/log.h"
#include "router/router_metrics.h"
#include "router/transfer_id_source.h"
#include "server/client_slots.h"
#include "server/completion_response.h"
#include "server/metrics.h"

namespace kvrelay::router {

using nlohmann::json;
using kvrelay::Log;

namespace {

void SendError(http::Exchange& ex, int code, const std::string& message, const char* type) {
  ex.Respond(code, "application/json", server::ErrorJson(message, type, code));
}

}  // namespace

struct RouterServer::Impl : std::enable_shared_from_this<RouterServer::Impl> {
  RouterOptions options;
  std::shared_ptr<EnginePool> pool;
  std::atomic<int64_t> inflight{0};
  std::unique_ptr<server::ClientSlots> client_slots;
  std::shared_ptr<RouterMetrics> metrics;
  std::unique_ptr<http::ClientContext> calls;   // the legs
  std::unique_ptr<http::HttpServer> http;
  std::thread monitor_thread, sweep_thread;

  Mutex relays_mu;
  CondVar relays_cv;   // notified when a relay finishes, and to stop the sweep
  std::unordered_map<uint64_t, std::shared_ptr<Relay>> relays GUARDED_BY(relays_mu);
  bool stopping GUARDED_BY(relays_mu) = false;
  uint64_t next_id GUARDED_BY(relays_mu) = 1;

  Mutex stop_mu;
  bool stopped GUARDED_BY(stop_mu) = false;

  void Routes();
  void Completions(http::Request req, const std::shared_ptr<http::Exchange>& ex);
  void Models(http::Exchange& ex);
  // Every 100 ms: live relays past --max-queue-wait-s without a token fail.
  void SweepLoop() EXCLUDES(relays_mu);
  void Reject(http::Exchange& ex, Instant arrived, int code, const std::string& message,
              const char* type, Outcome outcome) {
    // Counted first: a client that has its answer sees it in /metrics.
    metrics->RequestFinished(outcome, (kvrelay::MonoNow() - arrived).seconds());
    SendError(ex, code, message, type);
  }
};

Result<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterOptions& options,
                                                          std::shared_ptr<EnginePool> pool) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->pool = pool;
  impl->metrics = std::make_shared<RouterMetrics>(pool, &impl->inflight);
  impl->client_slots = std::make_unique<server::ClientSlots>(options.max_requests_per_client);
  impl->calls = std::make_unique<http::ClientContext>(options.leg_threads);
  http::ServerOptions ho = options.http;
  ho.error_body = server::ErrorBodyFor;
  impl->http = std::make_unique<http::HttpServer>(std::move(ho));
  Impl* raw = impl.get();
  impl->metrics->SetHttpStats([raw] { return raw->http->Stats(); });
  impl->Routes();
  if (Status s = impl->http->Start(); !s.ok()) {
    impl->calls->Stop();
    return s;
  }
  impl->monitor_thread = std::thread([pool, interval = options.recheck_interval] {
    pool->MonitorLoop(interval);
  });
  impl->sweep_thread = std::thread([raw] { raw->SweepLoop(); });
  return std::unique_ptr<RouterServer>(new RouterServer(std::move(impl)));
}

RouterServer::RouterServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

RouterServer::~RouterServer() { Stop(); }

uint16_t RouterServer::port() const { return impl_->http->port(); }

http::ServerStats RouterServer::HttpStats() const { return impl_->http->Stats(); }

void RouterServer::Impl::SweepLoop() {
  for (;;) {
    std::vector<std::shared_ptr<Relay>> live;
    {
      MutexLock lock(&relays_mu);
      relays_cv.WaitFor(&relays_mu, std::chrono::milliseconds(100),
                        [&]() REQUIRES(relays_mu) { return stopping; });
      if (stopping) return;
      for (auto& [id, r] : relays) live.push_back(r);
    }
    const Instant now = kvrelay::MonoNow();
    for (auto& r : live) r->CheckQueueWait(now);
  }
}

void RouterServer::Stop() {
  Impl& impl = *impl_;
  {
    MutexLock lock(&impl.stop_mu);
    if (impl.stopped) return;
    impl.stopped = true;
  }
  std::vector<std::shared_ptr<Relay>> live;
  {
    MutexLock lock(&impl.relays_mu);
    impl.stopping = true;
    for (auto& [id, r] : impl.relays) live.push_back(r);
  }
  impl.relays_cv.NotifyAll();
  if (!live.empty()) Log("router", "stopping: cancelling %zu requests", live.size());
  for (auto& r : live) r->Shutdown();
  live.clear();
  // Each client gets its last words ("the router is shutting down") before
  // the server stops.
  {
    MutexLock lock(&impl.relays_mu);
    if (!impl.relays_cv.WaitFor(&impl.relays_mu,
                                std::chrono::nanoseconds(impl.options.drain_timeout.ns()),
                                [&]() REQUIRES(impl.relays_mu) { return impl.relays.empty(); })) {
      Log("router", "stopping: %zu responses still open after %.1f s", impl.relays.size(),
          impl.options.drain_timeout.seconds());
    }
  }
  if (impl.sweep_thread.joinable()) impl.sweep_thread.join();
  impl.http->Stop();
  impl.pool->StopMonitor();
  if (impl.monitor_thread.joinable()) impl.monitor_thread.join();
  // The legs were cancelled; their connections close with the context.
  impl.calls->Stop();
}

// --- routes ------------------------------------------------------------------

void RouterServer::Impl::Routes() {
  using http::Run;
  using Ex = std::shared_ptr<http::Exchange>;
  // On a worker: parsing the body and building both legs' bodies is the
  // router's heaviest work; a burst of requests must not queue the I/O
  // threads (and every other connection's reads) behind it.
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    http->Route("POST", path, Run::kWorker,
                [this](http::Request req, Ex ex) { Completions(std::move(req), ex); });
  }
  http->Route("GET", "/v1/models", Run::kWorker, [this](http::Request, Ex ex) { Models(*ex); });
  http->Route("GET", "/health", Run::kInline, [this](http::Request, Ex ex) {
    bool serving = false;
    json j = pool->HealthJson(&serving);
    j["status"] = serving ? "ok" : "degraded";
    json out = {{"status", j["status"]}, {"prefill", j["prefill"]}, {"decode", j["decode"]}};
    ex->Respond(serving ? 200 : 503, "application/json", out.dump());
  });
  http->Route("GET", "/engines", Run::kInline, [this](http::Request, Ex ex) {
    ex->Respond(200, "application/json", pool->EnginesJson().dump());
  });
  http->Route("GET", "/metrics", Run::kWorker, [this](http::Request, Ex ex) {
    ex->Respond(200, std::string(server::kPrometheusContentType), metrics->Render());
  });
}

void RouterServer::Impl::Models(http::Exchange& ex) {
  std::optional<std::string> url = pool->AnyDecodeUrl();
  if (!url) return SendError(ex, 503, "no decode engine is up", "server_error");
  http::ClientOptions o;
  o.connect_timeout = options.relay.upstream.connect_timeout;
  o.idle_timeout = options.relay.upstream.connect_timeout;
  Result<http::ClientResponse> r = http::Get(*url, "/v1/models", o);
  if (!r.ok()) {
    return SendError(ex, 502, "decode engine " + *url + ": " + r.status().message(),
                     "upstream_error");
  }
  const std::string_view type = r->Header("content-type");
  ex.Respond(r->status, type.empty() ? "application/json" : std::string(type), r->body);
}

void RouterServer::Impl::Completions(http::Request req, const std::shared_ptr<http::Exchange>& ex) {
  const Instant arrived = kvrelay::MonoNow();
  std::optional<server::ClientSlots::Lease> slot = client_slots->Acquire(req.remote_addr);
  if (!slot) {
    metrics->LimitRejected("requests_per_client");
    return Reject(*ex, arrived, 429,
                  "too many requests at once from " + req.remote_addr + ": the limit is " +
                      std::to_string(client_slots->max_per_client()) +
                      " per client (--max-requests-per-client)",
                  "rate_limit_error", Outcome::kRejected);
  }
  if (inflight.fetch_add(1) >= static_cast<int64_t>(options.max_inflight)) {
    inflight.fetch_sub(1);
    metrics->LimitRejected("inflight");
    return Reject(*ex, arrived, 503,
                  "the router is at capacity: " + std::to_string(options.max_inflight) +
                      " requests in flight (--max-inflight)",
                  "server_error", Outcome::kRejected);
  }
  Result<ClientRequest> parsed = ParseClientBody(req.body);
  if (parsed.ok()) parsed->path = req.path;
  if (!parsed.ok()) {
    inflight.fetch_sub(1);
    return Reject(*ex, arrived, 400, parsed.status().message(), "invalid_request_error",
                  Outcome::kBadRequest);
  }
  Result<TransferId> transfer = NewTransferIdFromOs();
  if (!transfer.ok()) {
    inflight.fetch_sub(1);
    return Reject(*ex, arrived, 500, transfer.status().message(), "server_error",
                  Outcome::kRejected);
  }
  Result<EnginePool::Pair> engines = pool->Pick();
  if (!engines.ok()) {
    inflight.fetch_sub(1);
    return Reject(*ex, arrived, 503, engines.status().message(), "server_error",
                  Outcome::kRejected);
  }
  std::weak_ptr<Impl> weak = weak_from_this();
  // The client's slot is held until its response is over.
  auto lease = std::make_shared<server::ClientSlots::Lease>(std::move(*slot));
  std::shared_ptr<Relay> relay;
  {
    MutexLock lock(&relays_mu);
    if (stopping) {
      inflight.fetch_sub(1);
      return Reject(*ex, arrived, 503, "the router is shutting down", "server_error",
                    Outcome::kShutdown);
    }
    const uint64_t id = next_id++;
    relay = std::make_shared<Relay>(
        id, options.relay, std::move(*parsed), *transfer, std::move(*engines), pool, metrics,
        arrived, [weak, lease](Relay& r) mutable {
          lease.reset();
          std::shared_ptr<Impl> self = weak.lock();
          if (!self) return;
          {
            Impl& s = *self;
            MutexLock l(&s.relays_mu);
            s.relays.erase(r.id());
          }
          self->relays_cv.NotifyAll();
          self->inflight.fetch_sub(1);
        });
    relays.emplace(id, relay);
  }
  relay->Start(*calls, ex);
}

}  // namespace kvrelay::router
