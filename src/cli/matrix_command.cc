// `kvrelay matrix`: the 27 cases of lifecycle.md against real processes.
//
// Each case gets a fresh 1P1D cluster (LocalCluster), a load through the
// router (bench load's machinery, with 10% client disconnects; 50% for
// the disconnect case), and its lifecycle call landing while the load runs;
// a pause or sleep is undone once it returned. The verdict: every request
// ended with output (checked token by token) or a clean error, every call
// returned within its bound with its result, both engines idle with empty
// pools (prefix cache aside), and probe requests give exactly the model's
// output. The cases are the simulator's (`kvrelay sim --matrix`), so the
// two drivers run the same list.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/llama_cluster.h"
#include "cli/local_cluster.h"
#include "runtime/auth_token.h"
#include "sim/matrix.h"

namespace kvrelay::cli {
namespace {

using Op = sim::ScenarioPlan::Op;

struct MatrixOptions {
  std::string cases;            // comma-separated names or 1-based numbers; "" = all
  uint32_t requests = 120;
  uint32_t concurrency = 16;
  double call_at_s = 0.3;
  std::string transport = "shm";
  std::string shape = "tiny";
  LlamaClusterFlags llama;   // --engine, --model, --threads
  uint32_t p_tp = 1, d_tp = 1;
  // Slower modelled compute than serve's default, so that at the call's
  // moment requests are prefilling on P, held for a pull, loading and
  // decoding on D (the interesting races), not all already done.
  double step_per_token_us = 100;
  std::string logs;
  std::string json_path;
  uint64_t seed = 1;
  std::string auth_token_file;
  std::string kv_mode = "push";
  // For calls on both engines: d-first | p-first | together, or random (drawn
  // per case from --seed, and printed).
  std::string call_order = "random";
  int call_gap_ms = 20;
  std::string policy = "recompute";   // the engines' --load-failure-policy
  double lease_s = 30;   // read mode: serve's default; P's holds must stay within it
  std::string sweep;     // "" | all | day | N | A..B (see --sweep)
  // P's --stream-chunks, at a token budget of kStreamChunkTokens so the
  // load's prompts span several chunks and calls land between them.
  bool stream_chunks = false;
};

// Read mode: the longest any P rank held a lease's blocks (-1: unknown).
double MaxLeaseHoldS(const LocalCluster& cluster) {
  double worst = -1;
  for (const std::string& url : cluster.p_urls()) {
    Result<nlohmann::json> st = GetJson(url, "/debug/state");
    if (!st.ok() || !st->contains("ranks")) return -1;
    for (const auto& rank : (*st)["ranks"]) {
      worst = std::max(worst, rank.value("lease_max_hold_s", 0.0));
    }
  }
  return worst;
}

const char* Mode(engine::PauseMode m) {
  return m == engine::PauseMode::kAbort ? "abort" : m == engine::PauseMode::kWait ? "wait"
                                                                                  : "keep";
}

// The load's control call for a case.
std::optional<ControlCall> CallFor(const sim::ScenarioPlan& c, double at_s) {
  ControlCall call;
  call.at_s = at_s;
  call.target = c.on_p && c.on_d ? "all" : c.on_p ? "p" : "d";
  switch (c.op) {
    case Op::kPause:
      call.call = "pause";
      call.params = {{"mode", Mode(c.mode)}, {"clear_cache", c.clear_cache ? "true" : "false"}};
      break;
    case Op::kSleep:
      call.call = "sleep";
      call.params = {{"level", std::to_string(c.level)}, {"mode", Mode(c.mode)}};
      break;
    case Op::kAbortAll: call.call = "abort_requests"; break;
    case Op::kAbortSome:
      call.call = "abort_requests";
      call.params = {{"some", "1"}};
      break;
    case Op::kResetPrefix:
      call.call = "reset_prefix_cache";
      call.params = {{"reset_running_requests", c.reset_running ? "true" : "false"}};
      break;
    case Op::kReleaseKv: call.call = "release_kv_cache_memory"; break;
    case Op::kUpdateWeights:
      call.call = "update_weights";
      call.params = {{"version", "2"}, {"mode", Mode(c.mode)}};
      break;
    case Op::kNone: return std::nullopt;
  }
  return call;
}

// Real processes answer over HTTP on a shared machine: the bound is wider
// than the simulator's, and still far below any transfer timeout (480 s).
double BoundFor(const sim::ScenarioPlan& c) {
  if (c.op == Op::kPause && c.mode == engine::PauseMode::kKeep && !c.clear_cache) return 0.5;
  return 10.0;
}

// The order of a case's calls on both engines: the one asked for, or one
// drawn from the seed and the case's number.
std::string OrderFor(const MatrixOptions& m, int index) {
  if (m.call_order != "random") return m.call_order;
  static const char* kOrders[] = {"d-first", "p-first", "together"};
  const uint64_t x = (m.seed + static_cast<uint64_t>(index)) * 0x9E3779B97F4A7C15ull;
  return kOrders[(x >> 33) % 3];
}

struct Row {
  int index = 0;
  std::string name, call, target, order, verdict, why;
  double latency_s = 0;
  LoadReport load;
  int64_t p_blocks = -1, d_blocks = -1;
  double max_hold_s = -1;   // read mode: P's longest lease hold
  bool passed = false;
};

// Runs the chosen cases under one configuration; `passed`/`failed` (if
// given) receive the counts. Exit status: 0 if every case passed.
int RunMatrix(const MatrixOptions& m, int* passed_out = nullptr, int* failed_out = nullptr) {
  std::string auth_token;
  if (!m.auth_token_file.empty()) {
    Result<std::string> token = runtime::LoadAuthToken(m.auth_token_file);
    if (!token.ok()) {
      std::fprintf(stderr, "kvrelay matrix: %s\n", token.status().message().c_str());
      return 2;
    }
    auth_token = *token;
  }
  std::vector<sim::ScenarioPlan> all = sim::MatrixCases();
  std::vector<std::pair<int, sim::ScenarioPlan>> chosen;
  if (m.cases.empty()) {
    for (size_t i = 0; i < all.size(); ++i) chosen.push_back({static_cast<int>(i + 1), all[i]});
  } else {
    std::string rest = m.cases;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string one = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      bool found = false;
      for (size_t i = 0; i < all.size(); ++i) {
        if (all[i].name == one || std::to_string(i + 1) == one) {
          chosen.push_back({static_cast<int>(i + 1), all[i]});
          found = true;
        }
      }
      if (!found) {
        std::fprintf(stderr, "kvrelay matrix: no case '%s'; the cases are:\n", one.c_str());
        for (size_t i = 0; i < all.size(); ++i) {
          std::fprintf(stderr, "  %2zu %s\n", i + 1, all[i].name.c_str());
        }
        return 2;
      }
    }
  }
  const std::string logs =
      m.logs.empty() ? "/tmp/kvrelay-matrix-" + std::to_string(std::time(nullptr)) : m.logs;
  std::printf("kvrelay matrix: %zu cases, %u requests at concurrency %u each, call at %.2f s, "
              "transport %s, logs in %s\n",
              chosen.size(), m.requests, m.concurrency, m.call_at_s, m.transport.c_str(),
              logs.c_str());
  if (m.stream_chunks && (m.kv_mode != "push" || m.llama.engine == "llama")) {
    std::fprintf(stderr, "kvrelay matrix: --stream-chunks is a push-mode hand-off of the "
                         "emulated engine (read mode and llama.cpp engines hand off whole)\n");
    return 2;
  }
  std::printf("call order %s (gap %d ms, seed %llu), kv_load_failure_policy %s\n",
              m.call_order.c_str(), m.call_gap_ms, static_cast<unsigned long long>(m.seed),
              m.policy.c_str());
  std::printf("kv mode %s%s\n", m.kv_mode.c_str(),
              m.kv_mode == "read" ? " (hold s: P's longest lease hold; must stay within the "
                                    "lease)"
                                  : "");
  std::printf("%-3s %-28s %-42s %-6s %-8s %9s %-22s %-9s %-6s %7s %s\n", "#", "case", "call",
              "target", "order", "call ms", "ok/err/disc/failed", "blocks P/D", "probes",
              "hold s", "verdict");
  std::fflush(stdout);
  std::vector<Row> rows;
  int failed = 0;
  for (const auto& [index, c] : chosen) {
    Row row;
    row.index = index;
    row.name = c.name;
    ClusterOptions co;
    co.logs = logs + "/" + std::to_string(index) + "-" + c.name;
    co.transport = m.transport;
    co.shape = m.shape;
    co.p_tp = m.p_tp;
    co.d_tp = m.d_tp;
    co.step_per_token_us = m.step_per_token_us;
    co.auth_token_file = m.auth_token_file;
    co.engine_args = {"--kv-mode", m.kv_mode, "--load-failure-policy", m.policy};
    if (m.stream_chunks) {
      const std::vector<std::string> a = StreamChunksArgs(kStreamChunkTokens);
      co.engine_args.insert(co.engine_args.end(), a.begin(), a.end());
    }
    co.router_args = {"--kv-mode", m.kv_mode};
    LoadOptions llama_load;   // --engine llama: its checker
    LocalCluster cluster;
    Status s = SetUpLlamaCluster(m.llama, logs, &co, &llama_load);
    if (s.ok()) s = cluster.Start(co);
    if (!s.ok()) {
      row.verdict = "FAIL";
      row.why = s.message();
    } else {
      LoadOptions o;
      o.checker = llama_load.checker;
      o.url = cluster.router_url();
      o.auth_token = auth_token;
      o.requests = m.requests;
      o.concurrency = m.concurrency;
      o.seed = m.seed + static_cast<uint64_t>(index);
      o.progress = false;
      o.probes = 4;
      o.disconnect_fraction = c.op == Op::kNone ? 0.5 : 0.1;
      std::optional<ControlCall> call = CallFor(c, m.call_at_s);
      if (call && call->target == "all") {
        call->order = OrderFor(m, index);
        call->gap_ms = m.call_gap_ms;
        row.order = call->order;
      }
      if (call) o.controls.push_back(*call);
      row.call = call ? call->call : "(none)";
      if (call && !call->params.empty()) {
        row.call += "?";
        bool first = true;
        for (const auto& [k, v] : call->params) {
          row.call += (first ? "" : "&") + k + "=" + v;
          first = false;
        }
      }
      row.target = call ? call->target : "-";
      row.load = RunLoad(o);
      bool calls_ok = true;
      for (const ControlOutcome& co2 : row.load.controls) {
        if (co2.call.rfind("resume", 0) == 0 || co2.call.rfind("wake_up", 0) == 0) {
          if (!co2.ok) {
            calls_ok = false;
            row.why += "undo call failed: " + co2.detail + "; ";
          }
          continue;
        }
        row.latency_s = std::max(row.latency_s, co2.latency_s);
        // reset_prefix_cache returns false (409), never raises, while
        // transfers or requests hold blocks (lifecycle.md; vLLM's
        // contract) — with reset_running_requests too, since transfers are
        // not running requests. Everything else must succeed.
        const bool refusal_allowed = c.op == Op::kResetPrefix && co2.http_status == 409;
        if (!co2.ok && !refusal_allowed) {
          calls_ok = false;
          row.why += co2.engine + ": " + co2.detail + "; ";
        }
        if (co2.latency_s > BoundFor(c)) {
          calls_ok = false;
          row.why += "call took " + std::to_string(co2.latency_s) + " s; ";
        }
      }
      for (const auto& [url, blocks] : row.load.blocks_left) {
        for (const auto& p : cluster.p_urls()) {
          if (p == url) row.p_blocks = blocks;
        }
        for (const auto& d : cluster.d_urls()) {
          if (d == url) row.d_blocks = blocks;
        }
      }
      if (m.kv_mode == "read") {
        // P's longest hold is bounded by the lease (a revoke or D's notices
        // end it sooner), never by the abort timeout.
        row.max_hold_s = MaxLeaseHoldS(cluster);
        if (row.max_hold_s < 0 || row.max_hold_s > m.lease_s) {
          calls_ok = false;
          row.why += "P held KV " + std::to_string(row.max_hold_s) + " s (lease " +
                     std::to_string(m.lease_s) + " s); ";
        }
      }
      if (row.load.clean_errors > 0 && !c.MayAbort()) {
        calls_ok = false;
        row.why += std::to_string(row.load.clean_errors) +
                   " requests ended with an error although the call aborts nothing; ";
      }
      bool clean = false;
      const std::string how = cluster.Stop(&clean);
      if (!clean) row.why += "shutdown not clean: " + how;
      row.passed = calls_ok && row.load.passed() && clean;
      if (!row.load.passed()) {
        for (const auto& ch : row.load.checks) {
          if (!ch.ok) row.why += ch.name + ": " + ch.detail + "; ";
        }
        for (const auto& f : row.load.failures) row.why += f + "; ";
      }
      row.verdict = row.passed ? "PASS" : "FAIL";
    }
    if (!row.passed) ++failed;
    const LoadReport& r = row.load;
    char counts[64], blocks[32], probes[16];
    std::snprintf(counts, sizeof counts, "%u/%u/%u/%u", r.ok, r.clean_errors, r.disconnected,
                  r.failed);
    std::snprintf(blocks, sizeof blocks, "%lld/%lld", static_cast<long long>(row.p_blocks),
                  static_cast<long long>(row.d_blocks));
    std::snprintf(probes, sizeof probes, "%u/%u", r.probes_ok, r.probes);
    char hold[16] = "-";
    if (row.max_hold_s >= 0) std::snprintf(hold, sizeof hold, "%.3f", row.max_hold_s);
    std::printf("%-3d %-28s %-42s %-6s %-8s %9.1f %-22s %-9s %-6s %7s %s%s%s\n", row.index,
                row.name.c_str(), row.call.c_str(), row.target.c_str(),
                row.order.empty() ? "-" : row.order.c_str(), row.latency_s * 1e3,
                counts, blocks, probes, hold, row.verdict.c_str(), row.why.empty() ? "" : "  ",
                row.passed ? "" : row.why.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }
  std::printf("%zu passed, %d failed\n", rows.size() - failed, failed);
  if (passed_out != nullptr) *passed_out = static_cast<int>(rows.size()) - failed;
  if (failed_out != nullptr) *failed_out = failed;
  if (!m.json_path.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows) {
      j.push_back({{"index", r.index},
                   {"case", r.name},
                   {"call", r.call},
                   {"target", r.target},
                   {"order", r.order},
                   {"kv_load_failure_policy", m.policy},
                   {"call_latency_s", r.latency_s},
                   {"ok", r.load.ok},
                   {"clean_errors", r.load.clean_errors},
                   {"disconnected", r.load.disconnected},
                   {"failed", r.load.failed},
                   {"blocks_left_p", r.p_blocks},
                   {"blocks_left_d", r.d_blocks},
                   {"probes_ok", r.load.probes_ok},
                   {"probes", r.load.probes},
                   {"kv_mode", m.kv_mode},
                   {"max_lease_hold_s", r.max_hold_s},
                   {"passed", r.passed},
                   {"why", r.why}});
    }
    FILE* f = std::fopen(m.json_path.c_str(), "w");
    if (f != nullptr) {
      const std::string s = j.dump(2);
      std::fwrite(s.data(), 1, s.size(), f);
      std::fclose(f);
    }
  }
  return failed == 0 ? 0 : 1;
}

// The configuration grid of --sweep, in a fixed order.
std::vector<MatrixOptions> SweepGrid(const MatrixOptions& base) {
  std::vector<MatrixOptions> grid;
  const std::pair<uint32_t, uint32_t> tps[] = {{1, 1}, {2, 1}, {1, 2}, {4, 2}};
  for (const char* shape : {"tiny", "small"}) {
    for (const auto& [p_tp, d_tp] : tps) {
      for (const char* transport : {"shm", "tcp", "ucx"}) {
        for (const char* mode : {"push", "read"}) {
          for (const char* order : {"d-first", "p-first"}) {
            MatrixOptions m = base;
            m.shape = shape;
            m.p_tp = p_tp;
            m.d_tp = d_tp;
            m.transport = transport;
            m.kv_mode = mode;
            m.call_order = order;
            grid.push_back(m);
          }
        }
      }
    }
  }
  return grid;
}

int RunSweep(const MatrixOptions& base) {
  std::vector<MatrixOptions> grid = SweepGrid(base);
  size_t first = 0, last = grid.size() - 1;
  if (base.sweep == "day") {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    first = last = static_cast<size_t>(tm.tm_yday) % grid.size();
  } else if (base.sweep != "all") {
    const size_t dots = base.sweep.find("..");
    char* end = nullptr;
    const std::string a = base.sweep.substr(0, dots);
    first = std::strtoul(a.c_str(), &end, 10);
    bool ok = !a.empty() && *end == '\0';
    last = first;
    if (dots != std::string::npos) {
      const std::string b = base.sweep.substr(dots + 2);
      last = std::strtoul(b.c_str(), &end, 10);
      ok = ok && !b.empty() && *end == '\0';
    }
    if (!ok || first > last || last >= grid.size()) {
      std::fprintf(stderr,
                   "kvrelay matrix: --sweep wants all, day, N or A..B with B < %zu, not '%s'\n",
                   grid.size(), base.sweep.c_str());
      return 2;
    }
  }
  const std::string logs =
      base.logs.empty() ? "/tmp/kvrelay-sweep-" + std::to_string(std::time(nullptr)) : base.logs;
  std::printf("kvrelay matrix --sweep %s: configurations %zu..%zu of %zu (the full grid: "
              "--sweep all)\n", base.sweep.c_str(), first, last, grid.size());
  struct Done {
    size_t index;
    const MatrixOptions* m;
    int passed, failed;
  };
  std::vector<Done> done;
  int failed_configs = 0;
  for (size_t i = first; i <= last; ++i) {
    MatrixOptions m = grid[i];
    m.logs = logs + "/" + std::to_string(i);
    m.json_path = base.json_path.empty() ? "" : base.json_path + "." + std::to_string(i);
    std::printf("\n== configuration %zu: --model-shape %s --p-tp %u --d-tp %u --transport %s "
                "--kv-mode %s --call-order %s\n", i, m.shape.c_str(), m.p_tp, m.d_tp,
                m.transport.c_str(), m.kv_mode.c_str(), m.call_order.c_str());
    std::fflush(stdout);
    int passed = 0, failed = 0;
    const int rc = RunMatrix(m, &passed, &failed);
    if (rc == 2) return 2;
    if (rc != 0) ++failed_configs;
    done.push_back({i, &grid[i], passed, failed});
  }
  std::printf("\n| # | shape | tp P→D | transport | kv mode | order | passed | failed |\n"
              "|---:|---|---|---|---|---|---:|---:|\n");
  for (const Done& d : done) {
    std::printf("| %zu | %s | %u→%u | %s | %s | %s | %d | %d |\n", d.index, d.m->shape.c_str(),
                d.m->p_tp, d.m->d_tp, d.m->transport.c_str(), d.m->kv_mode.c_str(),
                d.m->call_order.c_str(), d.passed, d.failed);
  }
  std::printf("configurations: %zu passed, %d failed\n", done.size() - failed_configs,
              failed_configs);
  return failed_configs == 0 ? 0 : 1;
}

}  // namespace

