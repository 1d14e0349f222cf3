// commands.h — the subcommands of the kvrelay binary.
#pragma once

#include <CLI/CLI.hpp>

namespace kvrelay::cli {

void RegisterBench(CLI::App& app);
void RegisterSim(CLI::App& app);
void RegisterServe(CLI::App& app);

// The process exit code chosen by the subcommand that ran (0 by default).
int ExitCode();
void SetExitCode(int code);

}  // namespace kvrelay::cli
