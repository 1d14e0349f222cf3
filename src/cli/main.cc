// kvrelay — one binary, subcommands. Each subcommand lives in its own
// cli/<name>_command.cc and registers itself here.
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "kvrelay: hands KV cache from prefill engines to decode engines, and "
      "never wedges, leaks or double-frees doing it."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  // The processes demo, matrix, chaos and the benches start (LocalCluster)
  // must not outlive them, even when they die without stopping their
  // children: the kernel sends SIGTERM (a clean drain) when the parent goes.
  app.add_option_function<pid_t>(
         "--exit-with-parent",
         [](pid_t parent) {
           if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) {
             std::fprintf(stderr, "kvrelay: parent %d is gone; not starting\n",
                          static_cast<int>(parent));
             std::exit(1);
           }
         },
         "stop (SIGTERM) when process PID, this one's parent, exits (given before the "
         "subcommand; the cluster commands pass it to the processes they start)")
      ->check(kvrelay::cli::Positive());
  kvrelay::cli::RegisterBench(app);
  kvrelay::cli::RegisterSim(app);
  kvrelay::cli::RegisterServe(app);
  kvrelay::cli::RegisterRouter(app);
  kvrelay::cli::RegisterDemo(app);
  kvrelay::cli::RegisterMatrix(app);
  kvrelay::cli::RegisterChaos(app);
  kvrelay::cli::RegisterMakeModel(app);
  CLI11_PARSE(app, argc, argv);
  return kvrelay::cli::ExitCode();
}
