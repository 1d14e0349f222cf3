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

#include <array>
#include <map>
#include <mutex>
#include <string>

#include "engine/engine.h"
#include "runtime/node.h"
#include "server/metrics.h"

namespace kvrelay::server {

class ServerMetrics {
 public:
  ServerMetrics();

  Counter* http_requests;
  Counter* bad_requests;
  Counter* requests_rejected;
  Counter* requests_started;
  Counter* client_disconnects;
  Counter* refused_releases;

  void RequestFinished(engine::FinishReason reason, double seconds);
  void AdminCall(std::string_view call, bool ok, double seconds);
  // For the rank actors: latencies they measure.
  runtime::LatencySink LatencySink();

  // The whole exposition, with the node's state read now.
  std::string Render(runtime::Node& node);

 private:
  struct Snapshot {
    engine::EngineSnapshot engine;
    std::vector<runtime::RankState> ranks;
    uint64_t counters[16] = {};
    uint64_t transport[6] = {};
  };
  MetricsRegistry registry_;
  std::array<Counter*, 3> finished_{};
  Histogram* request_latency_;
  std::map<std::string, std::pair<Counter*, Counter*>, std::less<>> admin_calls_;
  std::map<std::string, Histogram*, std::less<>> admin_latency_;
  Histogram* pull_answer_latency_;
  Histogram* transfer_latency_ok_;
  Histogram* transfer_latency_failed_;
  Histogram* write_latency_;
  std::mutex render_mu_;
  Snapshot snap_;  // guarded by render_mu_; read by the registry's fns
};

}  // namespace kvrelay::server
