#include "server/completion_request.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/transfer_id.h"
#include "server/json_body.h"
#include "server/text_codec.h"

namespace kvrelay::server {
namespace {

using nlohmann::json;

Status OutOfRangeError(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }

// An integer JSON number's value, saturated to int64 (callers bound it).
int64_t IntegerValue(const json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    return u > uint64_t{std::numeric_limits<int64_t>::max()}
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(u);
  }
  return j.get<int64_t>();
}

bool IsPrintableAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7E; });
}

// --- optional fields, each checked for type and range ------------------------

Status OptBool(const json& obj, const std::string& prefix, const char* key,
               std::optional<bool>* out) {
  const json* v = Field(obj, key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_boolean()) return TypeError(prefix + key, "a boolean", *v);
  *out = v->get<bool>();
  return Status::Ok();
}

Status OptInt(const json& obj, const std::string& prefix, const char* key, int64_t lo,
              int64_t hi, std::optional<int64_t>* out) {
  const json* v = Field(obj, key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_number_integer()) return TypeError(prefix + key, "an integer", *v);
  const int64_t x = IntegerValue(*v);
  if (x < lo || x > hi) {
    return InvalidArgumentError(prefix + key + " must be between " + std::to_string(lo) +
                                " and " + std::to_string(hi) + ", got " + v->dump());
  }
  *out = x;
  return Status::Ok();
}

Status OptString(const json& obj, const std::string& prefix, const char* key,
                 std::optional<std::string>* out) {
  const json* v = Field(obj, key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_string()) return TypeError(prefix + key, "a string", *v);
  *out = v->get<std::string>();
  return Status::Ok();
}

Status OptTpSize(const json& obj, const std::string& prefix, const char* key,
                 std::optional<int64_t>* out) {
  const json* v = Field(obj, key);
  if (v == nullptr) return Status::Ok();
  if (!v->is_number_integer()) return TypeError(prefix + key, "an integer", *v);
  const int64_t x = IntegerValue(*v);
  if (x != 1 && x != 2 && x != 4) {
    return InvalidArgumentError(prefix + key + " must be 1, 2 or 4, got " + v->dump());
  }
  *out = x;
  return Status::Ok();
}

#define RETURN_IF_ERROR_(expr)        \
  do {                                  \
    Status status_ = (expr);            \
    if (!status_.ok()) return status_;  \
  } while (0)