void RegisterMatrix(CLI::App& app) {
  auto m = std::make_shared<MatrixOptions>();
  CLI::App* cmd = app.add_subcommand(
      "matrix",
      "The 27 lifecycle cases against real processes: a fresh P, D and router per case, a "
      "load, the call, and the checks; prints a table and 'N passed, M failed'");
  cmd->add_option("--cases", m->cases, "comma-separated case names or numbers (default: all)");
  cmd->add_option("--requests", m->requests, "requests per case")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--concurrency", m->concurrency, "concurrency per case")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--call-at-s", m->call_at_s, "when the call lands, from the load's start")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--transport", m->transport, "data plane")
      ->check(TransportNames())
      ->capture_default_str();
  cmd->add_option("--kv-mode", m->kv_mode,
                  "push | read: the engines' and router's --kv-mode; in read mode each case "
                  "also checks that P's longest lease hold stays within the lease (30 s)")
      ->check(KvModeNames())
      ->capture_default_str();
  cmd->add_option("--call-order", m->call_order,
                  "for calls on both engines: d-first, p-first, together, or random (drawn "
                  "per case from --seed; the table says which)")
      ->check(OneOf({"d-first", "p-first", "together", "random"}))
      ->capture_default_str();
  cmd->add_option("--call-gap-ms", m->call_gap_ms,
                  "how long after the first engine's call the second one's comes")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--kv-load-failure-policy", m->policy,
                  "recompute | fail: the engines' --load-failure-policy; under either, a case "
                  "whose call aborts nothing must end with 0 errors")
      ->check(LoadPolicyNames())
      ->capture_default_str();
  cmd->add_flag("--stream-chunks", m->stream_chunks,
                "P streams each finished prefill chunk to D (serve --stream-chunks; push "
                "mode), every engine at a budget of " + std::to_string(kStreamChunkTokens) +
                    " tokens a step so prompts span several chunks");
  cmd->add_option("--model-shape", m->shape, "model shape of the KV")
      ->check(ModelShapeNames())
      ->capture_default_str();
  AddLlamaClusterFlags(cmd, &m->llama);
  cmd->add_option("--p-tp", m->p_tp, "prefill tp")->check(TpSizes())->capture_default_str();
  cmd->add_option("--d-tp", m->d_tp, "decode tp")->check(TpSizes())->capture_default_str();
  cmd->add_option("--step-per-token-us", m->step_per_token_us, "engines' modelled compute")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--seed", m->seed, "load seed (each case adds its number)")
      ->capture_default_str();
  cmd->add_option("--logs", m->logs, "folder for the processes' logs");
  cmd->add_option("--json", m->json_path, "also write the table as JSON");
  cmd->add_option("--auth-token-file", m->auth_token_file,
                  "shared secret (chmod 600) for every engine and the router; lifecycle calls "
                  "are signed with it");
  cmd->add_option("--sweep", m->sweep,
                  "run the cases over the configuration grid (model shape tiny|small x tp "
                  "pairs 1-1, 2-1, 1-2, 4-2 x shm|tcp|ucx x push|read x d-first|p-first: 96 "
                  "configurations): 'all', 'day' (one configuration that changes with the "
                  "day of the year, as CI runs it), or indices 'N' / 'A..B'; the other "
                  "flags set the load");
  cmd->callback([m] {
    if (!m->sweep.empty() && m->llama.engine != "emulated") {
      std::fprintf(stderr, "kvrelay matrix: --sweep runs the emulated model's shapes; run "
                           "--engine llama without it\n");
      SetExitCode(2);
      return;
    }
    SetExitCode(m->sweep.empty() ? RunMatrix(*m) : RunSweep(*m));
  });
}

}  // namespace kvrelay::cli
