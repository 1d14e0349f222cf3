// `kvrelay sim`: runs the deterministic simulator over many seeds.
//
// Seeds run in worker processes (--jobs), so that a KV_CHECK failure — a
// bug the core caught in itself — is recorded as that seed's failure and the
// run goes on. Each worker reports one line per seed on a pipe; a worker
// that dies is replaced, and the seed it was running is reported failed.
// With --budget-s the run ends near its budget: no seed starts after it,
// and a worker still running a seed a tenth later is stopped, its seed
// listed as unfinished (a rare seed runs for a minute).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "sim/coverage.h"
#include "sim/matrix.h"
#include "sim/simulator.h"

namespace kvrelay::cli {
namespace {

using sim::Mark;

struct SimCliOptions {
  std::string seeds = "1..1000";
  int64_t seed = -1;
  bool trace = false;
  double budget_s = 0;
  bool fail_fast = false;
  int jobs = 0;
  std::string regressions;
  bool require_marks = false;
  int determinism = 0;
  bool verbose = false;
  std::string scenario;
  bool matrix = false;
  std::string kv_mode = "push";
  std::string call_order = "all";
  double call_gap_ms = 20;
  std::string policy = "all";
  std::string stream = "all";
  std::string json_path;
};

// Writes the run's report to `path` (--json); false, with a message, if it
// cannot.
bool WriteJson(const std::string& path, const nlohmann::json& doc) {
  std::ofstream f(path);
  f << doc.dump(1) << "\n";
  f.close();
  if (!f) {
    std::fprintf(stderr, "kvrelay sim: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

// Runs matrix cases (all, or the one named) under every configuration
// asked for, and prints a line per case and configuration. A case with its
// call on one side only has no call order: it runs once per policy.
int RunMatrix(const std::string& only, bool trace, const std::vector<sim::MatrixConfig>& configs,
              const std::string& json_path) {
  std::vector<sim::ScenarioPlan> cases = sim::MatrixCases();
  if (!only.empty()) {
    bool found = false;
    for (const auto& c : cases) found = found || c.name == only;
    if (!found) {
      std::fprintf(stderr, "kvrelay sim: no scenario named '%s'; the cases are:\n",
                   only.c_str());
      for (const auto& c : cases) std::fprintf(stderr, "  %s\n", c.name.c_str());
      return 2;
    }
  }
  std::printf("%-4s %-28s %-9s %-9s %-6s %-6s %10s %6s %6s %7s %6s %6s\n", "#", "case", "order",
              "policy", "stream", "result", "call (s)", "ok", "error", "aborted", "probes",
              "blocks");
  uint32_t passed = 0, failed = 0;
  nlohmann::json runs = nlohmann::json::array();
  const auto t0 = std::chrono::steady_clock::now();
  for (const sim::MatrixConfig& config : configs) {
    int n = 0;
    for (const auto& plan : cases) {
      ++n;
      if (!only.empty() && plan.name != only) continue;
      const bool both = plan.on_p && plan.on_d;
      if (!both && config.order != configs.front().order) continue;  // no order to vary
      sim::SimOptions o;
      o.trace = trace;
      sim::Simulator s(sim::ScenarioParams(plan, config), o);
      sim::SimResult r = s.Run();
      const char* order = both ? sim::OrderName(config.order) : "-";
      const char* policy = config.recompute_on_failure ? "recompute" : "fail";
      const char* stream = config.stream_chunks ? "on" : "off";
      std::printf("%-4d %-28s %-9s %-9s %-6s %-6s %10.4f %6u %6u %7u %6u %6zu\n", n,
                  plan.name.c_str(), order, policy, stream, r.ok ? "pass" : "FAIL",
                  r.call_latency.seconds(), r.requests_ok, r.requests_error, r.requests_aborted,
                  r.probes_ok, r.blocks_left);
      if (!r.ok) {
        std::printf("     %s\n     replay: build/kvrelay sim --scenario %s --kv-mode %s "
                    "--call-order %s --call-gap-ms %g --kv-load-failure-policy %s "
                    "--stream-chunks %s --trace\n",
                    r.failure.c_str(), plan.name.c_str(), KvModeName(config.kv_mode),
                    sim::OrderName(config.order), config.gap.seconds() * 1e3, policy, stream);
      }
      ++(r.ok ? passed : failed);
      runs.push_back({{"index", n}, {"case", plan.name}, {"kv_mode", KvModeName(config.kv_mode)},
                      {"order", order}, {"policy", policy}, {"stream", stream},
                      {"passed", r.ok}, {"call_latency_s", r.call_latency.seconds()},
                      {"ok", r.requests_ok}, {"error", r.requests_error},
                      {"aborted", r.requests_aborted}, {"probes_ok", r.probes_ok},
                      {"blocks_left", r.blocks_left}});
    }
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%u passed, %u failed\n", passed, failed);
  if (!json_path.empty() &&
      !WriteJson(json_path, {{"mode", "matrix"}, {"passed", passed}, {"failed", failed},
                             {"wall_s", wall_s}, {"runs", runs}})) {
    return 2;
  }
  return failed > 0 ? 1 : 0;
}

// Marks that a CI-sized run must hit; each names a rare path the
// simulator exists to reach.
constexpr Mark kRequiredMarks[] = {
    Mark::kPullBeforeClaim,     Mark::kAnsweredFromTombstone,
    Mark::kWriteDoneAfterEnd,   Mark::kReleaseWhileLoading,
    Mark::kReleaseBeforeAlloc,  Mark::kReadyRefused,
    Mark::kSendExpired,         Mark::kDeadlineTimer,
    Mark::kWriteFailed,         Mark::kProducerGivenUp,
    Mark::kLateAnswerDropped,   Mark::kLoadCutShort,
    Mark::kLoadFailedRecompute, Mark::kLoadFailedError,
    Mark::kMultiProducer,       Mark::kMultiConsumer,
    Mark::kConnectionDropped,   Mark::kPartition,
    Mark::kCrash,
    Mark::kDuplicateTransferRejected, Mark::kPoolPressure,
    Mark::kPrefixHit,           Mark::kPullResent,
    Mark::kReanswered,          Mark::kFastAbort,
    Mark::kFastAbortBeforeClaim, Mark::kProducerToken,
    Mark::kQueueWaitExpired,    Mark::kRouterRelease,
    Mark::kRouterReleaseEndedSend,
    // chunk-wise hand-off (a preempted stream, Mark::kStreamParked, is the
    // matrix's: too rare in seeded runs to require)
    Mark::kStreamed,            Mark::kChunkWrite,
    Mark::kStreamEnded,         Mark::kProgressRefused,
    // read mode
    Mark::kLeaseExpired,        Mark::kLeaseExpiredRevoking,
    Mark::kLeaseExtended,       Mark::kRevokeSent,
    Mark::kRevokeWaitedForRead, Mark::kNoticeAfterEnd,
    Mark::kGrantTooLate,        Mark::kReadFailed,
    // the control channel (core/rank_session.h)
    Mark::kPeerDown,            Mark::kPeerGone,
    Mark::kPeerExited,          Mark::kStaleHandshake,
    Mark::kPeerCameBack,        Mark::kPullMisaddressed,
    Mark::kWriteRefusedNoGrant, Mark::kCrashStayedDown,
    Mark::kLaneOpened,
};

bool ParseRange(const std::string& s, uint64_t* a, uint64_t* b) {
  auto dots = s.find("..");
  char* end = nullptr;
  if (dots == std::string::npos) {
    *a = *b = std::strtoull(s.c_str(), &end, 10);
    return end != nullptr && *end == '\0' && !s.empty();
  }
  std::string lo = s.substr(0, dots), hi = s.substr(dots + 2);
  if (lo.empty() || hi.empty()) return false;
  *a = std::strtoull(lo.c_str(), &end, 10);
  if (*end != '\0') return false;
  *b = std::strtoull(hi.c_str(), &end, 10);
  return *end == '\0' && *a <= *b;
}

std::string ReplayCommand(uint64_t seed) {
  return "build/kvrelay sim --seed " + std::to_string(seed) + " --trace";
}

int RunOne(uint64_t seed, bool trace) {
  sim::SimParams params = sim::DrawParams(seed);
  std::printf("seed %" PRIu64 ": %s\n", seed, params.ToString().c_str());
  std::fflush(stdout);
  sim::SimOptions o;
  o.trace = trace;
  sim::Simulator s(params, o);
  sim::SimResult r = s.Run();
  std::printf("events %" PRIu64 "  sim time %.3fs  requests ok %u error %u aborted %u  "
              "lifecycle ops %u (%u failed)  trace hash %016" PRIx64 "\n",
              r.events, r.end_time.seconds(), r.requests_ok, r.requests_error,
              r.requests_aborted, r.ops, r.ops_failed, r.trace_hash);
  if (r.ok) {
    std::printf("1 passed, 0 failed\n");
    return 0;
  }
  std::printf("FAIL seed %" PRIu64 ": %s\n0 passed, 1 failed\n", seed, r.failure.c_str());
  return 1;
}

// --- worker side -----------------------------------------------------------

[[noreturn]] void WorkerMain(int fd, const std::vector<uint64_t>& seeds, size_t start,
                             size_t stride, double deadline_s) {
  FILE* out = fdopen(fd, "w");
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = start; i < seeds.size(); i += stride) {
    if (deadline_s > 0) {
      double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (el > deadline_s) break;
    }
    std::fprintf(out, "S %zu\n", i);
    std::fflush(out);
    sim::SimResult r = sim::RunSeed(seeds[i], sim::SimOptions{});
    std::string reason = r.failure;
    for (char& c : reason) if (c == '\n') c = ' ';
    std::fprintf(out, "R %zu %d %" PRIu64 " %016" PRIx64 " %s\n", i, r.ok ? 1 : 0,
                 r.events, r.trace_hash, reason.c_str());
    // The seed's coverage right after its result, so a worker stopped at
    // the budget's end loses only the seed it was running.
    std::fprintf(out, "C");
    for (uint64_t h : r.coverage.hits) std::fprintf(out, " %" PRIu64, h);
    std::fprintf(out, "\n");
  }
  std::fprintf(out, "E\n");
  std::fflush(out);
  _exit(0);
}

struct Worker {
  pid_t pid = -1;
  int fd = -1;
  std::string buf;
  size_t next = 0;       // next seed index this worker would run
  int64_t running = -1;  // seed index started, not yet reported
  bool done = false;
};

struct Totals {
  uint64_t passed = 0, failed = 0, events = 0;
  sim::Coverage coverage;
  std::vector<std::string> failures;
  std::map<uint64_t, uint64_t> hashes;  // seed → trace hash (for determinism)
  std::vector<uint64_t> unfinished;     // seeds stopped at the budget's end
};

void Spawn(Worker& w, const std::vector<uint64_t>& seeds, size_t stride,
           double deadline_s) {
  int p[2];
  if (pipe(p) != 0) {
    std::perror("pipe");
    std::exit(2);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(2);
  }
  if (pid == 0) {
    close(p[0]);
    WorkerMain(p[1], seeds, w.next, stride, deadline_s);
  }
  close(p[1]);
  w.pid = pid;
  w.fd = p[0];
  w.buf.clear();
  w.running = -1;
  w.done = false;
}

void HandleLine(const std::string& line, Worker& w, const std::vector<uint64_t>& seeds,
                size_t stride, Totals& t) {
  if (line.empty()) return;
  std::istringstream in(line.substr(1));
  switch (line[0]) {
    case 'S': {
      size_t i;
      in >> i;
      w.running = static_cast<int64_t>(i);
      break;
    }
    case 'R': {
      size_t i;
      int ok;
      uint64_t events;
      std::string hash;
      in >> i >> ok >> events >> hash;
      std::string reason;
      std::getline(in, reason);
      if (!reason.empty() && reason[0] == ' ') reason.erase(0, 1);
      t.events += events;
      t.hashes[seeds[i]] = std::strtoull(hash.c_str(), nullptr, 16);
      if (ok) {
        ++t.passed;
      } else {
        ++t.failed;
        t.failures.push_back("FAIL seed " + std::to_string(seeds[i]) + ": " + reason +
                             "\n  replay: " + ReplayCommand(seeds[i]));
      }
      w.running = -1;
      w.next = i + stride;
      break;
    }
    case 'C': {
      sim::Coverage c;
      for (auto& h : c.hits) in >> h;
      t.coverage.Add(c);
      break;
    }
    case 'E':
      w.done = true;
      break;
  }
}

// Stops every worker still running (fail-fast, or the budget's end): their
// seeds count neither way. With `unfinished`, the seeds they were running
// are listed there.
void StopAll(std::vector<Worker>& workers, const std::vector<uint64_t>& seeds,
             std::vector<uint64_t>* unfinished) {
  for (auto& w : workers) {
    if (w.fd < 0) continue;
    kill(w.pid, SIGKILL);
    close(w.fd);
    w.fd = -1;
    int status = 0;
    waitpid(w.pid, &status, 0);
    if (unfinished != nullptr && w.running >= 0) {
      unfinished->push_back(seeds[static_cast<size_t>(w.running)]);
    }
  }
}

// How long past the budget a seed already running may take to finish
// before its worker is stopped: a tenth of the budget, at least 1 s. Most
// seeds take milliseconds; a rare one (long timeouts, many crashes, eager
// heartbeats) takes a minute, and would otherwise stretch the run by that.
double BudgetGraceS(double budget_s) { return std::max(1.0, budget_s / 10); }

Totals RunMany(const std::vector<uint64_t>& seeds, int jobs, double budget_s, bool fail_fast,
               bool verbose) {
  Totals t;
  jobs = std::max(1, std::min<int>(jobs, static_cast<int>(seeds.size())));
  std::vector<Worker> workers(jobs);
  for (int j = 0; j < jobs; ++j) {
    workers[j].next = j;
    Spawn(workers[j], seeds, jobs, budget_s);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed_s = [&t0] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto last_progress = t0;
  int alive = jobs;
  while (alive > 0) {
    std::vector<pollfd> fds;
    std::vector<Worker*> polled;
    for (auto& w : workers) {
      if (w.fd < 0) continue;
      fds.push_back(pollfd{w.fd, POLLIN, 0});
      polled.push_back(&w);
    }
    poll(fds.data(), fds.size(), 1000);
    for (size_t k = 0; k < fds.size(); ++k) {
      // Only a worker with something to say: a read on one still running a
      // long seed would block, and with it the budget's end and progress.
      if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      Worker& w = *polled[k];
      char buf[65536];
      ssize_t n = read(w.fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        w.buf.append(buf, static_cast<size_t>(n));
        size_t pos;
        while ((pos = w.buf.find('\n')) != std::string::npos) {
          HandleLine(w.buf.substr(0, pos), w, seeds, jobs, t);
          w.buf.erase(0, pos + 1);
        }
        continue;
      }
      if (n != 0) continue;
      // EOF: the worker finished or died.
      close(w.fd);
      w.fd = -1;
      int status = 0;
      waitpid(w.pid, &status, 0);
      if (!w.done && w.running >= 0) {
        const uint64_t seed = seeds[static_cast<size_t>(w.running)];
        ++t.failed;
        t.failures.push_back("FAIL seed " + std::to_string(seed) + ": crashed (" +
                             (WIFSIGNALED(status) ? std::string("signal ") +
                                                        strsignal(WTERMSIG(status))
                                                  : "exit") +
                             ") — a KV_CHECK in the core, see stderr above\n  replay: " +
                             ReplayCommand(seed));
        w.next = static_cast<size_t>(w.running) + jobs;
        const double el = elapsed_s();
        if (w.next < seeds.size() && (budget_s <= 0 || el < budget_s)) {
          Spawn(w, seeds, jobs, budget_s > 0 ? budget_s - el : 0);
          continue;
        }
      }
      --alive;
    }
    if (fail_fast && t.failed > 0) {
      StopAll(workers, seeds, nullptr);
      break;
    }
    if (budget_s > 0 && elapsed_s() > budget_s + BudgetGraceS(budget_s)) {
      StopAll(workers, seeds, &t.unfinished);
      break;
    }
    auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_progress).count() >= 2.0) {
      last_progress = now;
      double el = std::chrono::duration<double>(now - t0).count();
      std::fprintf(stderr, "  sim: %" PRIu64 "/%zu seeds, %" PRIu64 " failed, %.0f seeds/s\n",
                   t.passed + t.failed, seeds.size(), t.failed,
                   static_cast<double>(t.passed + t.failed) / el);
    }
  }
  (void)verbose;
  return t;
}

std::vector<uint64_t> ReadRegressions(const std::string& path, bool* ok) {
  std::vector<uint64_t> seeds;
  std::ifstream in(path);
  *ok = static_cast<bool>(in);
  std::string line;
  while (std::getline(in, line)) {
    auto hash = line.find('#');
    if (hash != std::string::npos) line.erase(hash);
    std::istringstream ls(line);
    uint64_t s;
    if (ls >> s) seeds.push_back(s);
  }
  return seeds;
}

int RunCommand(const SimCliOptions& o) {
  if (o.matrix || !o.scenario.empty()) {
    KvMode mode = KvMode::kPush;
    if (!ParseKvMode(o.kv_mode, &mode)) {
      std::fprintf(stderr, "kvrelay sim: --kv-mode must be push or read, not '%s'\n",
                   o.kv_mode.c_str());
      return 2;
    }
    std::vector<sim::ScenarioPlan::Order> orders;
    if (o.call_order == "all") {
      orders = {sim::ScenarioPlan::Order::kDFirst, sim::ScenarioPlan::Order::kPFirst,
                sim::ScenarioPlan::Order::kTogether};
    } else {
      sim::ScenarioPlan::Order one;
      if (!sim::ParseOrder(o.call_order, &one)) {
        std::fprintf(stderr,
                     "kvrelay sim: --call-order must be d-first, p-first, together or all, "
                     "not '%s'\n", o.call_order.c_str());
        return 2;
      }
      orders = {one};
    }
    std::vector<bool> policies;
    if (o.policy == "all" || o.policy == "recompute") policies.push_back(true);
    if (o.policy == "all" || o.policy == "fail") policies.push_back(false);
    if (policies.empty()) {
      std::fprintf(stderr,
                   "kvrelay sim: --kv-load-failure-policy must be recompute, fail or all, "
                   "not '%s'\n", o.policy.c_str());
      return 2;
    }
    // Streaming is a push-mode hand-off: read mode hands off whole.
    std::vector<bool> streams;
    if (o.stream == "all" || o.stream == "off") streams.push_back(false);
    if ((o.stream == "all" && mode == KvMode::kPush) || o.stream == "on") streams.push_back(true);
    if (streams.empty() || (o.stream == "on" && mode != KvMode::kPush)) {
      std::fprintf(stderr,
                   "kvrelay sim: --stream-chunks must be off, on or all (on: push mode "
                   "only), not '%s'\n", o.stream.c_str());
      return 2;
    }
    std::vector<sim::MatrixConfig> configs;
    for (bool stream : streams) {
      for (bool recompute : policies) {
        for (auto order : orders) {
          sim::MatrixConfig c;
          c.kv_mode = mode;
          c.order = order;
          c.gap = Duration::Microseconds(static_cast<int64_t>(o.call_gap_ms * 1000));
          c.recompute_on_failure = recompute;
          c.stream_chunks = stream;
          configs.push_back(c);
        }
      }
    }
    std::printf("lifecycle matrix, kv mode %s, call order %s (gap %g ms), "
                "kv_load_failure_policy %s, stream chunks %s\n", KvModeName(mode),
                o.call_order.c_str(), o.call_gap_ms, o.policy.c_str(),
                mode == KvMode::kPush ? o.stream.c_str() : "off");
    return RunMatrix(o.scenario, o.trace, configs, o.json_path);
  }
  if (o.seed >= 0) return RunOne(static_cast<uint64_t>(o.seed), o.trace);
  std::vector<uint64_t> seeds;
  if (!o.regressions.empty()) {
    bool ok = false;
    seeds = ReadRegressions(o.regressions, &ok);
    if (!ok) {
      std::fprintf(stderr, "kvrelay sim: cannot read %s\n", o.regressions.c_str());
      return 2;
    }
    std::printf("kvrelay sim: replaying %zu regression seeds from %s\n", seeds.size(),
                o.regressions.c_str());
  } else {
    uint64_t a, b;
    if (!ParseRange(o.seeds, &a, &b)) {
      std::fprintf(stderr, "kvrelay sim: --seeds wants A..B or N, got '%s'\n", o.seeds.c_str());
      return 2;
    }
    for (uint64_t s = a; s <= b; ++s) seeds.push_back(s);
    std::printf("kvrelay sim: seeds %" PRIu64 "..%" PRIu64 "%s\n", a, b,
                o.budget_s > 0 ? (" within " + std::to_string(static_cast<int>(o.budget_s)) +
                                  " s").c_str()
                               : "");
  }
  std::fflush(stdout);
  const int jobs = o.jobs > 0 ? o.jobs : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  auto t0 = std::chrono::steady_clock::now();
  Totals t = RunMany(seeds, jobs, o.budget_s, o.fail_fast, o.verbose);
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int rc = t.failed > 0 ? 1 : 0;
  for (const auto& f : t.failures) std::printf("%s\n", f.c_str());
  for (uint64_t seed : t.unfinished) {
    std::printf("UNFINISHED seed %" PRIu64 ": still running %.0f s past the budget, stopped "
                "(counted neither way)\n  replay: %s\n", seed, BudgetGraceS(o.budget_s),
                ReplayCommand(seed).c_str());
  }
  const uint64_t ran = t.passed + t.failed;
  std::printf("ran %" PRIu64 " seeds in %.1f s on %d processes: %.0f schedules/s, %.2f M events/s\n",
              ran, el, jobs, static_cast<double>(ran) / el,
              static_cast<double>(t.events) / el / 1e6);
  std::printf("coverage (hits across seeds):\n");
  for (size_t m = 0; m < static_cast<size_t>(Mark::kCount); ++m) {
    std::printf("  %-28s %" PRIu64 "\n", std::string(sim::MarkName(static_cast<Mark>(m))).c_str(),
                t.coverage.hits[m]);
  }
  nlohmann::json missing = nlohmann::json::array();
  if (o.require_marks) {
    for (Mark m : kRequiredMarks) {
      if (t.coverage.Of(m) == 0) {
        std::printf("MISSING coverage mark: %s was never hit\n",
                    std::string(sim::MarkName(m)).c_str());
        missing.push_back(sim::MarkName(m));
        rc = 1;
      }
    }
  }
  int checked = 0, mismatched = 0;
  if (o.determinism > 0 && !t.hashes.empty()) {
    // Re-run a sample of seeds in this process and compare trace hashes.
    const size_t step = std::max<size_t>(1, t.hashes.size() / static_cast<size_t>(o.determinism));
    size_t k = 0;
    for (const auto& [seed, hash] : t.hashes) {
      if (k++ % step != 0) continue;
      sim::SimResult again = sim::RunSeed(seed, sim::SimOptions{});
      ++checked;
      if (again.trace_hash != hash) {
        ++mismatched;
        std::printf("NONDETERMINISTIC seed %" PRIu64 ": trace hash %016" PRIx64
                    " then %016" PRIx64 "\n", seed, hash, again.trace_hash);
      }
      if (checked >= o.determinism) break;
    }
    std::printf("determinism: %d seeds re-run, %d trace hashes differed\n", checked, mismatched);
    if (mismatched > 0) rc = 1;
  }
  std::printf("%" PRIu64 " passed, %" PRIu64 " failed", t.passed, t.failed);
  if (!t.unfinished.empty()) std::printf(", %zu unfinished", t.unfinished.size());
  std::printf("\n");
  if (!o.json_path.empty()) {
    nlohmann::json coverage = nlohmann::json::object();
    for (size_t m = 0; m < static_cast<size_t>(Mark::kCount); ++m) {
      coverage[std::string(sim::MarkName(static_cast<Mark>(m)))] = t.coverage.hits[m];
    }
    const nlohmann::json doc = {
        {"mode", o.regressions.empty() ? "seeds" : "regressions"},
        {"seeds_listed", seeds.size()}, {"budget_s", o.budget_s}, {"jobs", jobs},
        {"passed", t.passed}, {"failed", t.failed}, {"unfinished", t.unfinished},
        {"wall_s", el}, {"events", t.events},
        {"schedules_per_s", static_cast<double>(ran) / el},
        {"events_per_s", static_cast<double>(t.events) / el},
        {"required_marks", o.require_marks ? std::size(kRequiredMarks) : 0},
        {"missing_marks", missing}, {"coverage", coverage},
        {"determinism_checked", checked}, {"determinism_mismatched", mismatched}};
    if (!WriteJson(o.json_path, doc)) return 2;
  }
  return rc;
}

}  // namespace

void RegisterSim(CLI::App& app) {
  auto o = std::make_shared<SimCliOptions>();
  auto* cmd = app.add_subcommand(
      "sim",
      "Deterministic simulation: run seeded schedules of a P/D cluster with faults and "
      "check every invariant after every step");
  cmd->add_option("--seeds", o->seeds, "Seed range A..B (or one number)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Run one seed in-process and print its details");
  cmd->add_flag("--trace", o->trace, "With --seed: print one line per event");
  cmd->add_option("--budget-s", o->budget_s,
                  "Stop starting new seeds after this many seconds, and stop a seed still "
                  "running a tenth later (at least 1 s; listed as unfinished, counted neither "
                  "way) (0 = no limit)")
      ->check(NonNegative());
  cmd->add_flag("--fail-fast", o->fail_fast,
               "Stop at the first failing seed (the other workers' seeds are not counted)");
  cmd->add_option("--jobs", o->jobs, "Worker processes (default: one per core)")
      ->check(NonNegative());
  cmd->add_option("--regressions", o->regressions,
                  "Replay the seeds listed in FILE (one per line, # comments)");
  cmd->add_flag("--require-marks", o->require_marks,
                "Fail if a required coverage mark was never hit");
  cmd->add_option("--determinism", o->determinism,
                  "Re-run N of the seeds and require identical trace hashes")
      ->check(NonNegative());
  cmd->add_option("--scenario", o->scenario,
                  "Run one lifecycle-matrix case by name (e.g. pause-abort-clear-p)");
  cmd->add_flag("--matrix", o->matrix,
                "Run all 27 lifecycle-matrix cases under load, one line per case");
  cmd->add_option("--kv-mode", o->kv_mode,
                  "With --matrix/--scenario: push (P writes into D) or read (D reads P's "
                  "blocks under a lease: 30 s, extended 20 s by heartbeats every 5 s); "
                  "seeded runs draw their mode from the seed")
      ->check(KvModeNames())
      ->capture_default_str();
  cmd->add_option("--call-order", o->call_order,
                  "With --matrix/--scenario, for calls on both engines: d-first, p-first, "
                  "together, or all three in turn")
      ->check(OneOf({"d-first", "p-first", "together", "all"}))
      ->capture_default_str();
  cmd->add_option("--call-gap-ms", o->call_gap_ms,
                  "With --matrix/--scenario: how long after the first engine's call the "
                  "second one's comes (d-first, p-first)")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--kv-load-failure-policy", o->policy,
                  "With --matrix/--scenario: recompute (a failed load recomputes), fail (it "
                  "fails its request; only a call that aborts may then end requests with "
                  "an error), or all (both in turn)")
      ->check(OneOf({"recompute", "fail", "all"}))
      ->capture_default_str();
  cmd->add_option("--stream-chunks", o->stream,
                  "With --matrix/--scenario: off (P hands the KV off when its prefill ends), "
                  "on (P hands each finished prompt chunk off while the prefill goes on; push "
                  "mode only), or all (both in turn; read mode: off)")
      ->check(OneOf({"off", "on", "all"}))
      ->capture_default_str();
  cmd->add_option("--json", o->json_path,
                  "Also write the run's report as JSON to this file (seeded runs: counts, "
                  "rates, coverage; --matrix/--scenario: one row per run)");
  // Seeded runs draw these from the seed: given without --matrix or
  // --scenario, they would be ignored, so they are refused.
  const std::vector<const CLI::Option*> scenario_only = {
      cmd->get_option("--kv-mode"), cmd->get_option("--call-order"),
      cmd->get_option("--call-gap-ms"), cmd->get_option("--kv-load-failure-policy"),
      cmd->get_option("--stream-chunks")};
  cmd->callback([o, scenario_only] {
    if (!o->matrix && o->scenario.empty()) {
      for (const CLI::Option* opt : scenario_only) {
        if (opt->count() == 0) continue;
        std::fprintf(stderr, "kvrelay sim: %s applies to --matrix and --scenario only (seeded "
                     "runs draw it from each seed)\n", opt->get_name().c_str());
        SetExitCode(2);
        return;
      }
    }
    SetExitCode(RunCommand(*o));
  });
}

}  // namespace kvrelay::cli
