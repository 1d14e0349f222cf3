// local_cluster.h — LocalCluster: P engines, D engines and a router on
// loopback as child processes of this one (`demo`, `matrix`), each logging
// to a file in one folder; optionally plain engines beside them (no
// transfer, not behind the router: `bench ttft`'s reference).
//
// Thread safety: one owner thread.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/status.h"
#include "cli/child_process.h"

namespace kvrelay::cli {

// `serve --stream-chunks` for P engines, with prefill chunks of
// `chunk_tokens` (their --max-batch-tokens): what `demo`, `chaos` and
// `matrix` pass with their --stream-chunks, at kStreamChunkTokens — short
// enough that their prompts (tens to hundreds of tokens) span several.
std::vector<std::string> StreamChunksArgs(uint32_t chunk_tokens);
constexpr uint32_t kStreamChunkTokens = 32;

struct ClusterOptions {
  std::string logs;                 // folder (created)
  std::string transport = "shm";
  std::string shape = "tiny";       // serve's --model-shape; empty: not passed (--engine llama)
  uint32_t num_p = 1, num_d = 1;
  uint32_t num_plain = 0;           // `serve --role plain` engines, not behind the router
  uint32_t p_tp = 1, d_tp = 1;
  uint32_t num_blocks = 0;          // 0: serve's default
  double step_per_token_us = 20;
  int control_nice = 0;             // serve's --control-nice for every engine; 0: not passed
  int control_slice_us = -1;        // serve's --control-slice-us for every engine; -1: not passed
  std::vector<std::string> engine_args;   // extra `serve` flags for every engine
  std::vector<std::string> p_engine_args; // and for the P engines only (after those)
  std::string auth_token_file;            // --auth-token-file for every engine and the router
  std::vector<std::string> router_args;   // extra `router` flags
  // Non-empty: a twin, one more P ("twinprefill0") started with these
  // flags after the engines', behind a second router ("twinrouter") over it
  // and the same D engines; so one run measures two kinds of P side by side
  // (`bench ttft --stream-chunks`: P streaming against P handing off whole).
  std::vector<std::string> twin_p_args;
};

class LocalCluster {
 public:
  LocalCluster() = default;
  ~LocalCluster() { Stop(); }
  // Starts everything and waits until each answers /health (bounded).
  // Each child stops (SIGTERM) when this process exits, even uncleanly
  // (`kvrelay --exit-with-parent`); the kernel ties that to the thread that
  // started it, so Start and Restart run on one that outlives the cluster.
  Status Start(const ClusterOptions& options);
  // SIGTERM to each (router first), SIGKILL after a grace period. Returns
  // one line describing how each exited; *clean says all exited 0.
  std::string Stop(bool* clean = nullptr);

  // Fault drills (`kvrelay chaos`), by process name: "prefill<i>",
  // "decode<i>", "router". Pid: -1 if not running. Kill: SIGKILL, reaped.
  // Restart: the same command line (same ports), waits for /health.
  pid_t Pid(const std::string& name);
  Status Kill(const std::string& name);
  Status Restart(const std::string& name, double timeout_s);

  const std::string& router_url() const { return router_url_; }
  const std::vector<std::string>& p_urls() const { return p_urls_; }
  const std::vector<std::string>& d_urls() const { return d_urls_; }
  const std::vector<std::string>& plain_urls() const { return plain_urls_; }
  // "" without ClusterOptions::twin_p_args.
  const std::string& twin_router_url() const { return twin_router_url_; }
  const std::string& twin_p_url() const { return twin_p_url_; }

 private:
  struct Proc {
    std::string name, url;
    std::unique_ptr<ChildProcess> child;
    std::vector<std::string> argv;  // to restart it
    std::string log;
  };
  Proc* Find(const std::string& name);
  std::vector<Proc> procs_;
  std::string router_url_, twin_router_url_, twin_p_url_;
  std::vector<std::string> p_urls_, d_urls_, plain_urls_;
};

// A loopback port free now, and the `span - 1` after it
// (runtime::FreeLoopbackPorts: below the ephemeral range, never twice).
uint16_t FreePort(uint32_t span = 1);
std::string SelfPath();
// The value of one sample line of url's /metrics, `sample` being its name
// with any labels (`kvrelay_loads_total{outcome="ok"}`); -1 if the engine did
// not answer or has no such line.
double MetricSample(const std::string& url, const std::string& sample);
// GET url+path as JSON (short timeouts); kUnavailable on any failure.
Result<nlohmann::json> GetJson(const std::string& url, const std::string& path);

}  // namespace kvrelay::cli
