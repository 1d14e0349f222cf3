#include "server/chat_request.h"

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/json_body.h"
#include "server/text_codec.h"

namespace kvrelay::server {
namespace {

using nlohmann::json;

// One message's content: a string, or text parts joined.
Result<std::string> Content(const json& m, const std::string& name) {
  const json* c = Field(m, "content");
  if (c == nullptr) return InvalidArgumentError(name + ".content is required");
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) return TypeError(name + ".content", "a string or an array of parts", *c);
  std::string text;
  for (size_t i = 0; i < c->size(); ++i) {
    const json& part = (*c)[i];
    const std::string p = name + ".content[" + std::to_string(i) + "]";
    if (!part.is_object()) return TypeError(p, "an object", part);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      return InvalidArgumentError(p + ".type is required (\"text\")");
    }
    if (*type != "text") {
      return InvalidArgumentError(p + " is of type " + QuoteForError(type->get<std::string>()) +
                                  "; this server takes text parts only");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) {
      return InvalidArgumentError(p + ".text must be a string");
    }
    text += t->get_ref<const std::string&>();
  }
  return text;
}

Result<std::vector<ChatMessage>> Messages(const json& doc) {
  const json* ms = Field(doc, "messages");
  if (ms == nullptr) return InvalidArgumentError("messages is required");
  if (!ms->is_array()) return TypeError("messages", "an array of messages", *ms);
  if (ms->empty()) return InvalidArgumentError("messages is empty");
  if (ms->size() > kMaxChatMessages) {
    return InvalidArgumentError("messages has " + std::to_string(ms->size()) +
                                " entries; the limit is " + std::to_string(kMaxChatMessages));
  }
  std::vector<ChatMessage> out;
  out.reserve(ms->size());
  for (size_t i = 0; i < ms->size(); ++i) {
    const json& m = (*ms)[i];
    const std::string name = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return TypeError(name, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return InvalidArgumentError(name + ".role must be a string");
    }
    const std::string& r = role->get_ref<const std::string&>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool") {
      return InvalidArgumentError(name + ".role is " + QuoteForError(r) +
                                  "; it must be system, developer, user, assistant or tool");
    }
    if (const json* n = Field(m, "name"); n != nullptr && !n->is_string()) {
      return TypeError(name + ".name", "a string", *n);
    }
    if (Field(m, "tool_calls") != nullptr) {
      return InvalidArgumentError(name + ".tool_calls: tool calls are not supported");
    }
    Result<std::string> content = Content(m, name);
    if (!content.ok()) return content.status();
    out.push_back(ChatMessage{r, std::move(*content)});
  }
  return out;
}

// The chat fields a completion does not have, checked, then removed from
// `doc` (max_completion_tokens stays: the completion's rules read it).
Status ChatOnlyFields(json& doc) {
  if (Field(doc, "prompt") != nullptr) {
    return InvalidArgumentError(
        "prompt is a /v1/completions field; a chat sends messages (or use /v1/completions)");
  }
  for (const char* key : {"tools", "tool_choice", "functions", "function_call"}) {
    auto it = doc.find(key);
    if (it != doc.end() && !it->is_null() && !(it->is_array() && it->empty())) {
      return InvalidArgumentError(std::string(key) + ": tools are not supported");
    }
    if (it != doc.end()) doc.erase(it);
  }
  if (auto rf = doc.find("response_format"); rf != doc.end()) {
    if (!rf->is_null() && *rf != json{{"type", "text"}}) {
      return InvalidArgumentError("response_format: only {\"type\": \"text\"} is supported");
    }
    doc.erase(rf);
  }
  if (auto lp = doc.find("logprobs"); lp != doc.end()) {
    if (!lp->is_null() && !lp->is_boolean()) return TypeError("logprobs", "a boolean", *lp);
    if (lp->is_boolean() && lp->get<bool>()) {
      return InvalidArgumentError("logprobs is not supported (send false or leave it out)");
    }
    doc.erase(lp);
  }
  if (Field(doc, "top_logprobs") != nullptr) {
    return InvalidArgumentError("top_logprobs is not supported (leave it out)");
  }
  return Status::Ok();
}

}  // namespace

Result<CompletionRequest> ParseChatRequest(std::string_view body, const ParseLimits& limits) {
  Result<json> doc = ParseBodyObject(body, limits);
  if (!doc.ok()) return doc.status();
  if (Status s = ChatOnlyFields(*doc); !s.ok()) return s;
  Result<std::vector<ChatMessage>> messages = Messages(*doc);
  if (!messages.ok()) return messages.status();
  doc->erase("messages");
  // The prompt's ids, checked as a completion's token-id prompt is.
  (*doc)["prompt"] = EncodeChatText(limits.codec, *messages, limits.vocab);
  // OpenAI's newer name for the output length wins when both are sent.
  const char* max_field =
      Field(*doc, "max_completion_tokens") != nullptr ? "max_completion_tokens" : "max_tokens";
  return ParseCompletionDocument(*doc, limits, max_field);
}

}  // namespace kvrelay::server
