// router_metrics.h — RouterMetrics: what `kvrelay router` exports on
// GET /metrics (Prometheus text, via server/metrics.h).
//
//   kvrelay_router_requests_total{outcome}          client requests by how
//       they ended: ok, client_disconnect, prefill_failed, decode_failed,
//       bad_request, rejected (at capacity, no engine up), shutdown
//   kvrelay_router_inflight_requests                client requests now
//   kvrelay_router_engine_outstanding_requests{url} legs in flight per engine
//   kvrelay_router_engine_up{url}                   1 if the engine is used
//   kvrelay_router_leg_connection_failures_total{url}
//   kvrelay_router_limit_rejections_total{limit}    requests refused for a
//       limit: body_bytes (413), requests_per_client (429), inflight (503)
//   kvrelay_router_transfer_releases_total{result}  POST /kv_release calls to
//       P for requests that did not end well: ok, failed
//   kvrelay_router_request_latency_seconds          arrival → end, ok requests
//   kvrelay_router_time_to_first_token_seconds      arrival → first token
//                                                   written, streams
//
// Ownership: one per RouterServer; keeps the pool alive for its gauges.
// Thread safety: every method from any thread.
#pragma once

#include <array>
#include <map>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "router/engine_pool.h"
#include "router/relay_logic.h"
#include "http/http_server.h"
#include "server/metrics.h"

namespace kvrelay::router {

class RouterMetrics {
 public:
  RouterMetrics(std::shared_ptr<EnginePool> pool, const std::atomic<int64_t>* inflight);

  void RequestFinished(Outcome outcome, double seconds);
  void FirstToken(double seconds);
  // One of "requests_per_client", "inflight" (body_bytes is the HTTP
  // server's count).
  void LimitRejected(std::string_view limit);
  void LegConnectionFailure(size_t engine_index);
  void TransferReleased(bool ok) { (ok ? releases_ok_ : releases_failed_)->Inc(); }
  std::string Render() const { return registry_.Render(); }
  // Where the kvrelay_http_* metrics come from (set before serving).
  void SetHttpStats(std::function<http::ServerStats()> fn) { http_stats_ = std::move(fn); }

 private:
  std::function<http::ServerStats()> http_stats_;
  server::MetricsRegistry registry_;
  std::array<server::Counter*, kOutcomeCount> by_outcome_{};
  std::vector<server::Counter*> connection_failures_;
  std::map<std::string, server::Counter*, std::less<>> limit_rejections_;
  server::Counter* releases_ok_;
  server::Counter* releases_failed_;
  server::Histogram* latency_;
  server::Histogram* ttft_;
};

}  // namespace kvrelay::router
