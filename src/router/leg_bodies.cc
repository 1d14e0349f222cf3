#include "router/leg_bodies.h"

#include "server/completion_response.h"
#include "server/json_body.h"

namespace kvrelay::router {

using nlohmann::json;

Result<ClientRequest> ParseClientBody(std::string_view body) {
  ClientRequest r;
  Result<json> parsed = server::ParseJsonBody(body);
  if (!parsed.ok()) return parsed.status();
  r.body = std::move(*parsed);
  if (!r.body.is_object()) return InvalidArgumentError("body must be a JSON object");
  // The router owns kv_transfer_params (it replaces the client's); one that
  // could not be a hand-off's is refused rather than dropped unseen.
  if (auto kv = r.body.find("kv_transfer_params");
      kv != r.body.end() && !kv->is_object() && !kv->is_null()) {
    return InvalidArgumentError(std::string("kv_transfer_params must be an object (got ") +
                                kv->type_name() + "); the router sets it for both legs");
  }
  auto it = r.body.find("stream");
  r.stream = it != r.body.end() && it->is_boolean() && it->get<bool>();
  return r;
}

std::string PrefillLegBody(const json& client, const TransferId& transfer,
                           uint32_t consumer_tp, std::optional<uint32_t> consumer_engine) {
  json b = client;
  b.erase("max_completion_tokens");   // a chat's name for it, which would win
  b["max_tokens"] = 1;
  b["stream"] = false;
  b["kv_transfer_params"] = json{{"do_remote_decode", true},
                                 {"transfer_id", transfer.ToString()},
                                 {"consumer_tp_size", consumer_tp}};
  if (consumer_engine) b["kv_transfer_params"]["consumer_engine_id"] = *consumer_engine;
  return b.dump();
}

std::string DecodeLegBody(const json& client, const TransferId& transfer,
                          const EngineInfo& prefill) {
  json b = client;
  b["kv_transfer_params"] = json{{"do_remote_prefill", true},
                                 {"transfer_id", transfer.ToString()},
                                 {"remote_engine_id", prefill.engine_id},
                                 {"remote_host", prefill.kv_host},
                                 {"remote_port", prefill.kv_port},
                                 {"remote_tp_size", prefill.tp}};
  return b.dump();
}

json AsStreamChunk(json completion, bool first) {
  using server::Api;
  using server::ObjectName;
  if (!completion.is_object()) return completion;
  completion.erase("usage");
  completion.erase("kv_transfer_params");
  if (completion.value("object", "") != ObjectName(Api::kChat, false)) return completion;
  completion["object"] = ObjectName(Api::kChat, true);
  if (auto choices = completion.find("choices"); choices != completion.end() &&
                                                 choices->is_array()) {
    for (json& c : *choices) {
      if (!c.is_object() || !c.contains("message")) continue;
      c["delta"] = std::move(c["message"]);
      c.erase("message");
      if (!first && c["delta"].is_object()) c["delta"].erase("role");
    }
  }
  return completion;
}

std::string_view TrimLeadingSpace(std::string_view body) {
  const size_t first = body.find_first_not_of(" \t\r\n");
  return first == std::string_view::npos ? std::string_view() : body.substr(first);
}

CompletionVerdict JudgeCompletionJson(const json& j) {
  CompletionVerdict v;
  if (!j.is_object()) return v;
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty() ||
      !(*choices)[0].is_object()) {
    return v;
  }
  v.parsed = true;
  const json& c = (*choices)[0];
  auto fr = c.find("finish_reason");
  if (fr != c.end() && fr->is_string()) v.finish_reason = fr->get<std::string>();
  auto err = j.find("error");
  if (err != j.end() && err->is_string()) v.error = err->get<std::string>();
  return v;
}

CompletionVerdict JudgeCompletion(std::string_view body) {
  return JudgeCompletionJson(json::parse(TrimLeadingSpace(body), nullptr, false));
}

std::string UpstreamErrorMessage(std::string_view body) {
  const json j = json::parse(TrimLeadingSpace(body), nullptr, false);
  if (j.is_object()) {
    auto e = j.find("error");
    if (e != j.end() && e->is_object()) {
      auto m = e->find("message");
      if (m != e->end() && m->is_string()) return m->get<std::string>();
    }
  }
  std::string s(TrimLeadingSpace(body));
  if (s.size() > 200) s = s.substr(0, 200) + "...";
  return s.empty() ? "(empty body)" : s;
}

}  // namespace kvrelay::router
