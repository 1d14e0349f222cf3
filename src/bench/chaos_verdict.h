// chaos_verdict.h — what one `kvrelay chaos` case measured, and the verdict
// on it: the end conditions of issue 9's fault suite, in one pure function
// so they can be tested without processes.
//
// Why pure: the runner (cli/chaos_runner) does the I/O — cluster, load,
// fault, monitor — and fills a ChaosMeasure; JudgeChaos decides. The
// conditions, each a reason in the verdict when it fails:
//   - every client request ended with output or a clean error (a request
//     cut off mid-stream counts as affected, not failed, only when the
//     case kills the process the client talks to: the router);
//   - every engine (survivor or restarted) idle, no live send or load, and
//     no block used (prefix cache aside): blocks leaked must be 0;
//   - every pull answered or given up within its bound: no live send on P
//     older than send_bound_s, no live load on D older than load_bound_s,
//     and (read mode) no lease on P held longer than lease_bound_s, ever
//     (the monitor's maximum), and P answered every pull item it received;
//   - every process exits 0 on SIGTERM at the end (no wedged drain);
//   - the cluster serving again: a probe succeeded within recover_bound_s
//     of the fault's end, and the load's final probes were all correct.
//
// Threading: none (values).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/load_gen.h"

namespace kvrelay {

struct ChaosBounds {
  double load_bound_s = 0;     // D: abort_timeout + giveup_grace (+ slack)
  double send_bound_s = 0;     // P: abort_timeout + a write's stall bound (+ slack)
  double recover_bound_s = 0;  // fault end → a probe served
  // Read mode, P: D's give-up (abort_timeout + giveup_grace) + the longest
  // a lease runs without a heartbeat (+ slack); 0: push mode, not judged.
  double lease_bound_s = 0;
};

// The oldest live transfer of each kind on one engine.
struct TransferAges {
  double send_s = 0, load_s = 0, lease_s = 0;
};

// One engine at the end of a case (and the worst the monitor saw).
struct EngineEnd {
  std::string name;            // prefill0, decode0
  std::string url;
  bool restarted = false;      // killed and started again during the case
  bool reachable = false;
  bool idle = false;           // /debug/state idle, state active
  int64_t blocks_used = -1;    // the leak figure (prefix cache aside)
  uint32_t live_sends = 0, live_loads = 0, live_leases = 0;
  double max_send_age_s = 0, max_load_age_s = 0;  // over the whole case
  double max_lease_age_s = 0;  // read mode, P: the longest it held a lease
  bool prefill = false;
  uint64_t pulls_received = 0, pulls_answered = 0;  // P, its current incarnation; resent
                                                    // pulls counted once
  uint64_t loads_failed = 0;   // D: loads that failed (recomputed), current incarnation
  uint64_t lanes_opened = 0;   // local lanes opened (D) or attached (P), current incarnation
  // Writes (P) and reads (D, read mode) run on the rank's own thread, ok or
  // failed, current incarnation: fault drills must reach them too.
  uint64_t inline_ops = 0;
  // P with --stream-chunks, current incarnation: chunks handed over while
  // prefilling, and writes of part of a pull.
  uint64_t chunks_streamed = 0, chunk_writes = 0;
};

struct ChaosMeasure {
  std::string skipped;         // non-empty: the case did not run, and why
  std::string setup_error;     // non-empty: the cluster or the fault could not be set up
  std::string shutdown_error;  // non-empty: a process did not exit 0 on SIGTERM at the end
  LoadReport load;
  bool cut_off_allowed = false;  // the case kills the router
  bool recover_expected = true;  // false: the fault never ends (recover_s not judged)
  double recover_s = -1;         // fault end → first probe served; -1: never
  std::vector<EngineEnd> engines;
};

struct ChaosVerdict {
  enum class Kind { kPass, kFail, kSkipped } kind = Kind::kFail;
  std::vector<std::string> why;   // each failed condition
  uint32_t affected = 0;          // clean errors + cut off (when allowed) + disconnected
  uint32_t failed = 0;            // ended neither with output nor cleanly
  int64_t blocks_leaked = 0;      // summed over every engine (-1 per unreachable one)
  std::string Text() const;       // PASS | FAIL | SKIPPED
};

ChaosVerdict JudgeChaos(const ChaosMeasure& m, const ChaosBounds& bounds);

}  // namespace kvrelay
