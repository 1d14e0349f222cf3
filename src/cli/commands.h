// commands.h — the subcommands of the kvrelay binary.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "bench/load_gen.h"

namespace kvrelay::cli {

void RegisterBench(CLI::App& app);
void RegisterSim(CLI::App& app);
void RegisterServe(CLI::App& app);
void RegisterRouter(CLI::App& app);

// `bench load`'s flags and runner, shared with `demo`.
void RegisterLoadOptions(CLI::App* bench);
void RegisterTransferBench(CLI::App* bench);
void RegisterTtftBench(CLI::App* bench);
void RegisterHttpBench(CLI::App* bench);
void RegisterLlamaBench(CLI::App* bench);
void AddLoadFlags(CLI::App* cmd, LoadOptions* o, std::vector<std::string>* controls,
                  std::string* json_path);
int RunLoadCommand(const LoadOptions& base, const std::vector<std::string>& controls,
                   const std::string& json_path);
void RegisterDemo(CLI::App& app);
void RegisterMatrix(CLI::App& app);
void RegisterChaos(CLI::App& app);
void RegisterMakeModel(CLI::App& app);

// The process exit code chosen by the subcommand that ran (0 by default).
int ExitCode();
void SetExitCode(int code);

}  // namespace kvrelay::cli
