#include <cstdio>
#include <memory>

#include "bench/core_bench.h"
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
}

}  // namespace kvrelay::cli
