// bench_cluster.h — BenchCluster: the real P and D engines (`kvrelay serve`
// children), their router and optionally a plain engine, as the benches
// drive them: fresh random prompts, a P leg and a D leg sent by hand as the
// router would send them, and D's pull log (`GET /debug/pulls`) read with a
// cursor so each transfer's pull→answer time can be found.
//
// Why a class of its own: `bench transfer` and `bench ttft`
// (src/cli/ttft_bench.cc) measure the same hand-off and must measure it the
// same way (the same leg bodies, the same pull log reading), so a bandwidth
// quoted by one is the bandwidth the other predicts with. It was lifted out
// of src/cli/transfer_bench.cc, whose own copy it is meant to replace.
//
// Ownership: the caller owns it; it owns the child processes (LocalCluster)
// and stops them in Stop() or its destructor.
// Threading: one owner thread; httplib clients run one request at a time,
// so a caller that needs P while p() is busy uses its own client
// (SendState's `cli`).
#pragma once

#include "http/http_client.h"

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/prng.h"
#include "base/result.h"
#include "base/status.h"
#include "base/transfer_id.h"
#include "cli/local_cluster.h"
#include "engine/model.h"
#include "router/engine_info.h"

namespace kvrelay::cli {

struct BenchClusterOptions {
  std::string logs;                   // folder for the engines' logs (created)
  std::string transport = "shm";
  std::string shape = "8b";
  // Empty `shape`: engines that are not the emulated model (serve's
  // --engine llama ... in `engine_args`); `given_shape` is theirs (the
  // blocks' size, the vocabulary) and no --model-shape is passed.
  engine::ModelShape given_shape;
  std::vector<std::string> engine_args;   // more serve flags for every engine
  uint32_t pool_blocks = 256;         // every engine's pool
  uint32_t max_batch_tokens = 8192;   // token budget per step (prefill chunk)
  // The modelled step time (serve's --step-base-us, --step-per-token-us);
  // 0 and 0: a step costs only what it really computes (the KV bytes).
  double step_base_us = 0, step_per_token_us = 0;
  bool prefix_caching = false;
  uint32_t tcp_streams = 4;
  std::string ucx_tls;
  int64_t inline_write_kib = -1;      // serve's --inline-write-kib; -1: its default
  bool local_lane = true;             // false: serve's --no-local-lane
  int control_nice = 0;               // serve's --control-nice; 0: not passed
  int control_slice_us = -1;          // serve's --control-slice-us; -1: not passed
  uint32_t kv_read_threads = 1;       // serve's --kv-read-threads (every engine, plain too)
  bool plain = false;                 // also a plain engine with the same flags
  bool busy_steps = false;            // serve's --busy-steps
  bool fast_abort = true;             // false: serve's --no-fast-abort
  bool compute_first_token = false;   // serve's --compute-first-token
  std::string kv_mode = "push";       // engines' and router's --kv-mode
  // A twin P with these serve flags more, behind a router of its own over
  // the same D (ClusterOptions::twin_p_args); empty: none.
  std::vector<std::string> twin_p_args;
};

class BenchCluster {
 public:
  Status Start(const BenchClusterOptions& options);
  // Stops every process; one line saying how each exited.
  std::string Stop() { return cluster_.Stop(); }

  const engine::ModelShape& shape() const { return shape_; }
  const std::string& router_url() const { return cluster_.router_url(); }
  const std::string& p_url() const { return cluster_.p_urls()[0]; }
  const std::string& d_url() const { return cluster_.d_urls()[0]; }
  // "" without BenchClusterOptions::plain.
  std::string plain_url() const {
    return cluster_.plain_urls().empty() ? "" : cluster_.plain_urls()[0];
  }
  // "" without BenchClusterOptions::twin_p_args.
  const std::string& twin_router_url() const { return cluster_.twin_router_url(); }
  const std::string& twin_p_url() const { return cluster_.twin_p_url(); }
  const http::Client& p() const { return *p_; }
  const http::Client& d() const { return *d_; }
  const router::EngineInfo& p_info() const { return p_info_; }

  // A fresh prompt of `tokens` random tokens: {"prompt", "max_tokens": 1,
  // "stream": false}.
  nlohmann::json Prompt(Prng& prng, uint32_t tokens) const;

  // P prefills `client` and holds its KV for transfer `t` (the router's P
  // leg); returns once P answered.
  Status Prefill(const nlohmann::json& client, const TransferId& t);

  // One answer D logged.
  struct Pulled {
    TransferId transfer;
    uint32_t blocks = 0;
    double seconds = 0;            // pull sent → answer received, at D
    std::string result;            // "ok", or why the transfer failed
    int64_t answered_mono_ns = 0;  // CLOCK_MONOTONIC (host-wide)
  };
  // D pulls `t` and decodes one token (the router's D leg); the pull's
  // sample from D's log.
  Result<Pulled> Decode(const nlohmann::json& client, const TransferId& t);
  // A fresh prompt of `tokens` under a fresh transfer id: Prefill, then
  // Decode.
  Result<Pulled> Transfer(Prng& prng, uint32_t tokens);

  // P's send for `t`: its state (WAITING, READY, DONE; "" if P holds none,
  // yet or any more) and how many pull items wait on it (D's pull arrived).
  // `cli`: a client of P's other than p().
  struct SendSeen {
    std::string state;
    uint32_t pull_items = 0;
    uint32_t need = 0;  // D ranks to pull; 0 until P's engine claimed the send
  };
  SendSeen SendState(const http::Client& cli, const TransferId& t);

  // The answer D logged for `t` since the last read of the log (tp 1: one).
  Result<Pulled> FindPull(const TransferId& t);
  // Every answer D logged since the last read of the log, oldest first.
  Result<std::vector<Pulled>> NewPulls();

  // Waits until every engine is idle with no block in use (bounded).
  Status WaitIdle(double timeout_s = 60);

 private:
  LocalCluster cluster_;
  std::unique_ptr<http::Client> p_, d_;
  router::EngineInfo p_info_;
  engine::ModelShape shape_;
  uint64_t cursor_ = 0;
};

// "2.2 MiB", "1.12 GiB".
std::string HumanBytes(uint64_t bytes);

}  // namespace kvrelay::cli