// kv_transfer_params (an object) into `req`.
Status ParseKvTransferParams(const json& kv, CompletionRequest* req) {
  const std::string p = "kv_transfer_params.";
  std::optional<bool> decode, prefill;
  std::optional<std::string> transfer_text, host;
  std::optional<int64_t> engine_id, port, remote_tp, consumer_tp, consumer_engine;
  RETURN_IF_ERROR_(OptBool(kv, p, "do_remote_decode", &decode));
  RETURN_IF_ERROR_(OptBool(kv, p, "do_remote_prefill", &prefill));
  RETURN_IF_ERROR_(OptString(kv, p, "transfer_id", &transfer_text));
  RETURN_IF_ERROR_(OptInt(kv, p, "remote_engine_id", 0,
                            std::numeric_limits<uint32_t>::max(), &engine_id));
  RETURN_IF_ERROR_(OptString(kv, p, "remote_host", &host));
  RETURN_IF_ERROR_(OptInt(kv, p, "remote_port", 1, 65535, &port));
  RETURN_IF_ERROR_(OptTpSize(kv, p, "remote_tp_size", &remote_tp));
  RETURN_IF_ERROR_(OptTpSize(kv, p, "consumer_tp_size", &consumer_tp));
  RETURN_IF_ERROR_(OptInt(kv, p, "consumer_engine_id", 0, (int64_t{1} << 28) - 1,
                            &consumer_engine));

  TransferId transfer;
  if (transfer_text) {
    if (!TransferId::Parse(*transfer_text, &transfer)) {
      return InvalidArgumentError(p + "transfer_id must be 32 lowercase hex digits, got " +
                                  QuoteForError(*transfer_text));
    }
    if (transfer.IsZero()) return InvalidArgumentError(p + "transfer_id must not be all zeros");
  }
  if (host) {
    if (host->empty() || host->size() > kMaxRemoteHostChars || !IsPrintableAscii(*host) ||
        host->find(' ') != std::string::npos) {
      return InvalidArgumentError(p + "remote_host must be a host name or address of 1.." +
                                  std::to_string(kMaxRemoteHostChars) +
                                  " printable ASCII characters without spaces, got " +
                                  QuoteForError(*host));
    }
  }

  const bool d = decode.value_or(false);
  const bool f = prefill.value_or(false);
  if (d && f) {
    return InvalidArgumentError(
        "kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true "
        "(a request is either the prefill half or the decode half of a hand-off)");
  }
  if (!d && !f) return Status::Ok();   // no transfer asked for
  const char* flag = d ? "do_remote_decode" : "do_remote_prefill";
  if (!transfer_text) {
    return InvalidArgumentError(p + "transfer_id is required when " + flag + " is true");
  }
  if (f) {
    const std::pair<bool, const char*> needed[] = {
        {engine_id.has_value(), "remote_engine_id"},
        {host.has_value(), "remote_host"},
        {port.has_value(), "remote_port"},
        {remote_tp.has_value(), "remote_tp_size"},
    };
    for (const auto& [present, name] : needed) {
      if (!present) {
        return InvalidArgumentError(p + name + " is required when do_remote_prefill is true");
      }
    }
  }

  req->has_kv = true;
  req->kv.transfer = transfer;
  req->kv.do_remote_decode = d;
  req->kv.do_remote_prefill = f;
  req->kv.remote_engine = static_cast<uint32_t>(engine_id.value_or(0));
  req->kv.remote_tp = static_cast<uint32_t>(f ? *remote_tp : consumer_tp.value_or(1));
  if (d && consumer_engine) req->kv.consumer_engine = static_cast<uint32_t>(*consumer_engine);
  req->remote_host = host.value_or("");
  req->remote_port = static_cast<uint16_t>(port.value_or(0));
  return Status::Ok();
}

// The fields OpenAI clients send that this server ignores: checked for type
// only, or for the one value it can honour.
Status CheckIgnoredFields(const json& doc) {
  for (const char* key : {"top_p", "presence_penalty", "frequency_penalty"}) {
    if (const json* v = Field(doc, key); v != nullptr && !v->is_number()) {
      return TypeError(key, "a number", *v);
    }
  }
  if (const json* v = Field(doc, "user"); v != nullptr && !v->is_string()) {
    return TypeError("user", "a string", *v);
  }
  if (const json* v = Field(doc, "stream_options"); v != nullptr && !v->is_object() &&
                                                     !v->is_null()) {
    return TypeError("stream_options", "an object", *v);
  }
  if (const json* v = Field(doc, "stop")) {
    bool ok = v->is_string();
    if (v->is_array()) {
      ok = std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_string(); });
    }
    if (!ok) return TypeError("stop", "a string or an array of strings", *v);
  }
  if (const json* v = Field(doc, "n")) {
    if (!v->is_number_integer()) return TypeError("n", "an integer", *v);
    if (IntegerValue(*v) != 1) {
      return InvalidArgumentError("n must be 1 (one completion per request), got " + v->dump());
    }
  }
  if (const json* v = Field(doc, "echo")) {
    if (!v->is_boolean()) return TypeError("echo", "a boolean", *v);
    if (v->get<bool>()) return InvalidArgumentError("echo is not supported (send false)");
  }
  if (const json* v = Field(doc, "logprobs")) {
    return InvalidArgumentError("logprobs is not supported (send null or leave it out), got " +
                                v->dump());
  }
  return Status::Ok();
}

