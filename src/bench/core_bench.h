// core_bench.h — `kvrelay bench core`: throughput of the pure core.
//
// Why: the send table (P) and the load table (D) claim O(1) work per input
// in the number of transfers in flight. This bench measures inputs per
// second of each with a small and a large number of transfers held in
// flight, in the same run, and prints their ratio, so the claim is a number
// rather than a promise (issue 8's target: 100,000 in flight >= 0.7x 1,000).
// It also runs a fixed number of simulator seeds in-process and reports
// schedules per second, the cost of one deterministic-simulation run.
//
// Not pure: it reads the clock. Called from the CLI thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvrelay {

// The send round bounds the table's remembered answers at this many for
// every size and runs kSendWarmupHandoffs hand-offs untimed first, so the
// memory is full (its last growth included) when timing starts
// (core_bench.cc says why).
inline constexpr uint32_t kSendRememberedAnswers = 1u << 16;
inline constexpr uint32_t kSendWarmupHandoffs = kSendRememberedAnswers + kSendRememberedAnswers / 4;

struct CoreBenchOptions {
  std::vector<uint32_t> in_flight = {1000, 100000};
  uint64_t ops_per_round = 2'000'000;   // table inputs per measured round
  int rounds = 3;                       // best of N, sizes and tables interleaved
  uint64_t seed = 1;
  uint32_t sim_seeds = 200;             // simulator seeds 1..N in-process; 0: skip
  bool send_table = true;               // measure the send table
  bool load_table = true;               // measure the load table
};

struct CoreBenchRow {
  uint32_t in_flight = 0;
  double ops_per_sec = 0;      // best round
  double ns_per_op = 0;
};

struct SimBenchResult {
  uint32_t seeds = 0;          // seeds run (1..seeds)
  uint32_t failed = 0;         // seeds whose run reported a violation
  uint64_t events = 0;
  double seconds = 0;
  double schedules_per_sec = 0;
  double events_per_sec = 0;
};

struct CoreBenchReport {
  // Send table: claim, ready, pull, write done per hand-off (4 inputs).
  std::vector<CoreBenchRow> send;
  // Load table: start, answer per load (2 inputs; the load ends on the
  // answer and reports LoadDone).
  std::vector<CoreBenchRow> load;
  SimBenchResult sim;
};

CoreBenchReport RunCoreBench(const CoreBenchOptions& options);
// Both tables with the ratio of the last row to the first, and the
// simulator's schedules per second.
std::string FormatCoreBench(const CoreBenchReport& report);
// The same as one JSON object.
std::string CoreBenchJson(const CoreBenchReport& report, const CoreBenchOptions& options);

}  // namespace kvrelay
