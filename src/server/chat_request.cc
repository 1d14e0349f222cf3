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

bool Present(const json& doc, const char* key) {
  auto it = doc.find(key);
  return it != doc.end() && !it->is_null();
}

// One message's content: a string, or text parts joined.
Result<std::string> Content(const json& m, const std::string& name) {
  auto c = m.find("content");
  if (c == m.end() || c->is_null()) return InvalidArgumentError(name + ".content is required");
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
  auto ms = doc.find("messages");
  if (ms == doc.end() || ms->is_null()) return InvalidArgumentError("messages is required");
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
    if (auto n = m.find("name"); n != m.end() && !n->is_null() && !n->is_string()) {
      return TypeError(name + ".name", "a string", *n);
    }
    if (Present(m, "tool_calls")) {
      return InvalidArgumentError(name + ".tool_calls: tool calls are not supported");
    }
    Result<std::string> content = Content(m, name);
    if (!content.ok()) return content.status();
    out.push_back(ChatMessage{r, std::move(*content)});
  }
  return out;
}

// The chat fields a completion does not have, checked, then removed from
// `doc` (max_completion_tokens becomes max_tokens: *renamed).
Status ChatOnlyFields(json& doc, bool* renamed) {
  if (Present(doc, "prompt")) {
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
  if (Present(doc, "top_logprobs")) {
    return InvalidArgumentError("top_logprobs is not supported (leave it out)");
  }
  if (auto mct = doc.find("max_completion_tokens"); mct != doc.end()) {
    if (!mct->is_null()) {
      doc["max_tokens"] = *mct;   // its checks are max_tokens'
      *renamed = true;
    }
    doc.erase("max_completion_tokens");
  }
  return Status::Ok();
}

}  // namespace

Result<CompletionRequest> ParseChatRequest(std::string_view body, const ParseLimits& limits) {
  Result<json> doc = ParseBodyObject(body, limits);
  if (!doc.ok()) return doc.status();
  bool renamed = false;
  if (Status s = ChatOnlyFields(*doc, &renamed); !s.ok()) return s;
  Result<std::vector<ChatMessage>> messages = Messages(*doc);
  if (!messages.ok()) return messages.status();
  doc->erase("messages");
  // The prompt's ids, checked as a completion's token-id prompt is.
  (*doc)["prompt"] = EncodeChatText(limits.codec, *messages, limits.vocab);
  Result<CompletionRequest> r = ParseCompletionDocument(*doc, limits);
  // An error about the length names the field the client sent.
  constexpr std::string_view kMax = "max_tokens";
  if (!r.ok() && renamed && r.status().message().starts_with(kMax)) {
    return Status(r.status().code(), "max_completion_tokens" +
                                         r.status().message().substr(kMax.size()));
  }
  return r;
}

}  // namespace kvrelay::server
