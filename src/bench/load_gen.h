// load_gen.h — `kvrelay bench load`: a load against an OpenAI-compatible
// endpoint (the router, or one engine), in the spirit of vLLM's serving
// benchmark, that also proves nothing was lost.
//
// N requests at concurrency C, prompt and output lengths drawn from a
// seeded PRNG, a fraction of clients that disconnect at a random moment,
// and lifecycle calls landed at chosen times (ControlCall). Every request
// streams (SSE), so time to first token is measured as a client sees it.
//
// At the end it checks, and reports each check:
//   - the load finished: every request ended with output or a clean error
//     (an HTTP error with a JSON body, or a finish_reason of abort/error),
//     none hung past its timeout, none was cut off without an error;
//   - every output is the model's output, token by token (CheckOutput);
//   - every engine went idle with its pool empty (prefix cache aside);
//   - probe requests sent afterwards give exactly Reference(...).
//
// Threading: RunLoad runs client threads and a control thread and joins
// them before it returns.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/control_call.h"
#include "engine/model.h"

namespace kvrelay {

// How a load judges its outputs when the engines serve another model than
// the emulated one (llama.cpp: cli/llama_checker.h). Called from every
// client thread at once.
class OutputChecker {
 public:
  virtual ~OutputChecker() = default;
  // Prompt token ids are drawn below it.
  virtual uint32_t vocab() const = 0;
  // "" if `out` (token i computed under versions[i]) is an acceptable
  // output for `prompt` (asked with temperature 1, seed 0, ignore_eos);
  // else why. *whole_exact: equal to the reference token for token.
  virtual std::string Check(std::span<const engine::Token> prompt,
                            std::span<const engine::Token> out,
                            std::span<const uint64_t> versions, bool* whole_exact) = 0;
  // One line on what it accepted beyond exact outputs, for the report.
  virtual std::string Summary() const { return ""; }
  // The prompt ids of a chat of one user message `text`, laid out as the
  // engines lay it out (their model's chat template); nullopt: this checker
  // cannot say, and the load sends no chats.
  virtual std::optional<std::vector<engine::Token>> ChatPrompt(std::string_view text) const {
    (void)text;
    return std::nullopt;
  }
};

struct LoadOptions {
  std::string url = "http://127.0.0.1:8000";
  std::vector<std::string> engines;   // checked for idle; default: url's /engines
  uint32_t requests = 600;
  uint32_t concurrency = 96;
  uint32_t prompt_min = 16, prompt_max = 256;     // tokens
  uint32_t output_min = 4, output_max = 48;       // tokens
  double disconnect_fraction = 0.1;
  // Fraction of requests sent to /v1/chat/completions as a chat of one user
  // message (its words drawn as a prompt's are; max_completion_tokens), the
  // rest to /v1/completions; a chat's output is checked against its laid-out
  // prompt's ids (server::ChatPromptText, or the checker's ChatPrompt).
  double chat_fraction = 0.25;
  std::vector<ControlCall> controls;
  uint64_t seed = 1;
  uint32_t probes = 8;
  double request_timeout_s = 120;
  double idle_timeout_s = 60;
  // > 0: start no request after this long (`kvrelay chaos`: a load that
  // spans a fault); LoadReport::requests is then the number started.
  double duration_s = 0;
  // A client whose request ended with an error (or no response) waits
  // this long before its next one, as a real client backs off; 0: at once.
  double error_backoff_s = 0;
  bool progress = true;
  std::string auth_token;   // signs admin calls and /debug reads
  std::string auth_token_file;  // --auth-token-file; RunLoadCommand reads it into auth_token
  // Null: outputs are the emulated model's (CheckOutput, Reference, the
  // shape /kv_info names). Set: requests ask ignore_eos (outputs of
  // max_tokens), outputs and probes are judged by it.
  std::shared_ptr<OutputChecker> checker;
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
  size_t n = 0;
};

struct ControlOutcome {
  std::string call;       // as given
  std::string engine;     // url
  int http_status = 0;
  bool ok = false;
  double latency_s = 0;
  double at_s = 0;        // when it was sent, from the load's start
  std::string detail;
};

struct CheckOutcome {
  std::string name;
  bool ok = false;
  std::string detail;
};

struct LoadReport {
  std::string url;
  uint64_t seed = 0;
  uint32_t requests = 0, concurrency = 0;
  uint32_t ok = 0;                  // output, checked
  uint32_t clean_errors = 0;        // HTTP error or finish_reason abort/error
  uint32_t disconnected = 0;        // the client left on purpose
  uint32_t chats = 0;               // of the requests started, sent as chats
  uint32_t failed = 0;              // hung, cut off, malformed, wrong output
  uint32_t cut_off = 0;             // of `failed`: no response, or the stream cut off
                                    // before [DONE] (what a killed server does)
  std::vector<std::string> failures;  // the first few, with why
  double duration_s = 0;
  double requests_per_s = 0, output_tokens_per_s = 0;
  uint64_t output_tokens = 0;
  Percentiles ttft_s, tpot_s, e2e_s;
  std::vector<ControlOutcome> controls;
  std::vector<CheckOutcome> checks;
  std::vector<std::pair<std::string, int64_t>> blocks_left;  // per engine, after the load
  uint32_t probes_ok = 0, probes = 0;
  int64_t whole_exact = -1;         // with a checker: ok outputs equal to its reference
  std::string checker_summary;      // with a checker: its Summary()
  bool passed() const;
};

LoadReport RunLoad(const LoadOptions& options);
std::string FormatLoadReport(const LoadReport& report);
std::string LoadReportJson(const LoadReport& report);

}  // namespace kvrelay
