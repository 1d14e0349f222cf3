// kvrelay — one binary, subcommands. Each subcommand lives in its own
// cli/<name>_command.cc and registers itself here.
#include <CLI/CLI.hpp>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "kvrelay: hands KV cache from prefill engines to decode engines, and "
      "never wedges, leaks or double-frees doing it."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
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
