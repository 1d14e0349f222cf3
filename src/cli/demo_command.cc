// `kvrelay demo`: the main job. A P engine, a D engine and the router on
// loopback (child processes, logs in a folder), a load through the router
// with client disconnects and a lifecycle call landing mid-run, the report,
// and a clean shutdown of everything. With --rounds, the load again on the
// same cluster with every other lifecycle call, watching for leaks
// (RunRounds).

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <memory>

#include "bench/control_call.h"
#include "cli/commands.h"
#include "cli/llama_cluster.h"
#include "cli/local_cluster.h"
#include "cli/proc_sample.h"

namespace kvrelay::cli {
namespace {

struct DemoOptions {
  std::string logs;
  std::string transport = "shm";
  std::string shape = "tiny";
  uint32_t p_tp = 1, d_tp = 1;
  uint32_t num_blocks = 0;
  double step_per_token_us = 20;
  int control_nice = 0;
  int control_slice_us = -1;
  LlamaClusterFlags llama;           // --engine, --model, --threads
  bool stream_chunks = false;        // P streams chunks (StreamChunksArgs)
  uint32_t rounds = 1;               // loads against the one cluster (RunRounds)
};

// Open files and threads a process may gain after the first two rounds of
// `--rounds` before it counts as growing (connections opened late, a
// worker started on demand).
constexpr int kFdSlack = 8;
constexpr int kThreadSlack = 4;

// The call round `round` (2, 3, ...) of `demo --rounds` makes, in turn:
// every kind of lifecycle call, on P, D or both. update_weights goes to the
// next version each time; llama.cpp engines have files for version 2 only,
// so they get it once.
std::string RoundCall(uint32_t round, bool llama) {
  static const char* kCalls[] = {"sleep:level=1,target=d", "reset_prefix_cache:target=all",
                                 "pause:mode=keep,target=d", "update_weights",
                                 "pause:mode=wait,clear_cache=true,target=p",
                                 "sleep:level=2,target=p", "release_kv_cache_memory:target=d",
                                 "pause:mode=abort,target=p"};
  constexpr uint32_t n = sizeof kCalls / sizeof kCalls[0];
  const uint32_t i = (round - 2) % n;
  std::string call = kCalls[i];
  if (call == "update_weights") {
    const uint32_t version = 2 + (round - 2) / n;
    call = llama && version > 2 ? "reset_prefix_cache:target=p"
                                : "update_weights:mode=wait,version=" + std::to_string(version) +
                                      ",target=all";
  }
  return call + "@0.5s";
}

// Rounds 2..N of `demo --rounds`: the load again on the same cluster, each
// with the next RoundCall, one line each; after every round (the first
// included, in `samples`) what P, D and the router hold. Fails if a round
// fails, or if a process's open files or threads at the end exceed the
// most of its first two rounds by the slack: a leak of either grows with
// the rounds. RSS is printed, not judged (the allocator's arenas grow and
// settle; a heap profile of P over 28,000 requests peaked at 4.4 MB).
int RunRounds(const DemoOptions& d, LoadOptions o, LocalCluster& cluster) {
  const char* names[] = {"prefill0", "decode0", "router"};
  std::vector<std::vector<ProcSample>> samples(3);
  const auto sample = [&](uint32_t round, const std::string& what) {
    std::string line = "  round " + std::to_string(round) + "/" + std::to_string(d.rounds) +
                       " " + what;
    for (int i = 0; i < 3; ++i) {
      const ProcSample s = SampleProc(cluster.Pid(names[i]));
      samples[i].push_back(s);
      char buf[128];
      std::snprintf(buf, sizeof buf, " | %s %.1f MiB, %d fds, %d threads", names[i], s.rss_mib,
                    s.fds, s.threads);
      line += buf;
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  sample(1, "(the load above)");
  o.progress = false;
  for (uint32_t round = 2; round <= d.rounds; ++round) {
    const std::string call = RoundCall(round, d.llama.engine == "llama");
    Result<ControlCall> parsed = ParseControlCall(call);
    if (!parsed.ok()) return 2;  // a bug in RoundCall
    o.controls = {*parsed};
    o.seed = o.seed + 1;
    const LoadReport r = RunLoad(o);
    char what[160];
    std::snprintf(what, sizeof what, "%s: %s (%u ok, %u clean errors, %u failed)", call.c_str(),
                  r.passed() ? "PASS" : "FAIL", r.ok, r.clean_errors, r.failed);
    sample(round, what);
    if (!r.passed()) {
      std::fputs(FormatLoadReport(r).c_str(), stdout);
      return 1;
    }
  }
  bool flat = true;
  for (int i = 0; i < 3 && d.rounds >= 3; ++i) {
    const std::vector<ProcSample>& v = samples[i];
    const int fds0 = std::max(v[0].fds, v[1].fds), th0 = std::max(v[0].threads, v[1].threads);
    if (v.back().fds > fds0 + kFdSlack || v.back().threads > th0 + kThreadSlack) {
      std::printf("  FAIL: %s grew from %d open files and %d threads (rounds 1-2) to %d and %d\n",
                  names[i], fds0, th0, v.back().fds, v.back().threads);
      flat = false;
    }
  }
  std::printf("  rounds: %u of %u passed; open files and threads %s; RSS MiB first → last: "
              "prefill0 %.1f → %.1f, decode0 %.1f → %.1f, router %.1f → %.1f\n",
              d.rounds, d.rounds, flat ? "flat" : "GREW", samples[0].front().rss_mib,
              samples[0].back().rss_mib, samples[1].front().rss_mib, samples[1].back().rss_mib,
              samples[2].front().rss_mib, samples[2].back().rss_mib);
  return flat ? 0 : 1;
}

int RunDemo(const DemoOptions& d, const LoadOptions& load_base,
            const std::vector<std::string>& controls, const std::string& json_path) {
  Result<LoadOptions> ready = PrepareLoad(load_base, controls);
  if (!ready.ok()) {
    std::fprintf(stderr, "kvrelay demo: %s\n", ready.status().message().c_str());
    return 2;
  }
  ClusterOptions c;
  c.logs = d.logs.empty() ? "/tmp/kvrelay-demo-" + std::to_string(std::time(nullptr)) : d.logs;
  c.transport = d.transport;
  c.shape = d.shape;
  c.p_tp = d.p_tp;
  c.d_tp = d.d_tp;
  c.num_blocks = d.num_blocks;
  c.step_per_token_us = d.step_per_token_us;
  c.control_nice = d.control_nice;
  c.control_slice_us = d.control_slice_us;
  c.auth_token_file = load_base.auth_token_file;  // engines and router get it too
  if (d.stream_chunks) {
    if (d.llama.engine == "llama") {
      std::fprintf(stderr, "kvrelay demo: --stream-chunks: llama.cpp engines hand their KV off "
                           "whole\n");
      return 2;
    }
    c.p_engine_args = StreamChunksArgs(kStreamChunkTokens);
  }
  LoadOptions o = *ready;
  std::printf("kvrelay demo: 1P1D on loopback, transport %s, %s %s, P tp %u, D tp %u%s, "
              "logs in %s\n",
              c.transport.c_str(), d.llama.engine == "llama" ? "llama.cpp model" : "model shape",
              d.llama.engine == "llama" ? (d.llama.model.empty() ? "made" : d.llama.model.c_str())
                                        : c.shape.c_str(),
              c.p_tp, c.d_tp,
              d.stream_chunks
                  ? (", P streaming chunks of " + std::to_string(kStreamChunkTokens) + " tokens")
                        .c_str()
                  : "",
              c.logs.c_str());
  if (Status s = SetUpLlamaCluster(d.llama, c.logs, &c, &o); !s.ok()) {
    std::fprintf(stderr, "kvrelay demo: %s\n", s.message().c_str());
    return 2;
  }
  std::fflush(stdout);
  LocalCluster cluster;
  if (Status s = cluster.Start(c); !s.ok()) {
    std::fprintf(stderr, "kvrelay demo: %s\n", s.message().c_str());
    return 1;
  }
  std::printf("  prefill %s, decode %s, router %s\n", cluster.p_urls()[0].c_str(),
              cluster.d_urls()[0].c_str(), cluster.router_url().c_str());
  std::fflush(stdout);
  o.url = cluster.router_url();
  int rc = RunPreparedLoad(o, json_path);
  if (d.stream_chunks) {
    // Streaming asked for and nothing streamed would be a demo of nothing.
    const double chunks = MetricSample(cluster.p_urls()[0], "kvrelay_prefill_chunks_streamed_total");
    const double writes = MetricSample(cluster.p_urls()[0], "kvrelay_chunk_writes_total");
    std::printf("  P streamed %.0f prompt chunks while prefilling and wrote %.0f parts of pulls\n",
                chunks, writes);
    if (!(chunks > 0)) {
      std::printf("  FAIL: --stream-chunks, and P handed no chunk over (see its log)\n");
      if (rc == 0) rc = 1;
    }
  }
  if (rc == 0 && d.rounds > 1) rc = RunRounds(d, o, cluster);
  bool clean = false;
  const std::string how = cluster.Stop(&clean);
  std::printf("  shutdown: %s%s\n  logs: %s/{prefill0,decode0,router}.log\n", how.c_str(),
              clean ? "all clean" : "NOT all clean", c.logs.c_str());
  return rc != 0 ? rc : (clean ? 0 : 1);
}

}  // namespace

void RegisterDemo(CLI::App& app) {
  auto d = std::make_shared<DemoOptions>();
  auto o = std::make_shared<LoadOptions>();
  auto controls = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"pause:mode=abort,target=p@3s"});
  auto json_path = std::make_shared<std::string>();
  o->requests = 600;
  o->concurrency = 96;
  o->disconnect_fraction = 0.1;
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "The main job: start a P engine, a D engine and the router on loopback, run a load "
      "through them with client disconnects and a lifecycle call (default: pause abort on P "
      "at 3 s, then resume), print the report, shut everything down");
  cmd->add_option("--logs", d->logs, "folder for the processes' logs (default /tmp/kvrelay-demo-<time>)");
  cmd->add_option("--transport", d->transport, "data plane")
      ->check(TransportNames())
      ->capture_default_str();
  cmd->add_option("--model-shape", d->shape, "model shape of the KV")
      ->check(ModelShapeNames())
      ->capture_default_str();
  cmd->add_option("--p-tp", d->p_tp, "prefill tp")->check(TpSizes())->capture_default_str();
  cmd->add_option("--d-tp", d->d_tp, "decode tp")->check(TpSizes())->capture_default_str();
  cmd->add_option("--num-blocks", d->num_blocks, "KV blocks per engine (default: serve's)");
  cmd->add_option("--control-nice", d->control_nice,
                  "the engines' --control-nice: aborts, lifecycle calls and answers preempt "
                  "bulk work, at the cost of TTFT under load (docs/performance.md; 0: not "
                  "passed; without CAP_SYS_NICE the engines log it and go on)")
      ->check(CLI::Range(-20, 0))
      ->capture_default_str();
  cmd->add_option("--control-slice-us", d->control_slice_us,
                  "the engines' --control-slice-us (0: the kernel's default slice; -1: not "
                  "passed, serve's default)")
      ->check(CLI::Range(-1, 100000));
  cmd->add_option("--step-per-token-us", d->step_per_token_us, "modelled compute per token")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_flag("--stream-chunks", d->stream_chunks,
                "P streams each finished prefill chunk (32 tokens, P's --max-batch-tokens) to "
                "D while it prefills (serve's --stream-chunks); emulated engines only");
  cmd->add_option("--rounds", d->rounds,
                  "run the load this many times on the one cluster, each later round with the "
                  "next lifecycle call of every kind (sleep 1 and 2, reset_prefix_cache, pause "
                  "keep, wait and abort, update_weights, release_kv_cache_memory) at 0.5 s; "
                  "print what P, D and the router hold after each, and fail if their open "
                  "files or threads grow")
      ->check(CLI::Range(1u, 100000u))
      ->capture_default_str();
  AddLlamaClusterFlags(cmd, &d->llama);
  AddLoadFlags(cmd, o.get(), controls.get(), json_path.get());
  cmd->callback([d, o, controls, json_path] {
    SetExitCode(RunDemo(*d, *o, *controls, *json_path));
  });
}

}  // namespace kvrelay::cli