Status ParsePrompt(const json& doc, const ParseLimits& limits, CompletionRequest* req) {
  const json* p = Field(doc, "prompt");
  if (p == nullptr) return InvalidArgumentError("prompt is required");
  if (p->is_string()) {
    req->prompt = EncodeText(limits.codec, p->get_ref<const std::string&>(), limits.vocab);
    if (req->prompt.empty()) {
      return InvalidArgumentError(limits.codec == nullptr
                                      ? "prompt is empty (it has no words between whitespace)"
                                      : "prompt is empty (the model's tokenizer gives no tokens)");
    }
  } else if (p->is_array()) {
    if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
      return InvalidArgumentError(
          "prompt must be a single prompt (a string or an array of token ids); batched "
          "prompts are not supported, send one request per prompt");
    }
    if (p->empty()) return InvalidArgumentError("prompt is empty (an array of no token ids)");
    if (p->size() > limits.max_prompt_tokens) {
      return OutOfRangeError("prompt has " + std::to_string(p->size()) +
                             " tokens; the limit is " +
                             std::to_string(limits.max_prompt_tokens) +
                             std::string(kPromptLimitTag));
    }
    req->prompt.reserve(p->size());
    for (size_t i = 0; i < p->size(); ++i) {
      const json& e = (*p)[i];
      const std::string name = "prompt[" + std::to_string(i) + "]";
      if (!e.is_number_integer()) return TypeError(name, "an integer token id", e);
      const int64_t id = IntegerValue(e);
      if (id < 0 || id >= int64_t{limits.vocab}) {
        return OutOfRangeError(name + " is " + e.dump() + "; token ids must be in [0, " +
                               std::to_string(limits.vocab) + ")");
      }
      req->prompt.push_back(static_cast<engine::Token>(id));
    }
  } else {
    return TypeError("prompt", "a string or an array of integer token ids", *p);
  }
  const size_t n = req->prompt.size();
  if (n > limits.max_prompt_tokens) {
    return OutOfRangeError("prompt has " + std::to_string(n) + " tokens; the limit is " +
                           std::to_string(limits.max_prompt_tokens) +
                           std::string(kPromptLimitTag));
  }
  if (n >= limits.max_context) {
    return OutOfRangeError("prompt has " + std::to_string(n) + " tokens; the model's context of " +
                           std::to_string(limits.max_context) +
                           " tokens leaves no room for output");
  }
  return Status::Ok();
}

// temperature (OpenAI's range, 0 to 2; 0 is greedy) and seed (any integer;
// its 64 bits seed the draws). The emulated model ignores both.
Status ParseSampling(const json& doc, CompletionRequest* req) {
  if (const json* t = Field(doc, "temperature")) {
    if (!t->is_number()) return TypeError("temperature", "a number", *t);
    const double v = t->get<double>();
    if (!(v >= 0.0 && v <= 2.0)) {
      return OutOfRangeError("temperature is " + t->dump() + "; it must be in [0, 2]");
    }
    req->sampling.temperature = static_cast<float>(v);
  }
  if (const json* s = Field(doc, "seed")) {
    if (!s->is_number_integer()) return TypeError("seed", "an integer", *s);
    req->sampling.seed = static_cast<uint64_t>(IntegerValue(*s));
  }
  if (const json* e = Field(doc, "ignore_eos")) {
    if (!e->is_boolean()) return TypeError("ignore_eos", "a boolean", *e);
    req->ignore_eos = e->get<bool>();
  }
  return Status::Ok();
}

