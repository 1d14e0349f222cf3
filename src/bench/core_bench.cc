#include "bench/core_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <variant>

#include "base/check.h"
#include "base/prng.h"
#include "core/send_table.h"

namespace kvrelay {
namespace {

TransferId MakeId(Prng& prng) { return TransferId{prng.Next64(), prng.Next64()}; }

// Holds `in_flight` READY sends that nobody pulls (expiry far away), then
// runs complete hand-offs through the table: claim, ready, pull, write done
// (which ends the send and releases its blocks). Each hand-off is four
// inputs. Returns inputs per second.
double MeasureRound(uint32_t in_flight, uint64_t ops, uint64_t seed) {
  SendTableOptions opt;
  opt.abort_timeout = Duration::Seconds(3600);
  opt.num_workers = 8;
  SendTable table(opt);
  Prng prng(seed);
  Instant now = Instant::Epoch();
  const std::vector<BlockId> blocks = {BlockId{1, 1}, BlockId{2, 1}};
  for (uint32_t i = 0; i < in_flight; ++i) {
    TransferId t = MakeId(prng);
    KV_CHECK(table.Claim(t, 1, now).ok());
    KV_CHECK(table.Ready(t, blocks, now).ok());
  }
  KV_CHECK_EQ(table.live_sends(), in_flight);
  const PeerId peer{0, 1};
  std::vector<PullItem> pull(1);
  pull[0].dst = {BlockId{7, 1}};
  uint64_t finished = 0;
  const uint64_t handoffs = ops / 4;
  auto start = std::chrono::steady_clock::now();
  for (uint64_t k = 0; k < handoffs; ++k) {
    now = now + Duration::Microseconds(1);
    TransferId t = MakeId(prng);
    KV_CHECK(table.Claim(t, 1, now).ok());
    KV_CHECK(table.Ready(t, blocks, now).ok());
    pull[0].transfer = t;
    table.Pull(peer, k, pull, now);
    std::optional<WriteId> write;
    while (auto a = table.PollAction()) {
      if (auto* w = std::get_if<StartWrite>(&*a)) write = w->write;
    }
    KV_CHECK(write.has_value());
    table.WriteDone(*write, true, now);
    while (auto a = table.PollAction()) {
      if (std::holds_alternative<SendFinished>(*a)) ++finished;
    }
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  KV_CHECK_EQ(finished, handoffs);
  KV_CHECK_EQ(table.live_sends(), in_flight);
  const double secs = std::chrono::duration<double>(elapsed).count();
  return static_cast<double>(handoffs * 4) / secs;
}

}  // namespace

std::vector<CoreBenchRow> RunCoreBench(const CoreBenchOptions& options) {
  std::vector<CoreBenchRow> rows(options.in_flight.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i].in_flight = options.in_flight[i];
  // Interleave sizes across rounds so machine noise hits them alike.
  for (int r = 0; r < options.rounds; ++r) {
    for (size_t i = 0; i < rows.size(); ++i) {
      double ops = MeasureRound(rows[i].in_flight, options.ops_per_round,
                                options.seed + static_cast<uint64_t>(r));
      rows[i].ops_per_sec = std::max(rows[i].ops_per_sec, ops);
    }
  }
  for (auto& row : rows) row.ns_per_op = 1e9 / row.ops_per_sec;
  return rows;
}

std::string FormatCoreBench(const std::vector<CoreBenchRow>& rows) {
  std::string out = "send table: inputs/s with N transfers held in flight\n";
  char line[160];
  for (const auto& row : rows) {
    std::snprintf(line, sizeof line, "  in_flight=%-8u %12.0f ops/s  %7.1f ns/op\n",
                  row.in_flight, row.ops_per_sec, row.ns_per_op);
    out += line;
  }
  if (rows.size() >= 2) {
    std::snprintf(line, sizeof line,
                  "  ratio ops/s(in_flight=%u) / ops/s(in_flight=%u) = %.2f\n",
                  rows.back().in_flight, rows.front().in_flight,
                  rows.back().ops_per_sec / rows.front().ops_per_sec);
    out += line;
  }
  return out;
}

}  // namespace kvrelay
