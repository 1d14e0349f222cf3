#include "server/completion_response.h"

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "server/text_codec.h"

namespace kvrelay::server {
namespace {

using Json = nlohmann::ordered_json;   // keys in the order written

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A chat's text goes in "message" (a whole answer) or "delta" (a chunk).
enum class TextAt : uint8_t { kText, kMessage, kDelta, kFirstDelta };

Json Choice(std::span<const engine::Token> tokens, std::span<const uint64_t> versions,
            std::optional<engine::FinishReason> finish, std::string_view text, TextAt at) {
  KV_CHECK_EQ(tokens.size(), versions.size());
  Json c;
  c["index"] = 0;
  switch (at) {
    case TextAt::kText: c["text"] = text; break;
    case TextAt::kMessage: c["message"] = {{"role", "assistant"}, {"content", text}}; break;
    case TextAt::kDelta: c["delta"] = {{"content", text}}; break;
    case TextAt::kFirstDelta: c["delta"] = {{"role", "assistant"}, {"content", text}}; break;
  }
  c["token_ids"] = Json::array();
  for (engine::Token t : tokens) c["token_ids"].push_back(t);
  c["weights_versions"] = Json::array();
  for (uint64_t v : versions) c["weights_versions"].push_back(v);
  if (finish) {
    c["finish_reason"] = FinishReasonName(*finish);
  } else {
    c["finish_reason"] = nullptr;
  }
  c["logprobs"] = nullptr;
  return c;
}

Json Head(std::string_view id, std::string_view model, int64_t created_s,
          std::string_view object) {
  Json j;
  j["id"] = id;
  j["object"] = object;
  j["created"] = created_s;
  j["model"] = model;
  return j;
}

}  // namespace

std::string_view ObjectName(Api api, bool chunk) {
  if (api == Api::kCompletions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

std::string_view FinishReasonName(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kLength: return "length";
    case engine::FinishReason::kStop: return "stop";
    case engine::FinishReason::kAborted: return "abort";
    case engine::FinishReason::kError: return "error";
  }
  return "error";
}

std::string CompletionJson(const CompletionResult& r) {
  const bool chat = r.api == Api::kChat;
  Json j = Head(r.id, r.model, r.created_s, ObjectName(r.api, /*chunk=*/false));
  j["choices"] = Json::array({Choice(r.tokens, r.weights_versions, r.finish_reason,
                                     DecodeText(r.codec, r.tokens),
                                     chat ? TextAt::kMessage : TextAt::kText)});
  const uint64_t completion = r.tokens.size();
  j["usage"] = {{"prompt_tokens", r.prompt_tokens},
                {"completion_tokens", completion},
                {"total_tokens", r.prompt_tokens + completion}};
  if (r.kv_transfer_params) {
    const KvTransferOut& kv = *r.kv_transfer_params;
    j["kv_transfer_params"] = {{"do_remote_decode", false},
                               {"do_remote_prefill", true},
                               {"transfer_id", kv.transfer.ToString()},
                               {"remote_engine_id", kv.remote_engine_id},
                               {"remote_host", kv.remote_host},
                               {"remote_port", kv.remote_port},
                               {"remote_tp_size", kv.remote_tp_size}};
  } else {
    j["kv_transfer_params"] = nullptr;
  }
  if (r.finish_reason == engine::FinishReason::kError) j["error"] = r.error;
  return Dump(j);
}

std::string StreamChunkJson(std::string_view id, std::string_view model, int64_t created_s,
                            std::span<const engine::Token> tokens,
                            std::span<const uint64_t> weights_versions,
                            std::optional<engine::FinishReason> finish_reason,
                            std::string_view text, Api api, bool first) {
  const bool chat = api == Api::kChat;
  Json j = Head(id, model, created_s, ObjectName(api, /*chunk=*/true));
  const TextAt at = !chat ? TextAt::kText : first ? TextAt::kFirstDelta : TextAt::kDelta;
  j["choices"] = Json::array({Choice(tokens, weights_versions, finish_reason, text, at)});
  return Dump(j);
}

std::string StreamUsageJson(std::string_view id, std::string_view model, int64_t created_s,
                            uint32_t prompt_tokens, uint64_t completion_tokens, Api api) {
  Json j = Head(id, model, created_s, ObjectName(api, /*chunk=*/true));
  j["choices"] = Json::array();
  j["usage"] = {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}};
  return Dump(j);
}

std::string SseEvent(std::string_view json) {
  std::string out;
  out.reserve(json.size() + 8);
  out += "data: ";
  out += json;
  out += "\n\n";
  return out;
}

std::string SseDone() { return "data: [DONE]\n\n"; }

std::string ErrorJson(std::string_view message, std::string_view type, int code) {
  Json e;
  e["message"] = message;
  e["type"] = type;
  e["code"] = code;
  Json j;
  j["error"] = std::move(e);
  return Dump(j);
}

std::string ErrorBodyFor(int status, const std::string& message, const std::string& type) {
  return ErrorJson(message, type, status);
}

std::string ModelsJson(std::string_view model, int64_t created_s, uint32_t max_context) {
  Json m;
  m["id"] = model;
  m["object"] = "model";
  m["created"] = created_s;
  m["owned_by"] = "kvrelay";
  m["max_model_len"] = max_context;
  Json j;
  j["object"] = "list";
  j["data"] = Json::array({std::move(m)});
  return Dump(j);
}

}  // namespace kvrelay::server
