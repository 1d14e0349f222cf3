// core_bench.h — `kvrelay bench core`: throughput of the pure core.
//
// Why: the send table claims O(1) work per input in the number of
// transfers in flight. This bench measures operations per second with a
// small and a large number of transfers held in flight, in the same run,
// and prints their ratio, so the claim is a number rather than a promise.
//
// Not pure: it reads the clock. Called from the CLI thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvrelay {

struct CoreBenchOptions {
  std::vector<uint32_t> in_flight = {1000, 100000};
  uint64_t ops_per_round = 2'000'000;   // table inputs per measured round
  int rounds = 3;                       // best of N, sizes interleaved
  uint64_t seed = 1;
};

struct CoreBenchRow {
  uint32_t in_flight = 0;
  double ops_per_sec = 0;      // best round
  double ns_per_op = 0;
};

std::vector<CoreBenchRow> RunCoreBench(const CoreBenchOptions& options);
// Prints the table and the ratio of the last row to the first.
std::string FormatCoreBench(const std::vector<CoreBenchRow>& rows);

}  // namespace kvrelay
