#include "router/router_server.h"

#include "server/http_listen.h"

#include <httplib.h>

#include <atomic>
#include <thread>
#include <unordered_map>

#include "base/mutex.h"
#include "router/growing_thread_pool.h"
#include "server/client_slots.h"
#include "router/leg_threads.h"
#include "router/router_metrics.h"
#include "router/transfer_id_source.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "server/completion_response.h"
#include "server/metrics.h"

namespace kvrelay::router {

using nlohmann::json;
using runtime::Log;

namespace {

void SendError(httplib::Response& res, int code, const std::string& message,
               const char* type) {
  res.status = code;
  res.set_content(server::ErrorJson(message, type, code), "application/json");
}

}  // namespace

struct RouterServer::Impl : std::enable_shared_from_this<RouterServer::Impl> {
  RouterOptions options;
  std::shared_ptr<EnginePool> pool;
  std::atomic<int64_t> inflight{0};
  std::unique_ptr<server::ClientSlots> client_slots;
  std::shared_ptr<RouterMetrics> metrics;
  std::shared_ptr<LegThreads> legs = std::make_shared<LegThreads>();
  httplib::Server http;
  std::thread http_thread, monitor_thread;
  std::atomic<int> bound_port{0};

  Mutex relays_mu;
  CondVar relays_cv;   // notified when a relay finishes
  std::unordered_map<uint64_t, std::shared_ptr<Relay>> relays GUARDED_BY(relays_mu);
  bool stopping GUARDED_BY(relays_mu) = false;
  uint64_t next_id GUARDED_BY(relays_mu) = 1;

  Mutex stop_mu;
  bool stopped GUARDED_BY(stop_mu) = false;

  void Routes();
  void Completions(const httplib::Request& req, httplib::Response& res);
  void Models(httplib::Response& res);
  void Reject(httplib::Response& res, Instant arrived, int code, const std::string& message,
              const char* type, Outcome outcome) {
    SendError(res, code, message, type);
    metrics->RequestFinished(outcome, (runtime::MonoNow() - arrived).seconds());
  }
};

Result<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterOptions& options,
                                                          std::shared_ptr<EnginePool> pool) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->pool = pool;
  impl->metrics = std::make_shared<RouterMetrics>(pool, &impl->inflight);
  impl->client_slots = std::make_unique<server::ClientSlots>(options.max_requests_per_client);
  impl->Routes();
  const size_t threads =
      options.http_threads != 0 ? options.http_threads : size_t{options.max_inflight} + 64;
  impl->http.new_task_queue = [threads] { return new GrowingThreadPool(threads); };
  impl->http.set_payload_max_length(options.max_body_bytes);
  impl->http.set_keep_alive_max_count(1000);
  // Nagle off: httplib sends a head and a body (a response's chunks) in
  // separate send()s, and with Nagle on the second waits for the peer's
  // delayed ACK — 40 ms on Linux (docs/performance.md).
  impl->http.set_tcp_nodelay(true);
  // A real backlog: Debian's cpp-httplib listens with 5 (server/http_listen.h).
  const int port = server::BindWithBacklog(impl->http, options.host, options.port);
  if (port <= 0) {
    return UnavailableError("cannot listen on " + options.host + ":" +
                            std::to_string(options.port));
  }
  impl->bound_port = port;
  Impl* raw = impl.get();
  impl->http_thread = std::thread([raw] { raw->http.listen_after_bind(); });
  // Stop() must find the loop running, or http.stop() would miss it.
  for (int i = 0; i < 5000 && !impl->http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl->monitor_thread = std::thread([pool, interval = options.recheck_interval] {
    pool->MonitorLoop(interval);
  });
  return std::unique_ptr<RouterServer>(new RouterServer(std::move(impl)));
}

RouterServer::RouterServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

RouterServer::~RouterServer() { Stop(); }

uint16_t RouterServer::port() const { return static_cast<uint16_t>(impl_->bound_port.load()); }

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
  if (!live.empty()) Log("router", "stopping: cancelling %zu requests", live.size());
  for (auto& r : live) r->Shutdown();
  live.clear();
  // Let each client get its last words ("the router is shutting down")
  // before the listener stops: httplib ends a chunked response unfinished
  // once it is stopping.
  {
    MutexLock lock(&impl.relays_mu);
    if (!impl.relays_cv.WaitFor(&impl.relays_mu,
                                std::chrono::nanoseconds(impl.options.drain_timeout.ns()),
                                [&]() REQUIRES(impl.relays_mu) { return impl.relays.empty(); })) {
      Log("router", "stopping: %zu responses still open after %.1f s", impl.relays.size(),
          impl.options.drain_timeout.seconds());
    }
  }
  impl_->http.stop();
  if (impl_->http_thread.joinable()) impl_->http_thread.join();
  impl_->pool->StopMonitor();
  if (impl_->monitor_thread.joinable()) impl_->monitor_thread.join();
  if (!impl_->legs->WaitIdle(impl_->options.drain_timeout)) {
    Log("router", "stopping: %llu legs still running after %.1f s",
        static_cast<unsigned long long>(impl_->legs->running()),
        impl_->options.drain_timeout.seconds());
  }
}

