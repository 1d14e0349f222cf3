// chaos_runner.cc — see chaos_runner.h. Process control and timing only;
// the verdict is bench/chaos_verdict's.
#include "cli/chaos_runner.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>


#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/prng.h"
#include "bench/chaos_monitor.h"
#include "cli/chaos_cleanup.h"
#include "cli/chaos_partition.h"
#include "cli/local_cluster.h"
#include "engine/model.h"
#include "http/http_client.h"
#include "os/clock.h"

namespace kvrelay::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

void SleepUntil(Clock::time_point t0, double at_s) {
  std::this_thread::sleep_until(
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at_s)));
}
std::string F1(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", x);
  return b;
}
std::string F2(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", x);
  return b;
}

// A number as a child's flag value: exact enough that the child gets the
// value it was given (with F2, --abort-timeout-s 0.004 went as "0.00").
std::string Arg(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", x);
  return b;
}

// D's completed KV loads so far (-1: no answer).
double LoadsOk(const std::string& d_url) {
  return MetricSample(d_url, "kvrelay_loads_total{outcome=\"ok\"}");
}

// Live sends and loads of an engine, "3 sends, 1 load live" (or why not).
std::string LiveOf(const std::string& url) {
  auto st = GetJson(url, "/debug/state");
  if (!st.ok()) return "state unknown";
  size_t sends = 0, loads = 0, leases = 0;
  for (const json& r : (*st)["ranks"]) {
    sends += r.value("sends", json::array()).size();
    loads += r.value("loads", json::array()).size();
    leases += r.value("leases", json::array()).size();
  }
  return std::to_string(sends) + " sends, " + std::to_string(loads) + " loads" +
         (leases > 0 ? ", " + std::to_string(leases) + " leases" : "") + " live";
}

// Probes through the router from now until one is served with the model's
// output and (require_kv) D completed a KV load since; seconds, or -1.
// With a checker (llama.cpp engines) the output is judged by it.
double MeasureRecovery(const std::string& router, const std::string& d_url, bool require_kv,
                       double limit_s, uint64_t seed, OutputChecker* checker) {
  const Clock::time_point t0 = Clock::now();
  const double base = require_kv ? LoadsOk(d_url) : 0;
  engine::ModelShape shape;
  engine::ModelShapeByName("tiny", &shape);
  if (checker != nullptr) shape.vocab = checker->vocab();
  const http::Client cli(router, http::ClientOptions::Timeouts(Duration::Seconds(1),
                                                               Duration::Seconds(10)));
  bool served = false;
  for (uint64_t attempt = 0; SecondsSince(t0) < limit_s; ++attempt) {
    if (!served) {
      // A fresh prompt each time: a prefix-cache hit on D would prove nothing.
      Prng prng(Mix64(seed * 0x9E3779B97F4A7C15ull + attempt));
      std::vector<engine::Token> prompt;
      for (int k = 0; k < 48; ++k) {
        prompt.push_back(static_cast<engine::Token>(1 + prng.Uniform(shape.vocab - 1)));
      }
      json body = {{"prompt", prompt}, {"max_tokens", 4}};
      if (checker != nullptr) body["ignore_eos"] = true;
      auto r = cli.Post("/v1/completions", body.dump());
      if (r.ok() && r->status == 200) {
        json j = json::parse(r->body, nullptr, false);
        if (!j.is_discarded() && j.contains("choices")) {
          const auto ids = j["choices"][0].value("token_ids", std::vector<engine::Token>{});
          if (checker != nullptr) {
            const auto vers = j["choices"][0].value("weights_versions", std::vector<uint64_t>{});
            bool exact = false;
            served = ids.size() == 4 && checker->Check(prompt, ids, vers, &exact).empty();
          } else {
            served = ids == engine::Reference(prompt, 1, 4, shape);
          }
        }
      }
    }
    if (served && (!require_kv || LoadsOk(d_url) > base)) return SecondsSince(t0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

// Removes the shared-memory segments a killed engine left
// (/dev/shm/kvrelay-<pid>-*; docs/operations.md, known limits).
void RemoveShmOf(pid_t pid) {
  const std::string prefix = "kvrelay-" + std::to_string(pid) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) {
        unlink(("/dev/shm/" + std::string(e->d_name)).c_str());
      }
    }
    closedir(d);
  }
}

bool IsPartition(FaultKind k) {
  return k == FaultKind::kPartitionHeal || k == FaultKind::kPartitionForever;
}

}  // namespace