Status ParseFields(const json& doc, const ParseLimits& limits, const char* max_tokens_field,
                   CompletionRequest* req) {
  if (const json* m = Field(doc, "model")) {
    if (!m->is_string()) return TypeError("model", "a string", *m);
    if (m->get_ref<const std::string&>() != limits.model_name) {
      return InvalidArgumentError("model " + QuoteForError(m->get_ref<const std::string&>()) +
                                  " is not served here; this server serves " +
                                  QuoteForError(limits.model_name));
    }
  }
  RETURN_IF_ERROR_(ParsePrompt(doc, limits, req));

  const uint32_t room = limits.max_context - static_cast<uint32_t>(req->prompt.size());
  req->max_tokens = std::min(kDefaultMaxTokens, room);
  if (const json* m = Field(doc, max_tokens_field)) {
    const std::string name = max_tokens_field;
    if (!m->is_number_integer()) return TypeError(name, "an integer", *m);
    const int64_t v = IntegerValue(*m);
    if (v < 1) return InvalidArgumentError(name + " must be at least 1, got " + m->dump());
    if (v > int64_t{room}) {
      return OutOfRangeError(name + " is " + m->dump() + ", but the prompt's " +
                             std::to_string(req->prompt.size()) +
                             " tokens leave room for at most " + std::to_string(room) +
                             " in the model's context of " +
                             std::to_string(limits.max_context) + " tokens");
    }
    req->max_tokens = static_cast<uint32_t>(v);
  }

  if (const json* s = Field(doc, "stream")) {
    if (!s->is_boolean()) return TypeError("stream", "a boolean", *s);
    req->stream = s->get<bool>();
  }
  if (const json* so = Field(doc, "stream_options"); so != nullptr && so->is_object()) {
    if (const json* u = Field(*so, "include_usage")) {
      if (!u->is_boolean()) return TypeError("stream_options.include_usage", "a boolean", *u);
      req->include_usage = u->get<bool>();
    }
  }
  if (const json* r = Field(doc, "request_id")) {
    if (!r->is_string()) return TypeError("request_id", "a string", *r);
    const std::string& id = r->get_ref<const std::string&>();
    if (id.empty() || id.size() > kMaxRequestIdChars || !IsPrintableAscii(id)) {
      return InvalidArgumentError("request_id must be 1.." + std::to_string(kMaxRequestIdChars) +
                                  " printable ASCII characters, got " + QuoteForError(id));
    }
    req->request_id = id;
  }
  RETURN_IF_ERROR_(CheckIgnoredFields(doc));
  RETURN_IF_ERROR_(ParseSampling(doc, req));

  if (auto it = doc.find("kv_transfer_params"); it != doc.end() && !it->is_null()) {
    if (!it->is_object()) return TypeError("kv_transfer_params", "an object or null", *it);
    RETURN_IF_ERROR_(ParseKvTransferParams(*it, req));
  }
  return Status::Ok();
}

}  // namespace

ParseLimits ParseLimitsFor(const engine::ModelShape& shape, size_t max_body_bytes) {
  ParseLimits l;
  l.model_name = shape.name;
  l.vocab = shape.vocab;
  l.max_context = shape.max_context;
  l.max_body_bytes = max_body_bytes;
  l.max_prompt_tokens = shape.max_context > 0 ? shape.max_context - 1 : 0;
  return l;
}

Result<json> ParseBodyObject(std::string_view body, const ParseLimits& limits) {
  if (body.size() > limits.max_body_bytes) {
    return Status(StatusCode::kResourceExhausted,
                  "request body is " + std::to_string(body.size()) + " bytes; the limit is " +
                      std::to_string(limits.max_body_bytes) + " bytes");
  }
  Result<json> parsed = ParseJsonBody(body);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->is_object()) {
    return InvalidArgumentError("body must be a JSON object (got " + JsonTypeName(*parsed) +
                                ")");
  }
  return parsed;
}

Result<CompletionRequest> ParseCompletionRequest(std::string_view body,
                                                 const ParseLimits& limits) {
  Result<json> doc = ParseBodyObject(body, limits);
  if (!doc.ok()) return doc.status();
  return ParseCompletionDocument(*doc, limits);
}

Result<CompletionRequest> ParseCompletionDocument(const json& doc, const ParseLimits& limits,
                                                  const char* max_tokens_field) {
  CompletionRequest req;
  Status s = ParseFields(doc, limits, max_tokens_field, &req);
  if (!s.ok()) return s;
  return req;
}

int HttpStatusForParseError(const Status& status) {
  return status.code() == StatusCode::kResourceExhausted ? 413 : 400;
}

std::string_view ParseErrorLimit(const Status& status) {
  if (status.code() == StatusCode::kResourceExhausted) return "body_bytes";
  if (status.code() == StatusCode::kOutOfRange &&
      status.message().find(kPromptLimitTag) != std::string::npos) {
    return "prompt_tokens";
  }
  return {};
}

#undef RETURN_IF_ERROR_

}  // namespace kvrelay::server
