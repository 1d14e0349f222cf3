#include <cstdio>
#include <memory>

#include "bench/core_bench.h"
#include "bench/load_gen.h"
#include "cli/commands.h"

namespace kvrelay::cli {

namespace {
int g_exit_code = 0;
}  // namespace

int ExitCode() { return g_exit_code; }
void SetExitCode(int code) { g_exit_code = code; }

void RegisterBench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto opt = std::make_shared<CoreBenchOptions>();
  auto* core = bench->add_subcommand(
      "core",
      "Send-table inputs per second with few and many transfers in flight, "
      "and their ratio (the O(1) claim as a number)");
  core->add_option("--in-flight", opt->in_flight,
                   "Transfers held in flight, one measurement each")
      ->capture_default_str();
  core->add_option("--ops", opt->ops_per_round, "Table inputs per round")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{4}, uint64_t{1} << 40));
  core->add_option("--rounds", opt->rounds, "Rounds; the best is kept")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  core->add_option("--seed", opt->seed, "Seed for transfer ids")->capture_default_str();
  core->callback([opt] {
    std::printf("kvrelay bench core: %llu inputs per round, best of %d, seed %llu\n",
                static_cast<unsigned long long>(opt->ops_per_round), opt->rounds,
                static_cast<unsigned long long>(opt->seed));
    std::fflush(stdout);
    auto rows = RunCoreBench(*opt);
    std::fputs(FormatCoreBench(rows).c_str(), stdout);
  });
  RegisterLoadOptions(bench);
}

void AddLoadFlags(CLI::App* cmd, LoadOptions* o, std::vector<std::string>* controls,
                  std::string* json_path) {
  cmd->add_option("--requests,-n", o->requests, "requests to send")->capture_default_str();
  cmd->add_option("--concurrency,-c", o->concurrency, "requests in flight at once")
      ->capture_default_str();
  cmd->add_option("--prompt-tokens-min", o->prompt_min, "shortest prompt")->capture_default_str();
  cmd->add_option("--prompt-tokens-max", o->prompt_max, "longest prompt")->capture_default_str();
  cmd->add_option("--output-tokens-min", o->output_min, "shortest output")->capture_default_str();
  cmd->add_option("--output-tokens-max", o->output_max, "longest output")->capture_default_str();
  cmd->add_option("--disconnect-fraction", o->disconnect_fraction,
                  "fraction of clients that disconnect at a random moment (0..1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--control", *controls,
                  "lifecycle call during the load, e.g. \"pause:mode=abort,target=p@3s\" "
                  "(target p|d|all; pause/sleep are followed by resume/wake_up after "
                  "resume_after_ms=200)");
  cmd->add_option("--seed", o->seed, "seed for prompts, lengths and disconnects")
      ->capture_default_str();
  cmd->add_option("--probes", o->probes, "probe requests checked against Reference afterwards")
      ->capture_default_str();
  cmd->add_option("--request-timeout-s", o->request_timeout_s, "a request hung longer failed")
      ->capture_default_str();
  cmd->add_option("--idle-timeout-s", o->idle_timeout_s,
                  "how long engines may take to go idle after the load")
      ->capture_default_str();
  cmd->add_option("--json", *json_path, "also write the report as JSON to this file");
}

int RunLoadCommand(const LoadOptions& base, const std::vector<std::string>& controls,
                   const std::string& json_path) {
  LoadOptions o = base;
  for (const std::string& c : controls) {
    Result<ControlCall> call = ParseControlCall(c);
    if (!call.ok()) {
      std::fprintf(stderr, "kvrelay: %s\n", call.status().message().c_str());
      return 2;
    }
    o.controls.push_back(*call);
  }
  if (o.prompt_min == 0 || o.prompt_min > o.prompt_max || o.output_min == 0 ||
      o.output_min > o.output_max || o.requests == 0 || o.concurrency == 0) {
    std::fprintf(stderr, "kvrelay: bad lengths or counts (min <= max, all >= 1)\n");
    return 2;
  }
  LoadReport r = RunLoad(o);
  std::fputs(FormatLoadReport(r).c_str(), stdout);
  std::fflush(stdout);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "kvrelay: cannot write %s\n", json_path.c_str());
      return 1;
    }
    const std::string j = LoadReportJson(r);
    std::fwrite(j.data(), 1, j.size(), f);
    std::fclose(f);
  }
  return r.passed() ? 0 : 1;
}

void RegisterLoadOptions(CLI::App* bench) {
  auto o = std::make_shared<LoadOptions>();
  auto controls = std::make_shared<std::vector<std::string>>();
  auto json_path = std::make_shared<std::string>();
  auto* load = bench->add_subcommand(
      "load",
      "Load an OpenAI-compatible endpoint (the router or an engine) and check that nothing "
      "was lost: outputs, idle engines, empty pools, probes");
  load->add_option("--url", o->url, "endpoint to load")->capture_default_str();
  load->add_option("--engine", o->engines,
                   "engine URLs to check for idle (default: the endpoint's /engines)");
  AddLoadFlags(load, o.get(), controls.get(), json_path.get());
  load->callback([o, controls, json_path] {
    SetExitCode(RunLoadCommand(*o, *controls, *json_path));
  });
}

}  // namespace kvrelay::cli
