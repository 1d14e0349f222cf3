// server_metrics.h — ServerMetrics: every metric an engine process exports
// on /metrics, with units in their names.
//
// Two kinds: events counted where they happen (HTTP requests, admin calls,
// latencies the rank actors report through a LatencySink), and state read
// at scrape time (the engine's queues and pools, each rank's send and load
// tables). Render() takes one snapshot of the node for the whole scrape so
// the numbers agree with each other.
//
// Ownership: one per EngineServer. Thread-safe.
#pragma once

#include <functional>

#include "http/http_server.h"

#include <array>
#include <map>
#include <string>

#include "base/mutex.h"
#include "engine/engine.h"
#include "runtime/node.h"
#include "server/admin_auth.h"
#include "server/metrics.h"
#include "server/pull_log.h"

namespace kvrelay::server {

class ServerMetrics {
 public:
  ServerMetrics();

  Counter* http_requests;
  Counter* chat_requests;
  Counter* bad_requests;
  Counter* requests_rejected;
  Counter* requests_started;
  Counter* client_disconnects;
  Counter* refused_releases;
  Counter* fast_aborts;
  Counter* fast_aborts_dropped;
  Counter* kv_releases;

  // A request refused for a configured limit: kvrelay_limit_rejections_total
  // {limit="body_bytes"|"prompt_tokens"|"requests_per_client"}. The wire
  // limits (wire_*) are read from the rank actors' counters at scrape time.
  void LimitRejected(std::string_view limit);

  void RequestFinished(engine::FinishReason reason, double seconds);
  void AdminCall(std::string_view call, bool ok, double seconds);
  // An admin call or /debug/* request refused for want of proof of the token.
  void AdminAuthRefused(AdminAuthVerdict verdict);
  // For the rank actors: latencies they measure. Each pull answer also
  // goes to pull_log().
  runtime::LatencySink LatencySink();
  const PullLog& pull_log() const { return pull_log_; }

  // Where the kvrelay_http_* metrics come from (set before serving).
  void SetHttpStats(std::function<http::ServerStats()> fn) { http_stats_ = std::move(fn); }

  // The whole exposition, with the node's state read now.
  std::string Render(runtime::Node& node) EXCLUDES(render_mu_);

 private:
  struct Snapshot {
    engine::EngineSnapshot engine;
    std::vector<runtime::RankState> ranks;
    // runtime::RankCounters summed over ranks, by index in server_metrics.cc's
    // kRankCounterMetrics.
    std::vector<uint64_t> rank_counters;
    uint64_t transport[6] = {};
    uint64_t over_limit[kWireLimitCount] = {};
    // runtime::StepCounters, read once per render.
    struct Steps {
      uint64_t steps = 0, work_ns = 0, modelled_ns = 0, overruns = 0;
    } steps;
  };
  std::function<http::ServerStats()> http_stats_;
  MetricsRegistry registry_;
  std::array<Counter*, 4> finished_{};  // by FinishReason
  Histogram* request_latency_;
  std::array<Counter*, kAdminAuthVerdicts> admin_auth_refused_{};
  std::map<std::string, std::pair<Counter*, Counter*>, std::less<>> admin_calls_;
  std::map<std::string, Histogram*, std::less<>> admin_latency_;
  std::map<std::string, Counter*, std::less<>> limit_rejections_;
  Histogram* pull_answer_latency_;
  Histogram* transfer_latency_ok_;
  Histogram* transfer_latency_failed_;
  Histogram* write_latency_;
  Histogram* fast_abort_wait_;
  PullLog pull_log_;
  Mutex render_mu_;
  // The registry's fns read it through a pointer taken at construction;
  // they run only inside registry_.Render(), which Render() calls with
  // render_mu_ held.
  Snapshot snap_ GUARDED_BY(render_mu_);
};

}  // namespace kvrelay::server