const std::vector<ChaosCase>& ChaosCases() {
  static const std::vector<ChaosCase> cases = {
      {"kill-p", FaultKind::kKillP, "SIGKILL of P mid-transfer, restarted on the same ports"},
      {"kill-d", FaultKind::kKillD, "SIGKILL of D mid-load, restarted on the same ports"},
      {"kill-router", FaultKind::kKillRouter, "SIGKILL of the router, restarted on its port"},
      {"partition-heal", FaultKind::kPartitionHeal,
       "P–D partition (nftables drop on P's control and D's data ports) that heals"},
      {"partition-forever", FaultKind::kPartitionForever,
       "P–D partition that does not heal (removed only after the end checks)"},
      {"slow-d", FaultKind::kSlowD,
       "D throttled by SIGSTOP/SIGCONT (reads at a fifth of its speed): backpressure on P"},
      {"fail-writes", FaultKind::kFailWrites,
       "P's KV writes (read mode: D's reads) fail half-way (half of them, after the first MiB)"},
  };
  return cases;
}

ChaosRow RunChaosCase(const ChaosCase& c, const ChaosOptions& o, int index) {
  ChaosRow row;
  row.c = c;
  const Clock::time_point wall0 = Clock::now();
  ChaosMeasure& m = row.measure;
  const bool partition = IsPartition(c.kind);
  const bool tcp_only = partition || c.kind == FaultKind::kSlowD;
  const bool read_mode = o.kv_mode == "read";
  const std::string transport = tcp_only ? "tcp" : o.transport;
  // Bounds from the engines' own timeouts: D gives a pull up at its
  // deadline (abort_timeout) + giveup_grace; P ends a ready send after
  // abort_timeout, and a write in flight when the link went silent ends
  // at the tcp transport's stall timeout (30 s, net/tcp_stream.h).
  row.bounds.load_bound_s = o.abort_timeout_s + o.giveup_grace_s + o.slack_s;
  row.bounds.send_bound_s = o.abort_timeout_s + o.slack_s + (partition ? 30.0 : 0.0);
  row.bounds.recover_bound_s = o.recover_bound_s;
  // Read mode: P holds a lease until D's reads land, D releases it, or it
  // lapses — at most the lease (or an extension) after D's last heartbeat,
  // and D heartbeats no longer than its give-up.
  if (read_mode) {
    row.bounds.lease_bound_s = o.abort_timeout_s + o.giveup_grace_s +
                               std::max(o.lease_s, o.lease_extension_s) + o.slack_s +
                               (partition ? 30.0 : 0.0);
  }
  auto finish = [&] {
    row.verdict = JudgeChaos(m, row.bounds);
    row.wall_s = SecondsSince(wall0);
    return row;
  };
  if (partition) {
    if (std::string why = PortPartition::Unavailable(); !why.empty()) {
      m.skipped = "partition unavailable: " + why;
      return finish();
    }
  }

  ClusterOptions co;
  co.logs = o.logs + "/" + std::to_string(index) + "-" + c.name;
  co.transport = transport;
  co.step_per_token_us = o.step_per_token_us;
  co.engine_args = {"--abort-timeout-s", Arg(o.abort_timeout_s), "--giveup-grace-s",
                    Arg(o.giveup_grace_s), "--peer-dead-after-s", Arg(o.peer_dead_after_s)};
  // A partition stands for P and D on two hosts, where no local lane
  // exists: the control frames must cross the ports the partition cuts, not
  // a Unix socket beside them (docs/wire.md, "The local lane").
  if (partition) co.engine_args.push_back("--no-local-lane");
  if (read_mode) {
    co.engine_args.insert(co.engine_args.end(),
                          {"--kv-mode", "read", "--lease-s", Arg(o.lease_s), "--lease-extension-s",
                           Arg(o.lease_extension_s), "--lease-heartbeat-s",
                           Arg(o.lease_heartbeat_s), "--read-margin-s", Arg(o.read_margin_s)});
  }
  const std::string fail_flag = read_mode ? "--debug-fail-reads-" : "--debug-fail-writes-";
  if (c.kind == FaultKind::kFailWrites) {
    // Only P writes KV (push) and only D reads it (read): each flag bites
    // on one of them.
    co.engine_args.insert(co.engine_args.end(),
                          {fail_flag + "probability", Arg(o.fail_probability),
                           fail_flag + "after-bytes", std::to_string(o.fail_after_bytes),
                           "--debug-fail-writes-seed", std::to_string(o.seed)});
  }
  if (o.stream_chunks) co.p_engine_args = StreamChunksArgs(kStreamChunkTokens);
  co.router_args = {"--upstream-idle-timeout-s", "20"};
  if (read_mode) co.router_args.insert(co.router_args.end(), {"--kv-mode", "read"});
  LoadOptions llama_load;   // --engine llama: its checker
  LocalCluster cluster;
  Status started = SetUpLlamaCluster(o.llama, o.logs, &co, &llama_load);
  if (started.ok()) started = cluster.Start(co);
  if (const Status& s = started; !s.ok()) {
    m.setup_error = s.message();
    cluster.Stop();
    return finish();
  }
  const std::string p_url = cluster.p_urls()[0], d_url = cluster.d_urls()[0];
  const char* names[] = {"prefill0", "decode0", "router"};
  for (const char* n : names) RegisterChildPid(cluster.Pid(n));
  std::vector<pid_t> registered;
  for (const char* n : names) registered.push_back(cluster.Pid(n));

  EngineMonitor monitor({p_url, d_url}, 0.2);
  LoadOptions lo;
  lo.checker = llama_load.checker;
  lo.url = cluster.router_url();
  lo.engines = {p_url, d_url};
  lo.requests = 20000;
  lo.concurrency = o.concurrency;
  lo.duration_s = o.load_s;
  lo.seed = o.seed + static_cast<uint64_t>(index);
  lo.disconnect_fraction = 0;
  lo.progress = false;
  lo.probes = c.kind == FaultKind::kPartitionForever ? 0 : 4;
  lo.request_timeout_s = 60;
  lo.idle_timeout_s = std::max(row.bounds.send_bound_s, row.bounds.lease_bound_s) + 5;
  lo.error_backoff_s = 0.05;
  LoadReport load;
  const Clock::time_point t0 = Clock::now();
  std::thread load_thread([&] { load = RunLoad(lo); });

  // The fault.
  SleepUntil(t0, o.fault_at_s);
  double fault_end_s = -1;
  std::unique_ptr<PortPartition> cut;
  std::vector<pid_t> killed;
  auto kill_restart = [&](const std::string& name, const std::string& url) {
    const std::string live = url.empty() ? "" : " (" + LiveOf(url) + ")";
    const pid_t pid = cluster.Pid(name);
    (void)cluster.Kill(name);
    killed.push_back(pid);
    const double at = SecondsSince(t0);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.down_s));
    const Clock::time_point r0 = Clock::now();
    Status s = cluster.Restart(name, 30);
    if (!s.ok()) m.setup_error = s.message();
    RegisterChildPid(cluster.Pid(name));
    registered.push_back(cluster.Pid(name));
    row.fault_detail = "SIGKILL " + name + " at " + F1(at) + " s" + live + ", down " +
                       F2(o.down_s) + " s, restarted in " + F2(SecondsSince(r0)) + " s";
    fault_end_s = SecondsSince(t0);
  };
  switch (c.kind) {
    case FaultKind::kKillP: kill_restart("prefill0", p_url); break;
    case FaultKind::kKillD: kill_restart("decode0", d_url); break;
    case FaultKind::kKillRouter: kill_restart("router", ""); break;
    case FaultKind::kPartitionHeal:
    case FaultKind::kPartitionForever: {
      std::vector<uint16_t> ports;
      if (auto info = GetJson(p_url, "/kv_info"); info.ok()) {
        for (uint32_t r = 0; r < info->value("tp", 1u); ++r) {
          ports.push_back(static_cast<uint16_t>(info->value("kv_port", 0) + r));
        }
      }
      const auto http_port = [](const std::string& url) {
        return static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
      };
      for (uint16_t p : ListeningTcpPorts(cluster.Pid("decode0"))) {
        if (p != http_port(d_url)) ports.push_back(p);  // D's tcp data-plane receivers
      }
      if (read_mode) {  // D reads from P's receivers
        for (uint16_t p : ListeningTcpPorts(cluster.Pid("prefill0"))) {
          if (p != http_port(p_url)) ports.push_back(p);
        }
        std::sort(ports.begin(), ports.end());
        ports.erase(std::unique(ports.begin(), ports.end()), ports.end());
      }
      const std::string live = "P " + LiveOf(p_url) + ", D " + LiveOf(d_url);
      auto r = PortPartition::Cut(ports);
      const double at = SecondsSince(t0);
      if (!r.ok()) {
        m.setup_error = r.status().message();
        break;
      }
      cut = std::move(*r);
      std::string list;
      for (uint16_t p : ports) list += (list.empty() ? "" : ",") + std::to_string(p);
      row.fault_detail = "tcp ports " + list + " dropped at " + F1(at) + " s (" + live + ")";
      if (c.kind == FaultKind::kPartitionHeal) {
        std::this_thread::sleep_for(std::chrono::duration<double>(o.partition_s));
        if (!cut->Heal()) m.setup_error = "nft could not remove the partition";
        fault_end_s = SecondsSince(t0);
        row.fault_detail += ", healed at " + F1(fault_end_s) + " s";
      } else {
        row.fault_detail += ", never healed during the case";
      }
      break;
    }
    case FaultKind::kSlowD: {
      const pid_t d = cluster.Pid("decode0");
      const std::string live = LiveOf(d_url);
      const double at = SecondsSince(t0);
      const Clock::time_point until =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(o.slow_s));
      uint32_t cycles = 0;
      while (Clock::now() < until) {
        kill(d, SIGSTOP);
        std::this_thread::sleep_for(std::chrono::duration<double>(o.slow_stop_ms / 1e3));
        kill(d, SIGCONT);
        std::this_thread::sleep_for(std::chrono::duration<double>(o.slow_run_ms / 1e3));
        ++cycles;
      }
      kill(d, SIGCONT);
      fault_end_s = SecondsSince(t0);
      row.fault_detail = "D stopped " + F1(o.slow_stop_ms) + " ms of every " +
                         F1(o.slow_stop_ms + o.slow_run_ms) + " ms from " + F1(at) + " s to " +
                         F1(fault_end_s) + " s (" + std::to_string(cycles) + " cycles; " +
                         live + " at the start)";
      break;
    }
    case FaultKind::kFailWrites:
      row.fault_detail = "P and D started with " + fail_flag + "probability " +
                         F2(o.fail_probability) + " " + fail_flag + "after-bytes " +
                         std::to_string(o.fail_after_bytes) + "; the fault never ends";
      m.recover_expected = false;
      break;
  }
  m.cut_off_allowed = c.kind == FaultKind::kKillRouter;
  if (fault_end_s >= 0 && m.setup_error.empty()) {
    m.recover_s = MeasureRecovery(cluster.router_url(), d_url, true, o.recover_bound_s + 5,
                                  o.seed * 1000 + static_cast<uint64_t>(index), lo.checker.get());
  }
  load_thread.join();
  monitor.Stop();
  m.load = load;
  for (const auto& [name, url] : {std::pair<std::string, std::string>{"prefill0", p_url},
                                  {"decode0", d_url}}) {
    // A request that just ended may still hold its blocks for a moment
    // (P's send ends when D's pull is answered): wait, bounded, for idle.
    EngineEnd e = ReadEngineEnd(name, url);
    for (const Clock::time_point s0 = Clock::now();
         !(e.reachable && e.idle && e.blocks_used == 0 && e.live_sends == 0 &&
           e.live_loads == 0 && e.live_leases == 0) &&
         SecondsSince(s0) < std::max(row.bounds.send_bound_s, row.bounds.lease_bound_s);) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      e = ReadEngineEnd(name, url);
    }
    const EngineMonitor::Worst w = monitor.WorstOf(url);
    e.max_send_age_s = std::max(e.max_send_age_s, w.send_s);
    e.max_load_age_s = std::max(e.max_load_age_s, w.load_s);
    e.max_lease_age_s = std::max(e.max_lease_age_s, w.lease_s);
    e.restarted = (c.kind == FaultKind::kKillP && name == "prefill0") ||
                  (c.kind == FaultKind::kKillD && name == "decode0");
    m.engines.push_back(e);
    if (partition && e.lanes_opened > 0 && m.setup_error.empty()) {
      m.setup_error = name + " opened a local lane, which the partition does not cut";
    }
  }
  if (c.kind == FaultKind::kPartitionForever && cut != nullptr) {
    // The end checks ran under the partition; now remove it and see the
    // cluster serve KV hand-offs again.
    if (!cut->Heal()) m.setup_error = "nft could not remove the partition";
    m.recover_s = MeasureRecovery(cluster.router_url(), d_url, true, o.recover_bound_s + 5,
                                  o.seed * 1000 + static_cast<uint64_t>(index), lo.checker.get());
    row.fault_detail += "; removed after the checks";
  }
  cut.reset();
  bool clean = false;
  const std::string how = cluster.Stop(&clean);
  if (!clean) m.shutdown_error = how;
  for (pid_t p : registered) UnregisterChildPid(p);
  for (pid_t p : killed) RemoveShmOf(p);
  return finish();
}

}  // namespace kvrelay::cli
