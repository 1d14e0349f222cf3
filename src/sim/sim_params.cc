#include "sim/sim_params.h"

#include <cstdio>

#include "base/prng.h"

namespace kvrelay::sim {

namespace {
uint32_t Tp(Prng& prng) { return 1u << prng.Uniform(3); }  // 1, 2, 4
// A rate that is zero a quarter of the time, else up to max per mille.
uint32_t Rate(Prng& prng, uint32_t max_pm) {
  return prng.OneIn(4) ? 0 : static_cast<uint32_t>(prng.Range(1, max_pm));
}
}  // namespace

// Draw order is part of every committed regression seed's meaning: append
// new draws at the end, and keep retired ones as discarded draws.
SimParams DrawParams(uint64_t seed) {
  Prng prng(Mix64(seed ^ 0x5EED5EED5EEDull));
  SimParams p;
  p.seed = seed;
  const uint64_t np = 1 + prng.Uniform(3), nd = 1 + prng.Uniform(3);
  for (uint64_t i = 0; i < np; ++i) p.p_tp.push_back(Tp(prng));
  for (uint64_t i = 0; i < nd; ++i) p.d_tp.push_back(Tp(prng));
  p.max_prompt_blocks = static_cast<uint32_t>(prng.Range(1, 8));
  p.max_output_tokens = static_cast<uint32_t>(prng.Range(1, 8));
  p.max_batch_tokens = static_cast<uint32_t>(prng.Range(4, 64));
  // Pools from "barely the largest request" (pressure) to roomy.
  const uint32_t largest = (p.max_prompt_blocks * 4 + p.max_output_tokens + 3) / 4;
  p.p_pool_blocks = largest + static_cast<uint32_t>(prng.Uniform(40));
  p.d_pool_blocks = largest + static_cast<uint32_t>(prng.Uniform(40));
  p.num_workers = static_cast<uint32_t>(prng.Range(1, 4));
  // Timeouts: sometimes tiny (they fire mid-transfer), sometimes vLLM's.
  switch (prng.Uniform(3)) {
    case 0: p.timings.abort_timeout = Duration::Milliseconds(prng.Range(5, 60)); break;
    case 1: p.timings.abort_timeout = Duration::Milliseconds(prng.Range(60, 2000)); break;
    default: p.timings.abort_timeout = Duration::Seconds(480); break;
  }
  p.net_delay_max = Duration::Microseconds(prng.Range(60, 20000));
  p.write_time_max = Duration::Microseconds(prng.Range(100, 10000));
  // The protocol's one timing assumption (lifecycle rule 6): D's give-up
  // grace covers a pull's one-way delay plus a write's duration, so a write
  // P starts before the pull's deadline has landed before D gives up.
  const Duration floor = p.net_delay_max + p.write_time_max + Duration::Milliseconds(1);
  p.timings.giveup_grace = p.timings.abort_timeout / 8 + Duration::Milliseconds(prng.Range(0, 100));
  if (p.timings.giveup_grace < floor) p.timings.giveup_grace = floor;
  p.num_requests = static_cast<uint32_t>(prng.Range(1, 60));
  p.arrival_gap_max = Duration::Milliseconds(prng.Range(1, 30));
  p.step_time = Duration::Microseconds(prng.Range(200, 5000));
  (void)prng.Range(1, 80);  // retired: the scripted engine's prefill time
  (void)prng.Range(1, 80);  // retired: the scripted engine's decode time
  p.client_abort_pm = Rate(prng, 400);
  p.conn_drop_pm = Rate(prng, 40);
  p.write_fail_pm = Rate(prng, 100);
  p.write_partial_pm = static_cast<uint32_t>(prng.Uniform(1001));
  p.duplicate_id_pm = prng.OneIn(3) ? Rate(prng, 150) : 0;
  p.crash_pm = prng.OneIn(3) ? Rate(prng, 60) : 0;
  p.lifecycle_pm = prng.OneIn(2) ? Rate(prng, 150) : 0;
  p.partition_pm = prng.OneIn(3) ? Rate(prng, 60) : 0;
  p.recompute_on_failure = !prng.OneIn(3);
  p.fault_phase = Duration::Milliseconds(prng.Range(10, 3000));
  if (!prng.OneIn(3)) p.timer_late_max = Duration::Microseconds(prng.Range(1, 20000));
  p.both_roles = prng.OneIn(4);
  // Read mode in a third of the runs; leases from tiny (they run out
  // mid-load and heartbeats race them) to vLLM's 30 s / 20 s / 5 s.
  if (prng.OneIn(3)) {
    p.kv_mode = KvMode::kRead;
    if (p.timings.abort_timeout >= Duration::Seconds(480) || prng.OneIn(4)) {
      p.timings.lease = Duration::Seconds(30);
      p.timings.lease_extension = Duration::Seconds(20);
      p.timings.lease_heartbeat = Duration::Seconds(5);
    } else {
      p.timings.lease_extension = Duration::Milliseconds(prng.Range(2, 400));
      p.timings.lease = p.timings.lease_extension + Duration::Milliseconds(prng.Range(0, 400));
      p.timings.lease_heartbeat = Duration::Microseconds(
          prng.Range(200, static_cast<int64_t>(p.timings.lease_extension.ns() / 1000)));
    }
    // D heartbeats a load for at most its give-up time: keep that to a
    // few thousand heartbeats per load so a run stays short.
    const Duration floor_hb = p.timings.GiveUp() / 2000;
    if (p.timings.lease_heartbeat < floor_hb) p.timings.lease_heartbeat = floor_hb;
    // The one timing assumption of read mode: D's margin covers a read.
    p.timings.read_margin = p.write_time_max + Duration::Microseconds(prng.Range(0, 2000));
  }
  p.fast_abort_pm = prng.OneIn(4) ? 0 : static_cast<uint32_t>(prng.Range(1, 1000));
  p.early_abort_pm = p.fast_abort_pm == 0 ? 0 : Rate(prng, 100);
  // Drawn last, so the draws above keep their values for every seed.
  if (prng.OneIn(3)) p.max_queue_wait = Duration::Milliseconds(prng.Range(20, 3000));
  p.resume_waits_for_call = prng.OneIn(2);
  // The control channel: heartbeats from eager to lazy, peers declared
  // down and gone after a few of them, lanes, crashes that stay away long
  // enough to be found by silence, and authenticated handshakes.
  p.timings.heartbeat = Duration::Milliseconds(prng.Range(5, 100));
  p.timings.peer_down_after = p.timings.heartbeat * prng.Range(2, 4);
  p.timings.peer_dead_after = p.timings.peer_down_after + p.timings.heartbeat * prng.Range(1, 6);
  // A heartbeat late by up to timer_late_max is a late heartbeat, not a
  // stall (RankSession counts silence afresh only after a gap of
  // peer_down_after): keep the two apart, so silence finds a dead P within
  // the bound CheckDeadProducers holds it to. (No draw: seeds keep theirs.)
  if (const Duration gap_max = p.timings.heartbeat + p.timer_late_max;
      p.timings.peer_down_after < gap_max) {
    const Duration extra = gap_max - p.timings.peer_down_after;
    p.timings.peer_down_after = p.timings.peer_down_after + extra;
    p.timings.peer_dead_after = p.timings.peer_dead_after + extra;
  }
  p.same_host_pm = prng.OneIn(3) ? 0 : static_cast<uint32_t>(prng.Range(1, 1000));
  if (!prng.OneIn(3)) p.crash_downtime_max = p.timings.peer_dead_after * 2;
  p.auth = prng.OneIn(4);
  p.grants_checked = !prng.OneIn(2);
  // Streaming in half the push-mode runs (always drawn: later draws keep
  // their values whatever the mode).
  const bool stream = !prng.OneIn(2);
  p.stream_chunks = stream && p.kv_mode == KvMode::kPush;
  return p;
}

std::string SimParams::ToString() const {
  auto tps = [](const std::vector<uint32_t>& v) {
    std::string s;
    for (uint32_t t : v) s += (s.empty() ? "" : ",") + std::to_string(t);
    return s;
  };
  char buf[768];
  std::snprintf(
      buf, sizeof buf,
      "P[tp %s] D[tp %s] pools %u/%u workers %u abort_timeout %.3fs grace %.3fs "
      "requests %u blocks<=%u faults: abort %u drop %u wfail %u crash %u "
      "partition %u policy %s mode %s lease %.3fs/%.3fs hb %.3fs fast_abort %u early %u "
      "queue_wait %.3fs resume %s hb %.3fs down %.3fs dead %.3fs same_host %u "
      "downtime %.3fs auth %d grants %s stream %d",
      tps(p_tp).c_str(), tps(d_tp).c_str(), p_pool_blocks, d_pool_blocks,
      num_workers, timings.abort_timeout.seconds(), timings.giveup_grace.seconds(), num_requests,
      max_prompt_blocks, client_abort_pm, conn_drop_pm, write_fail_pm, crash_pm,
      partition_pm, recompute_on_failure ? "recompute" : "fail", KvModeName(kv_mode),
      timings.lease.seconds(), timings.lease_extension.seconds(),
      timings.lease_heartbeat.seconds(),
      fast_abort_pm, early_abort_pm, max_queue_wait.seconds(),
      resume_waits_for_call ? "after the call" : "any time", timings.heartbeat.seconds(),
      timings.peer_down_after.seconds(), timings.peer_dead_after.seconds(), same_host_pm,
      crash_downtime_max.seconds(), auth ? 1 : 0, grants_checked ? "checked" : "unchecked",
      stream_chunks ? 1 : 0);
  return buf;
}

}  // namespace kvrelay::sim
