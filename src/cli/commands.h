// commands.h — the subcommands of the kvrelay binary.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "base/result.h"
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
// The load `base` and its --control calls describe, ready to run: each
// min at most its max, the auth token read, the calls parsed; else what is
// wrong, naming the flag. Commands that start a cluster call it first.
Result<LoadOptions> PrepareLoad(const LoadOptions& base,
                                const std::vector<std::string>& controls);
// Runs a prepared load, prints its report (and writes it to `json_path`,
// if given); the exit code: 0 if it passed.
int RunPreparedLoad(const LoadOptions& o, const std::string& json_path);
void RegisterDemo(CLI::App& app);
void RegisterMatrix(CLI::App& app);
void RegisterChaos(CLI::App& app);
void RegisterMakeModel(CLI::App& app);

// The names a flag of each kind takes. Checked with ->check(...), a flag
// refuses any other value as the command line is parsed, before anything
// starts ("--transport: foo not in {shm,tcp,ucx}"; --help shows the set).
// Each list is what the value's parser accepts (net::ParseTransport,
// engine::ModelShapeByName, ParseKvMode, ...); tests/bad_flags.sh runs every
// command with a value outside it.
inline CLI::IsMember OneOf(std::vector<std::string> names) { return CLI::IsMember(names); }
inline CLI::IsMember TransportNames() { return OneOf({"shm", "tcp", "ucx"}); }
inline CLI::IsMember ModelShapeNames() { return OneOf({"tiny", "small", "8b"}); }
inline CLI::IsMember KvModeNames() { return OneOf({"push", "read"}); }
inline CLI::IsMember EngineNames() { return OneOf({"emulated", "llama"}); }
inline CLI::IsMember LoadPolicyNames() { return OneOf({"recompute", "fail"}); }
// A number above 0 (Positive) or at least 0 (NonNegative), and at most a
// billion (seconds: 31 years, which still fit a Duration's int64 ns); any
// other is refused as "--flag: -1 is below 0" (CLI11's own checks name a
// range up to the largest double, and take "inf").
inline CLI::Validator NumberCheck(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& value) -> std::string {
        double x = 0;
        if (!CLI::detail::lexical_cast(value, x) || !std::isfinite(x)) {
          return value + " is not a number";
        }
        if (x > 1e9) return value + " is above 1000000000";
        if (allow_zero ? x >= 0 : x > 0) return "";
        return value + (allow_zero ? " is below 0" : " is not above 0");
      },
      allow_zero ? "≥ 0" : "> 0");
}
inline CLI::Validator Positive() { return NumberCheck(false); }
inline CLI::Validator NonNegative() { return NumberCheck(true); }
// Tensor-parallel ranks an engine may run (serve --tp; the clusters' --p-tp, --d-tp).
inline CLI::IsMember TpSizes() { return CLI::IsMember(std::vector<uint32_t>{1, 2, 4}); }

// The process exit code chosen by the subcommand that ran (0 by default).
int ExitCode();
void SetExitCode(int code);

}  // namespace kvrelay::cli
