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
// Parameters for one case (fixed seed; no faults but client disconnects),
// in push or read mode (read: vLLM's lease of 30 s, 20 s per heartbeat,
// heartbeats every 5 s).
SimParams ScenarioParams(const ScenarioPlan& plan, KvMode mode = KvMode::kPush);

}  // namespace kvrelay::sim
