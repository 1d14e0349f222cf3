// chaos_runner.h — one `kvrelay chaos` case: a fresh local cluster (P, D
// and router as child processes), a load through the router, one real
// fault landed mid-load (SIGKILL and restart, an nftables partition, a
// SIGSTOP-throttled D, a P whose writes fail half-way — in read mode D's
// reads), the heal, and the end conditions measured (bench/chaos_verdict
// judges them).
//
// Why: the simulator proves the rules under modelled faults; this proves
// the processes survive real ones — dead sockets, lost packets, a frozen
// peer, a torn write — and end with nothing leaked.
//
// Timeline of a case (seconds from the load's start): the load starts
// requests until `load_s`; the fault lands at `fault_at_s`; it ends after
// its duration (kill: the process restarted on the same ports; partition:
// the rules removed; slow D: the throttle stopped); from the fault's end a
// probe request goes through the router every 100 ms until one is served
// and D has completed a KV load since (the time to recover). A partition
// that does not heal is removed only after the end checks, and recovery is
// measured from that removal.
//
// Threading: RunChaosCase runs on the caller's thread and joins every
// thread it starts before it returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/chaos_verdict.h"
#include "cli/llama_cluster.h"

namespace kvrelay::cli {

enum class FaultKind : uint8_t {
  kKillP, kKillD, kKillRouter, kPartitionHeal, kPartitionForever, kSlowD, kFailWrites
};

struct ChaosCase {
  std::string name;
  FaultKind kind;
  std::string what;  // one line for --help and the table
};
const std::vector<ChaosCase>& ChaosCases();

struct ChaosOptions {
  std::string transport = "tcp";       // partition and slow-d cases always use tcp
  std::string logs;
  uint64_t seed = 1;
  uint32_t concurrency = 16;
  double load_s = 8;
  double fault_at_s = 2;
  double down_s = 0.5;                 // kill: how long the process stays dead
  double partition_s = 4;              // partition-heal: how long it lasts
  double slow_s = 3;                   // slow-d: how long D is throttled
  double slow_stop_ms = 40, slow_run_ms = 10;  // slow-d: each cycle
  double fail_probability = 0.5;       // fail-writes
  uint64_t fail_after_bytes = 1 << 20; // fail-writes
  double step_per_token_us = 100;
  double abort_timeout_s = 4;
  double giveup_grace_s = 2;
  double peer_dead_after_s = 5;
  double slack_s = 3;                  // scheduling slack on every bound
  double recover_bound_s = 15;
  LlamaClusterFlags llama;             // --engine, --model, --threads
  // P streams each finished prefill chunk to D (serve's --stream-chunks,
  // chunks of kStreamChunkTokens); false: P hands off whole.
  bool stream_chunks = false;
  // The engines' --kv-mode: push, or read (D reads under a lease; the
  // fail-writes case fails D's reads instead, and P's leases are judged).
  std::string kv_mode = "push";
  // Read mode's lease timings, short so a lease a dead D held ends inside
  // the case: serve's --lease-s, --lease-extension-s, --lease-heartbeat-s,
  // --read-margin-s.
  double lease_s = 3, lease_extension_s = 2, lease_heartbeat_s = 0.5, read_margin_s = 1;
};

struct ChaosRow {
  ChaosCase c;
  std::string fault_detail;   // what was done, when, what was live then
  ChaosMeasure measure;
  ChaosBounds bounds;
  ChaosVerdict verdict;
  double wall_s = 0;
};

ChaosRow RunChaosCase(const ChaosCase& c, const ChaosOptions& options, int index);

}  // namespace kvrelay::cli
