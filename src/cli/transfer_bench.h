// transfer_bench.h — `kvrelay bench transfer`: kvrelay's data plane against
// the raw mechanism it runs on, side by side in one run.
//
// Why: users choose a transfer layer by how close it gets to the wire, and
// this machine is shared and noisy, so only a ratio measured in the same
// run means anything. For each transport the bench starts a real P and D
// (`kvrelay serve` child processes: engine, connector, pull protocol,
// transport), hands over KV of a realistic model shape — per-layer chunks,
// a fresh random prompt per transfer, pools far larger than the caches —
// and reads each transfer's pull→answer time (read mode: lease request →
// reads landed) from D's /debug/pulls. Right
// after each size it moves the same segments with the raw baseline
// (raw_baseline.h) and prints both, and their ratio. One-block pulls are
// compared with a bare ZeroMQ round trip; P-side aborts with the answer D
// receives.
//
// Threading: the calling thread only (the raw baselines fork, so no other
// thread may run in this process while they do).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvrelay::cli {

struct TransferBenchOptions {
  std::vector<std::string> transports = {"shm", "tcp", "ucx"};
  // push: P writes into D (the pull → answer span); read: D reads from P
  // under a lease (the first lease request → reads landed span). The raw
  // baselines are the same copies, streams and puts either way.
  std::string kv_mode = "push";
  std::string shape = "8b";
  std::vector<uint32_t> sizes_blocks = {1, 4, 16, 64, 256};
  uint32_t pool_blocks = 0;              // 0: max(4 × largest size, 256)
  uint64_t bytes_per_size = 1ull << 30;  // transfers per size: enough to move this
  uint32_t min_transfers = 5, max_transfers = 40;
  // Each size's transfers alternate with the baseline's in this many rounds
  // (kvrelay's share, then the baseline's), so a machine whose speed drifts
  // during the run moves both sides of a ratio alike. Fewer where a round
  // would move less than `min_round_mib` (96 MiB by default, more than any
  // cache here: a baseline times its second pass over the same transfers).
  uint32_t rounds = 3;
  uint32_t min_round_mib = 96;
  uint32_t latency_samples = 300;        // one-block pulls per transport (0: skip)
  std::string latency_shape = "small";
  uint32_t abort_probes = 0;             // abort-on-P probes per transport (0: skip)
  uint32_t tcp_streams = 4;
  int64_t inline_write_kib = -1;  // -1: the engines' default
  bool local_lane = true;         // false: the engines' --no-local-lane
  int control_nice = 0;           // the engines' --control-nice (0: not passed)
  int control_slice_us = -1;      // the engines' --control-slice-us (-1: not passed)
  bool busy_steps = false;        // the engines' --busy-steps
  bool fast_abort = true;         // false: the engines' --no-fast-abort
  std::string ucx_tls;
  std::string logs = "/tmp/kvrelay-bench-transfer";
  std::string json_path;                 // "-" for stdout
  std::string plot_path;                 // PNG via gnuplot
  uint64_t seed = 1;
};

// Runs the bench, prints tables and progress to stdout. Errors: the cluster
// or a baseline could not run (a target missed is not an error; it is
// printed as such).
Status RunTransferBench(const TransferBenchOptions& options);

}  // namespace kvrelay::cli
