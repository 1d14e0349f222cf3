// completion_response.h — the JSON the engine server sends back: a finished
// completion, stream chunks and their SSE framing, errors, the model list.
//
// Why: the response shapes are a contract with clients (OpenAI's
// /v1/completions plus vLLM's token_ids and kv_transfer_params, and this
// project's weights_versions); keeping them in pure functions lets a test
// parse every shape back. docs/http.md describes the same shapes.
//
// Every function returns compact JSON (no trailing newline). Strings that are
// not valid UTF-8 are written with U+FFFD in place of the bad bytes; these
// functions never throw on content.
//
// Thread safety: pure functions and value types; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/transfer_id.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "server/text_codec.h"

namespace kvrelay::server {

// Which API a response answers. kCompletions: OpenAI's /v1/completions
// ("text_completion", the choice's "text"). kChat: /v1/chat/completions
// ("chat.completion" with the choice's "message": {"role": "assistant",
// "content"}; streamed, "chat.completion.chunk" with a "delta" holding the
// chunk's "content", the first one also "role": "assistant"). Both carry
// token_ids and weights_versions in the choice.
enum class Api : uint8_t { kCompletions, kChat };

// The "object" of a whole answer or (`chunk`) of a stream chunk:
// "text_completion" (both), "chat.completion", "chat.completion.chunk".
std::string_view ObjectName(Api api, bool chunk);

// What P hands back with a do_remote_decode request's result: the
// kv_transfer_params the router passes to D (do_remote_prefill true).
struct KvTransferOut {
  TransferId transfer;
  uint32_t remote_engine_id = 0;   // P's engine id
  std::string remote_host;         // where P's engine listens
  uint16_t remote_port = 0;
  uint32_t remote_tp_size = 1;     // P's tp
};

struct CompletionResult {
  std::string id;                  // client-visible request id
  std::string model;
  int64_t created_s = 0;           // Unix seconds
  uint32_t prompt_tokens = 0;
  std::vector<engine::Token> tokens;
  std::vector<uint64_t> weights_versions;   // REQUIRES: one per token
  engine::FinishReason finish_reason = engine::FinishReason::kLength;
  std::string error;               // written only when finish_reason is kError
  std::optional<KvTransferOut> kv_transfer_params;
  const TextCodec* codec = nullptr;  // "text" from the ids; null: the toy one's
  Api api = Api::kCompletions;
};

// "length", "abort" or "error".
std::string_view FinishReasonName(engine::FinishReason reason);

// {"id","object":"text_completion","created","model","choices":[{"index":0,
//  "text","token_ids","weights_versions","finish_reason","logprobs":null}],
//  "usage":{...},"kv_transfer_params":{...}|null[,"error":"..."]}
std::string CompletionJson(const CompletionResult& result);

// One streamed chunk: the same shape without usage/kv_transfer_params; the
// tokens since the last chunk; finish_reason null until the last chunk.
// `text` is the chunk's text: its tokens decoded, cut between characters by
// the request's Utf8Stream (a character split over two chunks comes whole in
// the second), so the chunks' texts add up to the whole response's text.
// `first`: the stream's first chunk (a chat's delta then names the role).
// REQUIRES: tokens.size() == weights_versions.size().
std::string StreamChunkJson(std::string_view id, std::string_view model, int64_t created_s,
                            std::span<const engine::Token> tokens,
                            std::span<const uint64_t> weights_versions,
                            std::optional<engine::FinishReason> finish_reason,
                            std::string_view text, Api api = Api::kCompletions,
                            bool first = false);

// The chunk after the last choice chunk when the request set
// stream_options.include_usage (OpenAI's shape): "choices": [] and usage.
std::string StreamUsageJson(std::string_view id, std::string_view model, int64_t created_s,
                            uint32_t prompt_tokens, uint64_t completion_tokens,
                            Api api = Api::kCompletions);

// "data: <json>\n\n" — one server-sent event.
std::string SseEvent(std::string_view json);
// "data: [DONE]\n\n" — the end of a stream.
std::string SseDone();

// {"error":{"message","type","code"}} (OpenAI's error shape).
std::string ErrorJson(std::string_view message, std::string_view type, int code);
// The same, in the HTTP server's error_body form (http_server.h), so the
// errors the server answers itself look like every other.
std::string ErrorBodyFor(int status, const std::string& message, const std::string& type);

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created",
// "owned_by":"kvrelay","max_model_len"}]}.
std::string ModelsJson(std::string_view model, int64_t created_s, uint32_t max_context);

}  // namespace kvrelay::server
