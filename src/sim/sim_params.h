// sim_params.h — SimParams: everything one simulated run is made of, drawn
// from its seed ("swarm testing": every seed picks its own cluster shape,
// pool sizes, timeouts and fault rates, so rare combinations get tried —
// tiny timeouts, pools that force pressure, fault rates of exactly zero).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/time.h"
#include "core/transfer_timings.h"
#include "core/rank_connector.h"
#include "engine/engine.h"

namespace kvrelay::sim {

// A lifecycle-matrix case: one control call at a chosen moment under load
// (lifecycle.md, "The lifecycle matrix").
struct ScenarioPlan {
  enum class Op : uint8_t {
    kPause, kSleep, kAbortAll, kAbortSome, kResetPrefix, kReleaseKv, kUpdateWeights, kNone
  };
  bool enabled = false;
  std::string name;
  Op op = Op::kNone;
  engine::PauseMode mode = engine::PauseMode::kAbort;
  bool clear_cache = false;
  uint32_t level = 0;
  bool reset_running = false;
  bool on_p = false, on_d = false;
  Duration at = Duration::Milliseconds(100);
  // On "both": which engine gets the call first, and how long after it the
  // other one does. Every order must return promptly (lifecycle.md, rule 7).
  enum class Order : uint8_t { kDFirst, kPFirst, kTogether };
  Order order = Order::kDFirst;
  Duration gap = Duration::Milliseconds(20);
  // How long the call may take to return (simulated time).
  Duration bound = Duration::Seconds(5);
  uint32_t probes = 4;       // reference-checked requests after the load

  // Only abort_requests and a pause, sleep or weight update in abort mode
  // may end requests (aborted, or failed under kv_load_failure_policy=fail
  // when P's abort fails D's load); every other call keeps every request:
  // cut-short loads recompute. Both matrix drivers judge by this.
  bool MayAbort() const {
    const bool has_mode = op == Op::kPause || op == Op::kSleep || op == Op::kUpdateWeights;
    return op == Op::kAbortAll || op == Op::kAbortSome ||
           (has_mode && mode == engine::PauseMode::kAbort);
  }
};

struct SimParams {
  uint64_t seed = 0;
  ScenarioPlan plan;
  std::vector<uint32_t> p_tp;  // one entry per P engine (1, 2 or 4)
  std::vector<uint32_t> d_tp;  // one entry per D engine
  uint32_t p_pool_blocks = 32;
  uint32_t d_pool_blocks = 32;
  uint32_t num_workers = 2;
  // abort_timeout, giveup_grace and read mode's lease times (below).
  TransferTimings timings;

  uint32_t num_requests = 20;
  uint32_t max_prompt_blocks = 6;      // of the "tiny" model's 4 tokens
  uint32_t max_output_tokens = 8;
  uint32_t max_batch_tokens = 32;     // the engines' token budget per step
  Duration arrival_gap_max = Duration::Milliseconds(20);
  Duration step_time = Duration::Milliseconds(2);   // an engine step, at least
  Duration net_delay_min = Duration::Microseconds(50);
  Duration net_delay_max = Duration::Milliseconds(5);
  Duration write_time_max = Duration::Milliseconds(10);  // < giveup_grace/2
  // A busy actor loop runs its timers late by up to this much.
  Duration timer_late_max = Duration::Zero();

  // Fault rates, per mille of the relevant event; each sometimes zero.
  uint32_t client_abort_pm = 100;       // a client aborts/disconnects
  uint32_t conn_drop_pm = 10;           // a message send breaks its connection
  uint32_t write_fail_pm = 20;          // a write fails
  uint32_t write_partial_pm = 500;      // of failed writes: garbage landed
  uint32_t duplicate_id_pm = 0;         // the router reuses a live transfer_id
  uint32_t crash_pm = 0;                // per request arrival: crash an engine
  uint32_t lifecycle_pm = 0;            // per request arrival: a lifecycle op
  uint32_t partition_pm = 0;            // per request arrival: partition a pair
  bool recompute_on_failure = true;     // kv_load_failure_policy
  // The P server's fast abort (docs/design.md, "The fast abort"): of the
  // aborts that reach a P engine while its leg is open, these per mille
  // also go straight to P's ranks, each at its own moment. Of the P legs
  // admitted, `early_abort_pm` per mille are aborted at once, the fast
  // abort reaching the ranks before the engine's claim does.
  uint32_t fast_abort_pm = 0;
  uint32_t early_abort_pm = 0;
  bool both_roles = false;              // every engine (and rank) is role "both"
  // engine::EngineOptions::max_queue_wait (0: none): a request with no
  // token this long after arriving ends with an error.
  Duration max_queue_wait = Duration::Zero();
  // Random lifecycle calls: resume / wake_up comes only once the call
  // returned, as a trainer's does (else at a random moment, which may
  // cancel the call). Only then can a call that waits for a transfer's
  // timeout be seen waiting.
  bool resume_waits_for_call = false;
  Duration fault_phase = Duration::Seconds(1);  // faults stop after this

  // Read mode (core/lease_table.h): D reads P's blocks under a lease.
  // Reads take up to write_time_max and fail at write_fail_pm, like writes.
  KvMode kv_mode = KvMode::kPush;
  // Read mode's times are in `timings` (read_margin >= write_time_max).

  // The control channel's times (heartbeat, peer_down_after,
  // peer_dead_after) are in `timings`. Some D/P engine pairs share a host
  // (same_host_pm per mille): their ranks use a lane, and a P that exits
  // closes it.
  uint32_t same_host_pm = 0;
  // A crashed engine stays away up to this long before its new incarnation
  // starts (0: it restarts at once).
  Duration crash_downtime_max = Duration::Zero();
  bool auth = false;   // handshakes prove a shared token
  // The data plane checks grants (tcp: a write or read outside them is
  // refused). Else it checks none (shm, ucx): then a P gone for its silence
  // fails no load in flight (RankSessionOptions::silence_fails_loads), and D
  // must never free a block a write is still headed for.
  bool grants_checked = true;
  // P hands finished prompt chunks over while its prefill goes on
  // (engine::EngineOptions::stream_chunks; push mode only).
  bool stream_chunks = false;

  std::string ToString() const;
};

// Draws a run's parameters from its seed.
SimParams DrawParams(uint64_t seed);

}  // namespace kvrelay::sim
