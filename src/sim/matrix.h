// matrix.h — the lifecycle matrix of lifecycle.md as named, deterministic
// simulator scenarios: `kvrelay sim --scenario pause-abort-p`, `--matrix`.
//
// Every case runs a 1P1D pair (tp 2 each) under load — requests in every
// phase: P prefilling, P ready and waiting for a pull, pulls in flight, D
// decoding; 10% of clients disconnecting — lands one control call while the
// load runs, resumes or wakes the engines once it returned, and checks: the
// call returned within its bound and with the right result, every request
// ended with output (checked token by token) or a clean error, both engines
// idle and active, both pools empty (prefix cache aside), and probe
// requests sent afterwards produce exactly the model's output.
#pragma once

#include <string>
#include <vector>

#include "sim/sim_params.h"

namespace kvrelay::sim {

// The 27 cases, in the matrix's order.
std::vector<ScenarioPlan> MatrixCases();

// What a matrix run varies beyond the case itself.
struct MatrixConfig {
  KvMode kv_mode = KvMode::kPush;
  ScenarioPlan::Order order = ScenarioPlan::Order::kDFirst;  // on "both"
  Duration gap = Duration::Milliseconds(20);                 // between the two calls
  bool recompute_on_failure = true;                           // kv_load_failure_policy
  bool stream_chunks = false;                                 // push mode: P streams chunks
};
const char* OrderName(ScenarioPlan::Order order);  // "d-first", "p-first", "together"
bool ParseOrder(const std::string& name, ScenarioPlan::Order* order);

// Parameters for one case (fixed seed; no faults but client disconnects),
// in push or read mode (read: vLLM's lease of 30 s, 20 s per heartbeat,
// heartbeats every 5 s).
SimParams ScenarioParams(const ScenarioPlan& plan, const MatrixConfig& config = {});

}  // namespace kvrelay::sim
