#include "bench/core_bench.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <variant>

#include "base/check.h"
#include "base/prng.h"
#include "core/load_table.h"
#include "core/send_table.h"
#include "sim/sim_params.h"
#include "sim/simulator.h"

namespace kvrelay {
namespace {

TransferId MakeId(Prng& prng) { return TransferId{prng.Next64(), prng.Next64()}; }

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The send table remembers its recent answers (so a resent pull gets the
// same one) up to `max_tombstones`. That memory is history, not transfers
// in flight: both sizes keep the same bound, and it is full before timing
// starts. Timing a memory that grows from empty measured its page faults,
// which depend on what the allocator kept from the previous round: in one
// process the 1,000 case reused pages the 100,000 case had freed (123 vs
// 205-233 ns an input), while run in separate processes both took 220.
// The bound and the warm-up are kSendRememberedAnswers and
// kSendWarmupHandoffs (core_bench.h).

// One complete hand-off through `table`: claim, ready, pull, write done
// (which ends the send and releases its blocks). Four inputs. `pull` is the
// caller's one-item scratch, its dst set.
void SendHandoff(SendTable& table, Prng& prng, Instant now, uint64_t seq,
                 const std::vector<BlockId>& blocks, std::vector<PullItem>& pull) {
  const PeerId peer{0, 1};
  TransferId t = MakeId(prng);
  KV_CHECK(table.Claim(t, 1, now).ok());
  KV_CHECK(table.Ready(t, blocks, now).ok());
  pull[0].transfer = t;
  table.Pull(peer, seq, pull, now);
  std::optional<WriteId> write;
  while (auto a = table.PollAction()) {
    if (auto* w = std::get_if<StartWrite>(&*a)) write = w->write;
  }
  KV_CHECK(write.has_value());
  table.WriteDone(*write, true, now);
  bool finished = false;
  while (auto a = table.PollAction()) {
    if (std::holds_alternative<SendFinished>(*a)) finished = true;
  }
  KV_CHECK(finished);
}

// Holds `in_flight` READY sends that nobody pulls (expiry far away), runs
// kSendWarmupHandoffs hand-offs untimed, then times ops/4 more. Returns
// inputs per second.
double MeasureSendRound(uint32_t in_flight, uint64_t ops, uint64_t seed) {
  SendTableOptions opt;
  opt.abort_timeout = Duration::Seconds(3600);
  opt.num_workers = 8;
  opt.max_tombstones = kSendRememberedAnswers;
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
  std::vector<PullItem> pull(1);
  pull[0].dst = {BlockId{7, 1}};
  uint64_t seq = 0;
  for (uint32_t k = 0; k < kSendWarmupHandoffs; ++k) {
    now = now + Duration::Microseconds(1);
    SendHandoff(table, prng, now, seq++, blocks, pull);
  }
  const uint64_t handoffs = ops / 4;
  auto start = std::chrono::steady_clock::now();
  for (uint64_t k = 0; k < handoffs; ++k) {
    now = now + Duration::Microseconds(1);
    SendHandoff(table, prng, now, seq++, blocks, pull);
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  KV_CHECK_EQ(table.live_sends(), in_flight);
  return static_cast<double>(handoffs * 4) / Seconds(elapsed);
}

// Holds `in_flight` loads whose producer never answers (give-up far away),
// then runs complete loads through the table: start (one pull to one P
// rank), the answer (which ends the load: LoadDone). Each load is two
// inputs. Request ids reuse one engine slot with a new generation each
// time, as D's engine does. Returns inputs per second.
double MeasureLoadRound(uint32_t in_flight, uint64_t ops, uint64_t seed) {
  LoadTableOptions opt;
  opt.abort_timeout = Duration::Seconds(3600);
  LoadTable table(opt);
  Prng prng(seed);
  Instant now = Instant::Epoch();
  const PeerId held_peer{1, 1};
  const PeerId peer{0, 1};
  const std::vector<BlockId> dst = {BlockId{7, 1}, BlockId{8, 1}};
  for (uint32_t i = 0; i < in_flight; ++i) {
    KV_CHECK(table.Start(RequestId{i, 1}, MakeId(prng), std::span(&held_peer, 1), dst, now).ok());
  }
  while (table.PollAction()) {
  }
  KV_CHECK_EQ(table.live_loads(), in_flight);
  uint64_t finished = 0;
  const uint64_t loads = ops / 2;
  auto start = std::chrono::steady_clock::now();
  for (uint64_t k = 0; k < loads; ++k) {
    now = now + Duration::Microseconds(1);
    const TransferId t = MakeId(prng);
    const RequestId request{in_flight, static_cast<uint32_t>(k + 1)};
    KV_CHECK(table.Start(request, t, std::span(&peer, 1), dst, now).ok());
    uint64_t seq = 0;
    while (auto a = table.PollAction()) {
      if (auto* p = std::get_if<SendPull>(&*a)) seq = p->pull_seq;
    }
    table.OnAnswer(peer, seq, t, TransferResult::kOk, now);
    while (auto a = table.PollAction()) {
      if (auto* d = std::get_if<LoadDone>(&*a)) finished += d->ok ? 1 : 0;
    }
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  KV_CHECK_EQ(finished, loads);
  KV_CHECK_EQ(table.live_loads(), in_flight);
  return static_cast<double>(loads * 2) / Seconds(elapsed);
}

// Seeds 1..n of the simulator, one after another on this thread, exactly as
// `kvrelay sim --seed N` runs one.
SimBenchResult MeasureSim(uint32_t n) {
  SimBenchResult r;
  r.seeds = n;
  auto start = std::chrono::steady_clock::now();
  for (uint64_t seed = 1; seed <= n; ++seed) {
    sim::Simulator s(sim::DrawParams(seed), sim::SimOptions{});
    const sim::SimResult result = s.Run();
    r.events += result.events;
    if (!result.ok) ++r.failed;
  }
  r.seconds = Seconds(std::chrono::steady_clock::now() - start);
  if (r.seconds > 0) {
    r.schedules_per_sec = n / r.seconds;
    r.events_per_sec = static_cast<double>(r.events) / r.seconds;
  }
  return r;
}

void Finish(std::vector<CoreBenchRow>& rows) {
  for (auto& row : rows) row.ns_per_op = 1e9 / row.ops_per_sec;
}

double Ratio(const std::vector<CoreBenchRow>& rows) {
  return rows.size() >= 2 ? rows.back().ops_per_sec / rows.front().ops_per_sec : 1.0;
}

std::string FormatTable(const char* title, const std::vector<CoreBenchRow>& rows) {
  std::string out = title;
  char line[160];
  for (const auto& row : rows) {
    std::snprintf(line, sizeof line, "  in_flight=%-8u %12.0f ops/s  %7.1f ns/op\n",
                  row.in_flight, row.ops_per_sec, row.ns_per_op);
    out += line;
  }
  if (rows.size() >= 2) {
    std::snprintf(line, sizeof line,
                  "  ratio ops/s(in_flight=%u) / ops/s(in_flight=%u) = %.2f\n",
                  rows.back().in_flight, rows.front().in_flight, Ratio(rows));
    out += line;
  }
  return out;
}

std::string JsonRows(const std::vector<CoreBenchRow>& rows) {
  std::string out = "[";
  char buf[160];
  for (size_t i = 0; i < rows.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s{\"in_flight\": %u, \"ops_per_sec\": %.0f, \"ns_per_op\": %.2f}",
                  i == 0 ? "" : ", ", rows[i].in_flight, rows[i].ops_per_sec, rows[i].ns_per_op);
    out += buf;
  }
  return out + "]";
}

}  // namespace

CoreBenchReport RunCoreBench(const CoreBenchOptions& options) {
  CoreBenchReport report;
  report.send.resize(options.in_flight.size());
  report.load.resize(options.in_flight.size());
  for (size_t i = 0; i < options.in_flight.size(); ++i) {
    report.send[i].in_flight = report.load[i].in_flight = options.in_flight[i];
  }
  // Interleave sizes and tables across rounds so machine noise hits them
  // alike; keep each one's best round.
  for (int r = 0; r < options.rounds; ++r) {
    const uint64_t seed = options.seed + static_cast<uint64_t>(r);
    for (size_t i = 0; i < options.in_flight.size(); ++i) {
      const uint32_t n = options.in_flight[i];
      if (options.send_table) {
        report.send[i].ops_per_sec = std::max(report.send[i].ops_per_sec,
                                              MeasureSendRound(n, options.ops_per_round, seed));
      }
      if (options.load_table) {
        report.load[i].ops_per_sec = std::max(report.load[i].ops_per_sec,
                                              MeasureLoadRound(n, options.ops_per_round, seed));
      }
    }
  }
  if (!options.send_table) report.send.clear();
  if (!options.load_table) report.load.clear();
  Finish(report.send);
  Finish(report.load);
  if (options.sim_seeds > 0) report.sim = MeasureSim(options.sim_seeds);
  return report;
}

std::string FormatCoreBench(const CoreBenchReport& report) {
  std::string out;
  if (!report.send.empty()) {
    out += FormatTable("send table: inputs/s with N transfers held in flight "
                       "(claim, ready, pull, write done; remembered answers full)\n",
                       report.send);
  }
  if (!report.load.empty()) {
    out += FormatTable("load table: inputs/s with N loads held in flight (start, answer)\n",
                       report.load);
  }
  const SimBenchResult& s = report.sim;
  if (s.seeds > 0) {
    char line[240];
    std::snprintf(line, sizeof line,
                  "simulator: seeds 1..%u in-process on one thread in %.2f s: %.0f schedules/s, "
                  "%.2f M events/s, %u failed\n",
                  s.seeds, s.seconds, s.schedules_per_sec, s.events_per_sec / 1e6, s.failed);
    out += line;
  }
  return out;
}

std::string CoreBenchJson(const CoreBenchReport& report, const CoreBenchOptions& options) {
  char buf[512];
  std::string out = "{";
  std::snprintf(buf, sizeof buf,
                "\"ops_per_round\": %" PRIu64 ", \"rounds\": %d, \"seed\": %" PRIu64 ",\n",
                options.ops_per_round, options.rounds, options.seed);
  out += buf;
  out += " \"send_table\": {\"rows\": " + JsonRows(report.send);
  std::snprintf(buf, sizeof buf, ", \"ratio\": %.4f},\n", Ratio(report.send));
  out += buf;
  out += " \"load_table\": {\"rows\": " + JsonRows(report.load);
  std::snprintf(buf, sizeof buf, ", \"ratio\": %.4f}", Ratio(report.load));
  out += buf;
  const SimBenchResult& s = report.sim;
  if (s.seeds > 0) {
    std::snprintf(buf, sizeof buf,
                  ",\n \"simulator\": {\"seeds\": %u, \"failed\": %u, \"events\": %" PRIu64
                  ", \"seconds\": %.4f, \"schedules_per_sec\": %.1f, \"events_per_sec\": %.0f}",
                  s.seeds, s.failed, s.events, s.seconds, s.schedules_per_sec, s.events_per_sec);
    out += buf;
  }
  return out + "}\n";
}

}  // namespace kvrelay
