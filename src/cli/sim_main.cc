// kvrelay_sim_cli — `kvrelay sim` alone: the same subcommand (sim_command.cc)
// behind a main of its own, built in the ASan tree only. There the
// simulator's CTest entries (tests/CMakeLists.txt) are the only ones that
// run a kvrelay binary, so the rest of the CLI, compiled under ASan, would
// be compiled for nothing: its three batches took 112 s of the ASan tree's
// cold build (ninja's job times at -j 2; docs/performance.md, "CI and the
// first command").
#include <CLI/CLI.hpp>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvrelay_sim_cli: the `kvrelay sim` subcommand alone (the ASan tree's build)"};
  app.require_subcommand(1);
  kvrelay::cli::RegisterSim(app);
  CLI11_PARSE(app, argc, argv);
  return kvrelay::cli::ExitCode();
}