// --- routes ------------------------------------------------------------------

void RouterServer::Impl::Routes() {
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Completions(req, res);
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    Models(res);
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    bool serving = false;
    json j = pool->HealthJson(&serving);
    j["status"] = serving ? "ok" : "degraded";
    json out = {{"status", j["status"]}, {"prefill", j["prefill"]}, {"decode", j["decode"]}};
    res.status = serving ? 200 : 503;
    res.set_content(out.dump(), "application/json");
  });
  http.Get("/engines", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(pool->EnginesJson().dump(), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics->Render(), std::string(server::kPrometheusContentType));
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = "request failed";
    if (res.status == 404) msg = "no such endpoint: " + req.method + " " + req.path;
    if (res.status == 413) {
      metrics->LimitRejected("body_bytes");
      msg = "body is longer than " + std::to_string(options.max_body_bytes) +
            " bytes (--max-body-bytes)";
    }
    res.set_content(server::ErrorJson(msg, "invalid_request_error", res.status),
                    "application/json");
  });
}

void RouterServer::Impl::Models(httplib::Response& res) {
  std::optional<std::string> url = pool->AnyDecodeUrl();
  if (!url) return SendError(res, 503, "no decode engine is up", "server_error");
  httplib::Client c(*url);
  c.set_tcp_nodelay(true);  // no 40 ms Nagle wait between head and body
  const auto timeout = std::chrono::nanoseconds(options.relay.upstream.connect_timeout.ns());
  c.set_connection_timeout(timeout);
  c.set_read_timeout(timeout);
  httplib::Result r = c.Get("/v1/models");
  if (!r) {
    return SendError(res, 502, "decode engine " + *url + ": " + httplib::to_string(r.error()),
                     "upstream_error");
  }
  res.status = r->status;
  res.set_content(r->body, r->get_header_value("Content-Type", 0).empty()
                               ? "application/json"
                               : r->get_header_value("Content-Type", 0));
}

void RouterServer::Impl::Completions(const httplib::Request& req, httplib::Response& res) {
  const Instant arrived = runtime::MonoNow();
  std::optional<server::ClientSlots::Lease> slot = client_slots->Acquire(req.remote_addr);
  if (!slot) {
    metrics->LimitRejected("requests_per_client");
    return Reject(res, arrived, 429,
                  "too many requests at once from " + req.remote_addr + ": the limit is " +
                      std::to_string(client_slots->max_per_client()) +
                      " per client (--max-requests-per-client)",
                  "rate_limit_error", Outcome::kRejected);
  }
  if (inflight.fetch_add(1) >= static_cast<int64_t>(options.max_inflight)) {
    inflight.fetch_sub(1);
    metrics->LimitRejected("inflight");
    return Reject(res, arrived, 503,
                  "the router is at capacity: " + std::to_string(options.max_inflight) +
                      " requests in flight (--max-inflight)",
                  "server_error", Outcome::kRejected);
  }
  Result<ClientRequest> parsed = ParseClientBody(req.body);
  if (!parsed.ok()) {
    inflight.fetch_sub(1);
    return Reject(res, arrived, 400, parsed.status().message(), "invalid_request_error",
                  Outcome::kBadRequest);
  }
  const bool stream = parsed->stream;
  Result<TransferId> transfer = NewTransferIdFromOs();
  if (!transfer.ok()) {
    inflight.fetch_sub(1);
    return Reject(res, arrived, 500, transfer.status().message(), "server_error",
                  Outcome::kRejected);
  }
  Result<EnginePool::Pair> engines = pool->Pick();
  if (!engines.ok()) {
    inflight.fetch_sub(1);
    return Reject(res, arrived, 503, engines.status().message(), "server_error",
                  Outcome::kRejected);
  }
  std::weak_ptr<Impl> weak = weak_from_this();
  std::shared_ptr<Relay> relay;
  {
    MutexLock lock(&relays_mu);
    if (stopping) {
      inflight.fetch_sub(1);
      return Reject(res, arrived, 503, "the router is shutting down", "server_error",
                    Outcome::kShutdown);
    }
    const uint64_t id = next_id++;
    relay = std::make_shared<Relay>(
        id, options.relay, std::move(*parsed), *transfer, std::move(*engines), pool, metrics,
        arrived, [weak](Relay& r) {
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
  relay->Start(*legs);
  relay->WaitForCommitPoint(options.commit_wait);
  if (std::optional<ClientReply> reply = relay->CommitOrReply()) {
    res.status = reply->status;
    res.set_content(reply->body, reply->content_type);
    relay->Finish();
    return;
  }
  // The client's slot is held until its response is done.
  auto lease = std::make_shared<server::ClientSlots::Lease>(std::move(*slot));
  res.set_chunked_content_provider(
      stream ? "text/event-stream" : "application/json",
      [relay, lease](size_t, httplib::DataSink& sink) {
        (void)lease;
        return relay->Pump(sink);
      },
      [relay](bool success) { relay->ClientReleased(success); });
}

}  // namespace kvrelay::router
