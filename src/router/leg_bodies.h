// leg_bodies.h — the bodies of a hand-off's two legs, built from the
// client's body, and the check of a leg's JSON answer.
//
// Why: what the router sends P and D is the whole P/D contract
// (docs/http.md, "P/D hand-off"); building it in pure functions lets a test
// pin every field. The router validates only what it must (a JSON object,
// the "stream" flag it needs to know how to relay); every other field goes
// through untouched and the engines judge it.
//
// Both legs go to the path the client called (/v1/completions or
// /v1/chat/completions).
// Legs:
//   P: the client's body, with "max_tokens": 1 (a chat's
//      "max_completion_tokens" removed), "stream": false and
//      "kv_transfer_params": {"do_remote_decode": true, "transfer_id": T,
//      "consumer_tp_size": D.tp, "consumer_engine_id": D.engine_id} (P then
//      refuses pulls for T from any other D engine).
//   D: the client's body (its max_tokens and stream), with
//      "kv_transfer_params": {"do_remote_prefill": true, "transfer_id": T,
//      "remote_engine_id", "remote_host", "remote_port", "remote_tp_size"}
//      from P's /kv_info.
// A kv_transfer_params the client sent is replaced: the router owns it.
//
// Thread safety: pure functions and value types; any thread.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "base/transfer_id.h"
#include "router/engine_info.h"

namespace kvrelay::router {

struct ClientRequest {
  nlohmann::json body;   // a JSON object
  bool stream = false;   // "stream" is the boolean true
  std::string path = "/v1/completions";   // the engines' route for both legs
};

// kInvalidArgument ("body is not valid JSON: ...", "body must be a JSON
// object"), worded as the engines word them.
Result<ClientRequest> ParseClientBody(std::string_view body);

std::string PrefillLegBody(const nlohmann::json& client, const TransferId& transfer,
                           uint32_t consumer_tp,
                           std::optional<uint32_t> consumer_engine = std::nullopt);
std::string DecodeLegBody(const nlohmann::json& client, const TransferId& transfer,
                          const EngineInfo& prefill);

// A completion (P's answer, or D's non-streaming answer, or D's last stream
// event) as far as the router cares.
struct CompletionVerdict {
  bool parsed = false;          // a JSON object with choices[0]
  std::string finish_reason;    // "" if absent or null
  std::string error;            // the "error" field, if any
  bool failed() const { return finish_reason == "error"; }
  bool aborted() const { return finish_reason == "abort"; }
};
// Leading whitespace (the engines' disconnect probe) is skipped.
CompletionVerdict JudgeCompletion(std::string_view body);
CompletionVerdict JudgeCompletionJson(const nlohmann::json& body);

// A whole answer (P's, when P ended the request) as the stream chunk a
// plain engine would have sent: usage and kv_transfer_params dropped; a
// chat's "chat.completion" becomes a "chat.completion.chunk" whose choices
// carry their message as the delta, its role only if `first` (no chunk
// went to the client before).
nlohmann::json AsStreamChunk(nlohmann::json completion, bool first);

// The "message" of an {"error": {...}} body, or the body itself (cut to 200
// bytes) if it has no such shape.
std::string UpstreamErrorMessage(std::string_view body);

// `body` without leading ASCII whitespace.
std::string_view TrimLeadingSpace(std::string_view body);

}  // namespace kvrelay::router
