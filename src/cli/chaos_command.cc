// `kvrelay chaos`: the fault suite of issue 9 on real processes. Each case
// starts a fresh P, D and router (cli/chaos_runner), runs a load through
// the router, lands one real fault mid-load, heals it, and checks the end
// conditions (bench/chaos_verdict): survivors idle, no block leaked, every
// request ended with output or a clean error, every pull answered or given
// up within its bound, the cluster serving again. Prints one row per case
// and exits non-zero if any case failed (SKIPPED cases say why and do not
// fail the run).
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/chaos_cleanup.h"
#include "cli/chaos_runner.h"
#include "cli/commands.h"

namespace kvrelay::cli {
namespace {

struct ChaosCliOptions {
  ChaosOptions run;
  std::string cases;  // comma-separated names; "" = all
  std::string json_path;
};

std::string Recovery(const ChaosRow& r) {
  if (r.verdict.kind == ChaosVerdict::Kind::kSkipped) return "-";
  if (!r.measure.recover_expected) return "n/a";
  if (r.measure.recover_s < 0) return "never";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f s", r.measure.recover_s);
  return b;
}

std::string Blocks(const ChaosRow& r) {
  std::string s;
  for (const EngineEnd& e : r.measure.engines) {
    s += (s.empty() ? "" : "/") + (e.reachable ? std::to_string(e.blocks_used) : "?");
  }
  return s.empty() ? "-" : s;
}

int RunChaos(const ChaosCliOptions& cli) {
  ChaosOptions o = cli.run;
  if (o.logs.empty()) o.logs = "/tmp/kvrelay-chaos-" + std::to_string(std::time(nullptr));
  std::vector<ChaosCase> chosen;
  const auto& all = ChaosCases();
  if (cli.cases.empty()) {
    chosen = all;
  } else {
    std::string rest = cli.cases;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string one = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      bool found = false;
      for (const ChaosCase& c : all) {
        if (c.name == one) {
          chosen.push_back(c);
          found = true;
        }
      }
      if (!found) {
        std::fprintf(stderr, "kvrelay chaos: no case '%s'; the cases are:\n", one.c_str());
        for (const ChaosCase& c : all) {
          std::fprintf(stderr, "  %-18s %s\n", c.name.c_str(), c.what.c_str());
        }
        return 2;
      }
    }
  }
  if (o.stream_chunks && o.kv_mode == "read") {
    std::fprintf(stderr, "kvrelay chaos: --stream-chunks is a push-mode hand-off\n");
    return 2;
  }
  if (o.stream_chunks && o.llama.engine == "llama") {
    std::fprintf(stderr, "kvrelay chaos: --stream-chunks: llama.cpp engines hand their KV off "
                         "whole\n");
    return 2;
  }
  if (o.fault_at_s >= o.load_s) {
    std::fprintf(stderr, "kvrelay chaos: --fault-at-s (%.2f) must land before the load ends "
                 "(--load-s %.2f)\n", o.fault_at_s, o.load_s);
    return 2;
  }
  InstallChaosSignalCleanup();
  // The read-mode timings every engine of a case runs with.
  const auto ReadModeFlags = [](const ChaosOptions& c) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "; read mode, --lease-s %.1f --lease-extension-s %.1f --lease-heartbeat-s %.1f "
                  "--read-margin-s %.1f",
                  c.lease_s, c.lease_extension_s, c.lease_heartbeat_s, c.read_margin_s);
    return std::string(buf);
  };
  std::printf("kvrelay chaos: %zu cases; each a fresh P, D and router, transport %s (tcp for "
              "partitions and slow-d), load for %.1f s at concurrency %u, fault at %.1f s; "
              "engines at --abort-timeout-s %.1f --giveup-grace-s %.1f --peer-dead-after-s "
              "%.1f%s%s; logs in %s\n",
              chosen.size(), o.transport.c_str(), o.load_s, o.concurrency, o.fault_at_s,
              o.abort_timeout_s, o.giveup_grace_s, o.peer_dead_after_s,
              o.stream_chunks
                  ? ("; P streams chunks of " + std::to_string(kStreamChunkTokens) + " tokens")
                        .c_str()
                  : "",
              o.kv_mode == "read"
                  ? ReadModeFlags(o).c_str()
                  : "",
              o.logs.c_str());
  std::fflush(stdout);
  std::vector<ChaosRow> rows;
  int failed = 0, skipped = 0;
  int index = 0;
  for (const ChaosCase& c : chosen) {
    ++index;
    std::fprintf(stderr, "kvrelay chaos: [%d/%zu] %s: %s ...\n", index, chosen.size(),
                 c.name.c_str(), c.what.c_str());
    std::fflush(stderr);
    ChaosRow r = RunChaosCase(c, o, index);
    if (r.verdict.kind == ChaosVerdict::Kind::kFail) ++failed;
    if (r.verdict.kind == ChaosVerdict::Kind::kSkipped) ++skipped;
    const LoadReport& l = r.measure.load;
    std::printf("%-18s sent %5u  ok %5u  affected %4u  failed %3u  recover %-8s  blocks "
                "leaked P/D %-5s  %-7s (%.0f s)\n",
                c.name.c_str(), l.requests, l.ok, r.verdict.affected, r.verdict.failed,
                Recovery(r).c_str(), Blocks(r).c_str(), r.verdict.Text().c_str(), r.wall_s);
    if (!r.fault_detail.empty()) std::printf("    fault: %s\n", r.fault_detail.c_str());
    for (const EngineEnd& e : r.measure.engines) {
      std::printf("    %s%s: oldest send %.1f s (bound %.1f), oldest load %.1f s (bound %.1f), "
                  "pull items %llu received / %llu answered, loads failed %llu, "
                  "inline writes/reads %llu, lanes %llu",
                  e.name.c_str(), e.restarted ? " (restarted)" : "", e.max_send_age_s,
                  r.bounds.send_bound_s, e.max_load_age_s, r.bounds.load_bound_s,
                  static_cast<unsigned long long>(e.pulls_received),
                  static_cast<unsigned long long>(e.pulls_answered),
                  static_cast<unsigned long long>(e.loads_failed),
                  static_cast<unsigned long long>(e.inline_ops),
                  static_cast<unsigned long long>(e.lanes_opened));
      if (e.prefill && o.kv_mode == "read") {
        std::printf(", oldest lease %.1f s (bound %.1f)", e.max_lease_age_s,
                    r.bounds.lease_bound_s);
      }
      if (e.prefill && o.stream_chunks) {
        std::printf(", chunks streamed %llu, chunk writes %llu",
                    static_cast<unsigned long long>(e.chunks_streamed),
                    static_cast<unsigned long long>(e.chunk_writes));
      }
      std::printf("\n");
    }
    for (const std::string& w : r.verdict.why) std::printf("    %s: %s\n",
        r.verdict.kind == ChaosVerdict::Kind::kSkipped ? "skipped" : "FAIL", w.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(r));
  }
  std::printf("%zu passed, %d failed, %d skipped\n", rows.size() - failed - skipped, failed,
              skipped);
  if (!cli.json_path.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const ChaosRow& r : rows) {
      nlohmann::json engines = nlohmann::json::array();
      for (const EngineEnd& e : r.measure.engines) {
        engines.push_back({{"name", e.name}, {"url", e.url}, {"restarted", e.restarted},
                           {"reachable", e.reachable}, {"idle", e.idle},
                           {"blocks_leaked", e.blocks_used}, {"live_sends", e.live_sends},
                           {"live_loads", e.live_loads}, {"max_send_age_s", e.max_send_age_s},
                           {"max_load_age_s", e.max_load_age_s},
                           {"live_leases", e.live_leases},
                           {"max_lease_age_s", e.max_lease_age_s},
                           {"pulls_received", e.pulls_received},
                           {"pulls_answered", e.pulls_answered},
                           {"loads_failed", e.loads_failed},
                           {"lanes_opened", e.lanes_opened},
                           {"inline_ops", e.inline_ops},
                           {"chunks_streamed", e.chunks_streamed},
                           {"chunk_writes", e.chunk_writes}});
      }
      const LoadReport& l = r.measure.load;
      j.push_back({{"case", r.c.name},
                   {"fault", r.c.what},
                   {"fault_detail", r.fault_detail},
                   {"verdict", r.verdict.Text()},
                   {"why", r.verdict.why},
                   {"requests", l.requests},
                   {"ok", l.ok},
                   {"clean_errors", l.clean_errors},
                   {"cut_off", l.cut_off},
                   {"affected", r.verdict.affected},
                   {"failed", r.verdict.failed},
                   {"recover_s", r.measure.recover_expected ? r.measure.recover_s : -1},
                   {"blocks_leaked", r.verdict.blocks_leaked},
                   {"bounds", {{"load_s", r.bounds.load_bound_s},
                               {"send_s", r.bounds.send_bound_s},
                               {"recover_s", r.bounds.recover_bound_s}}},
                   {"engines", engines},
                   {"wall_s", r.wall_s}});
    }
    FILE* f = std::fopen(cli.json_path.c_str(), "w");
    if (f != nullptr) {
      const std::string s = j.dump(2);
      std::fwrite(s.data(), 1, s.size(), f);
      std::fclose(f);
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

void RegisterChaos(CLI::App& app) {
  auto o = std::make_shared<ChaosCliOptions>();
  std::string list;
  for (const ChaosCase& c : ChaosCases()) list += "\n  " + c.name + ": " + c.what;
  CLI::App* cmd = app.add_subcommand(
      "chaos",
      "The fault suite: per case a fresh P, D and router under load, one real fault "
      "mid-load, the heal, and the checks (survivors idle, 0 blocks leaked, every request "
      "ended with output or a clean error, every pull answered or given up within its bound, "
      "serving again). Needs root and nft for the partition cases (else SKIPPED). Cases:" +
          list);
  ChaosOptions& r = o->run;
  cmd->add_option("--case", o->cases, "comma-separated case names (default: all)");
  cmd->add_option("--json", o->json_path, "also write the rows as JSON to this file");
  cmd->add_option("--logs", r.logs, "folder for the processes' logs (default /tmp/kvrelay-chaos-<time>)");
  cmd->add_option("--transport", r.transport,
                  "the data plane (the partition and slow-d cases run on tcp)")
      ->check(TransportNames())
      ->capture_default_str();
  cmd->add_option("--seed", r.seed, "load seed (each case adds its number)")->capture_default_str();
  cmd->add_option("--concurrency", r.concurrency, "client requests in flight")
      ->check(Positive())
      ->capture_default_str();
  AddLlamaClusterFlags(cmd, &r.llama);
  cmd->add_option("--kv-mode", r.kv_mode,
                  "the engines' --kv-mode: push, or read (D reads under short leases; "
                  "fail-writes fails D's reads; P's leases must end within their bound)")
      ->check(KvModeNames())
      ->capture_default_str();
  cmd->add_flag("--stream-chunks", r.stream_chunks,
                "P streams each finished prefill chunk (32 tokens, P's --max-batch-tokens) to "
                "D (serve's --stream-chunks), so faults land mid-stream; emulated engines only");
  cmd->add_option("--load-s", r.load_s, "requests start for this long in each case")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--fault-at-s", r.fault_at_s,
                  "when the fault lands, from the load's start (before --load-s ends)")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--down-s", r.down_s, "kill cases: how long the process stays dead")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--partition-s", r.partition_s, "partition-heal: how long the partition lasts")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--slow-s", r.slow_s, "slow-d: how long D is throttled")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--slow-stop-ms", r.slow_stop_ms, "slow-d: D stopped this long each cycle")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--slow-run-ms", r.slow_run_ms, "slow-d: D running this long each cycle")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--fail-probability", r.fail_probability,
                  "fail-writes: probability that a write (read mode: a read) fails half-way")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--fail-after-bytes", r.fail_after_bytes,
                  "fail-writes: failures start after P wrote (D read) this many KV bytes")
      ->capture_default_str();
  cmd->add_option("--step-per-token-us", r.step_per_token_us, "engines' modelled compute")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--abort-timeout-s", r.abort_timeout_s, "engines' --abort-timeout-s")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--giveup-grace-s", r.giveup_grace_s, "engines' --giveup-grace-s")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--peer-dead-after-s", r.peer_dead_after_s, "engines' --peer-dead-after-s")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--slack-s", r.slack_s, "scheduling slack added to every transfer bound")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--recover-bound-s", r.recover_bound_s,
                  "a case fails if serving does not resume within this long after the fault")
      ->check(Positive())
      ->capture_default_str();
  cmd->callback([o] { SetExitCode(RunChaos(*o)); });
}

}  // namespace kvrelay::cli
