#include "router/router_metrics.h"

#include "base/check.h"
#include "server/http_metrics.h"

namespace kvrelay::router {

RouterMetrics::RouterMetrics(std::shared_ptr<EnginePool> pool,
                             const std::atomic<int64_t>* inflight) {
  // Every outcome but kPending, in the enum's order.
  for (size_t i = 1; i < kOutcomeCount; ++i) {
    const Outcome o = static_cast<Outcome>(i);
    by_outcome_[static_cast<size_t>(o)] = registry_.AddCounter(
        "kvrelay_router_requests_total", "Client requests by how they ended.",
        {{"outcome", std::string(OutcomeName(o))}});
  }
  registry_.AddGaugeFn("kvrelay_router_inflight_requests", "Client requests being served now.",
                       {}, [inflight] { return static_cast<double>(inflight->load()); });
  for (size_t i = 0; i < pool->size(); ++i) {
    registry_.AddGaugeFn("kvrelay_router_engine_outstanding_requests",
                         "Legs (P or D requests) in flight to each engine.",
                         {{"url", pool->url(i)}},
                         [pool, i] { return static_cast<double>(pool->outstanding(i)); });
  }
  for (size_t i = 0; i < pool->size(); ++i) {
    registry_.AddGaugeFn("kvrelay_router_engine_up",
                         "1 if the router sends legs to the engine (its /kv_info answered).",
                         {{"url", pool->url(i)}}, [pool, i] { return pool->up(i) ? 1.0 : 0.0; });
  }
  for (size_t i = 0; i < pool->size(); ++i) {
    connection_failures_.push_back(registry_.AddCounter(
        "kvrelay_router_leg_connection_failures_total",
        "Legs whose connection to the engine failed or broke.", {{"url", pool->url(i)}}));
  }
  // Bodies over the limit are refused by the HTTP server, for every framing.
  registry_.AddCounterFn("kvrelay_router_limit_rejections_total",
                         "Client requests refused for a configured limit, by limit.",
                         {{"limit", "body_bytes"}},
                         [this] { return http_stats_ ? http_stats_().refused_body_bytes : 0; });
  for (const char* limit : {"requests_per_client", "inflight"}) {
    limit_rejections_[limit] = registry_.AddCounter(
        "kvrelay_router_limit_rejections_total",
        "Client requests refused for a configured limit, by limit.", {{"limit", limit}});
  }
  for (const bool ok : {true, false}) {
    (ok ? releases_ok_ : releases_failed_) = registry_.AddCounter(
        "kvrelay_router_transfer_releases_total",
        "Transfers released at P (POST /kv_release) for requests that did not end well.",
        {{"result", ok ? "ok" : "failed"}});
  }
  latency_ = registry_.AddHistogram("kvrelay_router_request_latency_seconds",
                                    "Arrival to end of the response, ok requests.",
                                    server::DefaultLatencyBucketsSeconds());
  ttft_ = registry_.AddHistogram("kvrelay_router_time_to_first_token_seconds",
                                 "Arrival to the first token written to the client, streams.",
                                 server::DefaultLatencyBucketsSeconds());
  server::RegisterHttpMetrics(registry_, &http_stats_);
}

void RouterMetrics::RequestFinished(Outcome outcome, double seconds) {
  server::Counter* c = by_outcome_[static_cast<size_t>(outcome)];
  KV_CHECK(c != nullptr);
  c->Inc();
  if (outcome == Outcome::kOk) latency_->ObserveSeconds(seconds);
}

void RouterMetrics::LimitRejected(std::string_view limit) {
  auto it = limit_rejections_.find(limit);
  KV_CHECK_MSG(it != limit_rejections_.end(), "an unregistered limit label");
  it->second->Inc();
}

void RouterMetrics::FirstToken(double seconds) { ttft_->ObserveSeconds(seconds); }

void RouterMetrics::LegConnectionFailure(size_t engine_index) {
  KV_CHECK_LT(engine_index, connection_failures_.size());
  connection_failures_[engine_index]->Inc();
}

}  // namespace kvrelay::router
