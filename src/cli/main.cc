// kvrelay — one binary, subcommands. Each subcommand lives in its own
// cli/<name>_command.cc and registers itself here.
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace {

// CLI11 answers a word that names no command ("kvrelay serv", "kvrelay
// bench lod") with "A subcommand is required". Name the word and the
// commands there instead; -1 if that is not what went wrong.
int UnknownCommand(const CLI::App& app) {
  const CLI::App* at = &app;
  std::string path = "kvrelay";
  while (!at->get_subcommands().empty()) {
    at = at->get_subcommands().front();
    path += " " + at->get_name();
  }
  const std::vector<std::string> rest = at->remaining();
  const std::vector<const CLI::App*> commands =
      at->get_subcommands([](const CLI::App*) { return true; });
  if (rest.empty() || rest.front().starts_with('-') || commands.empty()) return -1;
  std::string names;
  for (const CLI::App* c : commands) names += (names.empty() ? "" : ", ") + c->get_name();
  std::fprintf(stderr, "%s: '%s' is not a command; the commands are %s (see %s --help)\n",
               path.c_str(), rest.front().c_str(), names.c_str(), path.c_str());
  return static_cast<int>(CLI::ExitCodes::ExtrasError);
}

}  // namespace

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (const int code = UnknownCommand(app); code >= 0) return code;
    return app.exit(e);
  }
  return kvrelay::cli::ExitCode();
}
