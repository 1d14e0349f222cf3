#include "sim/matrix.h"

namespace kvrelay::sim {

namespace {
using Op = ScenarioPlan::Op;
using engine::PauseMode;

ScenarioPlan Case(std::string name, Op op, bool on_p, bool on_d) {
  ScenarioPlan p;
  p.enabled = true;
  p.name = std::move(name);
  p.op = op;
  p.on_p = on_p;
  p.on_d = on_d;
  return p;
}

const char* Where(int i) { return i == 0 ? "p" : i == 1 ? "d" : "both"; }
const char* ModeName(PauseMode m) {
  return m == PauseMode::kAbort ? "abort" : m == PauseMode::kWait ? "wait" : "keep";
}
}  // namespace

std::vector<ScenarioPlan> MatrixCases() {
  std::vector<ScenarioPlan> cases;
  // 1–12: pause {abort, wait, keep} × clear_cache, then keep without clear.
  for (PauseMode m : {PauseMode::kAbort, PauseMode::kWait, PauseMode::kKeep}) {
    for (int w = 0; w < 3; ++w) {
      ScenarioPlan c = Case(std::string("pause-") + ModeName(m) + "-clear-" + Where(w),
                            Op::kPause, w != 1, w != 0);
      c.mode = m;
      c.clear_cache = true;
      cases.push_back(c);
    }
  }
  for (int w = 0; w < 3; ++w) {
    ScenarioPlan c = Case(std::string("pause-keep-") + Where(w), Op::kPause, w != 1, w != 0);
    c.mode = PauseMode::kKeep;
    c.bound = Duration::Milliseconds(100);  // returns at once: no export is waited for
    cases.push_back(c);
  }
  // 13–18: sleep level 0/1/2 × abort/wait on both, then wake_up.
  for (uint32_t level = 0; level <= 2; ++level) {
    for (PauseMode m : {PauseMode::kAbort, PauseMode::kWait}) {
      ScenarioPlan c = Case("sleep" + std::to_string(level) + "-" + ModeName(m) + "-both",
                            Op::kSleep, true, true);
      c.level = level;
      c.mode = m;
      cases.push_back(c);
    }
  }
  cases.push_back(Case("abort-all-p", Op::kAbortAll, true, false));          // 19
  cases.push_back(Case("abort-some-d", Op::kAbortSome, false, true));        // 20
  cases.push_back(Case("reset-prefix-both", Op::kResetPrefix, true, true));  // 21
  ScenarioPlan rr = Case("reset-prefix-running-both", Op::kResetPrefix, true, true);
  rr.reset_running = true;
  cases.push_back(rr);                                                       // 22
  cases.push_back(Case("release-kv-both", Op::kReleaseKv, true, true));      // 23
  for (PauseMode m : {PauseMode::kAbort, PauseMode::kWait, PauseMode::kKeep}) {
    ScenarioPlan c = Case(std::string("update-weights-") + ModeName(m) + "-both",
                          Op::kUpdateWeights, true, true);
    c.mode = m;
    cases.push_back(c);                                                      // 24–26
  }
  cases.push_back(Case("disconnect-50", Op::kNone, false, false));           // 27
  return cases;
}

const char* OrderName(ScenarioPlan::Order order) {
  switch (order) {
    case ScenarioPlan::Order::kDFirst: return "d-first";
    case ScenarioPlan::Order::kPFirst: return "p-first";
    case ScenarioPlan::Order::kTogether: return "together";
  }
  return "?";
}

bool ParseOrder(const std::string& name, ScenarioPlan::Order* order) {
  for (auto o : {ScenarioPlan::Order::kDFirst, ScenarioPlan::Order::kPFirst,
                 ScenarioPlan::Order::kTogether}) {
    if (name == OrderName(o)) {
      *order = o;
      return true;
    }
  }
  return false;
}

SimParams ScenarioParams(const ScenarioPlan& plan, const MatrixConfig& config) {
  const KvMode mode = config.kv_mode;
  SimParams p;
  p.seed = 27;
  p.plan = plan;
  p.plan.order = config.order;
  p.plan.gap = config.gap;
  p.p_tp = {2};
  p.d_tp = {2};
  p.p_pool_blocks = 96;
  p.d_pool_blocks = 96;
  p.num_workers = 2;
  p.timings.abort_timeout = Duration::Seconds(480);   // vLLM's default: no case may wait it out
  p.timings.giveup_grace = Duration::Seconds(60);
  p.num_requests = 150;
  p.max_prompt_blocks = 6;
  p.max_output_tokens = 8;
  p.max_batch_tokens = 48;
  p.arrival_gap_max = Duration::Milliseconds(3);
  p.step_time = Duration::Milliseconds(1);
  p.net_delay_min = Duration::Microseconds(50);
  p.net_delay_max = Duration::Microseconds(2000);
  p.write_time_max = Duration::Microseconds(3000);
  p.client_abort_pm = plan.op == ScenarioPlan::Op::kNone ? 500 : 100;
  p.conn_drop_pm = 0;
  p.write_fail_pm = 0;
  p.duplicate_id_pm = 0;
  p.crash_pm = 0;
  p.partition_pm = 0;
  p.lifecycle_pm = 0;
  p.recompute_on_failure = config.recompute_on_failure;
  p.fault_phase = Duration::Zero();
  p.kv_mode = mode;   // the lease's defaults are vLLM's (sim_params.h)
  p.stream_chunks = config.stream_chunks;
  // Streamed: a budget of three blocks a step, so most prompts take
  // several chunks and calls land between them.
  if (p.stream_chunks) p.max_batch_tokens = 12;
  p.timings.read_margin = Duration::Seconds(1);
  return p;
}

}  // namespace kvrelay::sim
