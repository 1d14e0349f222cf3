// completion_request.h — ParseCompletionRequest: the body of
// POST /v1/completions, checked and turned into what the engine needs.
//
// Why: the HTTP handler must stay a thin shell; every rule about what a
// client may send lives here, where a table of bodies can test it without a
// socket. The accepted shape is OpenAI's /v1/completions, one prompt per
// request, plus vLLM's `kv_transfer_params` (docs/http.md is the reference
// for users and must agree with this file).
//
// Errors are Statuses whose message is meant for the client as is:
//   kInvalidArgument    malformed body, wrong type, a rule broken  → HTTP 400
//   kOutOfRange         a number beyond the model's limits (token id not in
//                       the vocabulary, prompt or max_tokens too long) → 400
//   kResourceExhausted  body longer than max_body_bytes           → HTTP 413
// HttpStatusForParseError() is that table.
//
// Thread safety: pure functions and value types; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/result.h"
#include "base/status.h"
#include "core/connector_scheduler.h"
#include "engine/compute_model.h"
#include "engine/model.h"
#include "server/text_codec.h"

namespace kvrelay::server {

// What the server allows; fixed for its life.
struct ParseLimits {
  std::string model_name;            // "model", if sent, must equal this
  uint32_t vocab = 32000;            // REQUIRES: >= 2
  uint32_t max_context = 4096;       // prompt + max_tokens <= this
  size_t max_body_bytes = 1 << 20;
  uint32_t max_prompt_tokens = 4095;
  // Text ↔ ids (text_codec.h); null: the toy tokenizer over `vocab`. Not
  // owned: the server's, alive as long as the limits are used.
  const TextCodec* codec = nullptr;
};

// Limits for serving `shape`: its name, vocab and context; prompts up to
// max_context - 1 tokens (room for one output token).
ParseLimits ParseLimitsFor(const engine::ModelShape& shape, size_t max_body_bytes);

inline constexpr size_t kMaxRequestIdChars = 128;
inline constexpr size_t kMaxRemoteHostChars = 255;
inline constexpr uint32_t kDefaultMaxTokens = 16;

struct CompletionRequest {
  std::string request_id;            // the client's, or "" (the server names it)
  std::vector<engine::Token> prompt;  // non-empty; every id < vocab
  uint32_t max_tokens = kDefaultMaxTokens;  // >= 1; prompt + max_tokens <= context
  bool stream = false;
  // temperature (default 1, as OpenAI's) and seed (default 0): the draws
  // of a llama.cpp engine (engine/sampling.h).
  engine::Sampling sampling{1.0f, 0};
  // vLLM's extension: go on past the model's end-of-generation token.
  bool ignore_eos = false;
  // stream_options.include_usage: a stream ends with a usage chunk.
  bool include_usage = false;
  // True iff kv_transfer_params asked for a transfer (do_remote_decode or
  // do_remote_prefill); then `kv` holds it (prompt_hash left 0: the engine
  // computes it).
  bool has_kv = false;
  KvTransferParams kv;
  std::string remote_host;           // D: where the producer engine listens
  uint16_t remote_port = 0;
};

// Parses and checks one request body (see the header comment for errors).
Result<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                 const ParseLimits& limits);

// The body as a JSON object: over max_body_bytes, not JSON, or not an
// object are the errors above.
Result<nlohmann::json> ParseBodyObject(std::string_view body, const ParseLimits& limits);

// ParseCompletionRequest for a body already parsed into a JSON object
// (chat_request.h turns a chat into such a document, its messages into
// "prompt" ids), the output length read from and named by
// `max_tokens_field` (a chat's "max_completion_tokens", when it sent one).
Result<CompletionRequest> ParseCompletionDocument(const nlohmann::json& doc,
                                                  const ParseLimits& limits,
                                                  const char* max_tokens_field = "max_tokens");

// The HTTP status for a ParseCompletionRequest error: 413 for a body over
// the limit, 400 otherwise.
int HttpStatusForParseError(const Status& status);

// Which configured limit a ParseCompletionRequest error is over, as the
// label of kvrelay_limit_rejections_total: "body_bytes", "prompt_tokens"
// (the message names the flag, kPromptLimitTag), or "" for any other error.
std::string_view ParseErrorLimit(const Status& status);
inline constexpr std::string_view kPromptLimitTag = " (--max-prompt-tokens)";

}  // namespace kvrelay::server
