#include "server/admin_call.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <utility>

#include <nlohmann/json.hpp>

#include "server/json_body.h"

namespace kvrelay::server {
namespace {

using engine::PauseMode;
using nlohmann::json;

std::string Join(std::initializer_list<std::string_view> names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

bool IsBlank(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; });
}

Status ParseMode(std::string_view name, std::string_view value, PauseMode* out) {
  if (value == "abort") {
    *out = PauseMode::kAbort;
  } else if (value == "wait") {
    *out = PauseMode::kWait;
  } else if (value == "keep") {
    *out = PauseMode::kKeep;
  } else {
    return InvalidArgumentError(std::string(name) + " must be abort, wait or keep; got " +
                                QuoteForError(value));
  }
  return Status::Ok();
}

Status ParseBool(std::string_view name, std::string_view value, bool* out) {
  std::string lower(value);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "true" || lower == "1") {
    *out = true;
  } else if (lower == "false" || lower == "0") {
    *out = false;
  } else {
    return InvalidArgumentError(std::string(name) + " must be true, false, 1 or 0; got " +
                                QuoteForError(value));
  }
  return Status::Ok();
}

// Refuses query parameters other than `allowed`.
Status CheckQuery(std::string_view path, const std::map<std::string, std::string>& query,
                  std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : query) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    if (allowed.size() == 0) {
      return InvalidArgumentError("POST " + std::string(path) +
                                  " takes no query parameters; got " + QuoteForError(key));
    }
    return InvalidArgumentError("unknown query parameter " + QuoteForError(key) + " for POST " +
                                std::string(path) + "; allowed: " + Join(allowed));
  }
  return Status::Ok();
}

// Query-only endpoints: the body must say nothing (empty, blank, {} or null).
Status CheckNoBody(std::string_view path, std::string_view body) {
  if (IsBlank(body)) return Status::Ok();
  Result<json> j = ParseJsonBody(body);
  if (j.ok() && (j->is_null() || (j->is_object() && j->empty()))) return Status::Ok();
  return InvalidArgumentError("POST " + std::string(path) +
                              " takes its arguments in the query string, not in a body (got " +
                              std::to_string(body.size()) + " bytes of body)");
}

// Body endpoints: a JSON object whose keys are all in `allowed`.
Result<json> BodyObject(std::string_view path, std::string_view body,
                        std::initializer_list<std::string_view> allowed,
                        std::string_view example) {
  if (IsBlank(body)) {
    return InvalidArgumentError("POST " + std::string(path) + " needs a JSON body, e.g. " +
                                std::string(example));
  }
  Result<json> parsed = ParseJsonBody(body);
  if (!parsed.ok()) return parsed.status();
  json j = std::move(*parsed);
  if (!j.is_object()) {
    return InvalidArgumentError("body must be a JSON object (got " + JsonTypeName(j) + "), e.g. " +
                                std::string(example));
  }
  for (const auto& [key, value] : j.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return InvalidArgumentError("unknown field " + QuoteForError(key) + " in the body of POST " +
                                  std::string(path) + "; allowed: " + Join(allowed));
    }
  }
  return j;
}

#define RETURN_IF_ERROR_(expr)          \
  do {                                  \
    Status status_ = (expr);            \
    if (!status_.ok()) return status_;  \
  } while (0)

using Query = std::map<std::string, std::string>;

Result<AdminCall> Pause(std::string_view path, const Query& q, std::string_view body) {
  RETURN_IF_ERROR_(CheckQuery(path, q, {"mode", "clear_cache"}));
  RETURN_IF_ERROR_(CheckNoBody(path, body));
  PauseCall c;
  if (auto it = q.find("mode"); it != q.end()) RETURN_IF_ERROR_(ParseMode("mode", it->second, &c.mode));
  if (auto it = q.find("clear_cache"); it != q.end()) {
    RETURN_IF_ERROR_(ParseBool("clear_cache", it->second, &c.clear_cache));
  }
  return AdminCall(c);
}

Result<AdminCall> Sleep(std::string_view path, const Query& q, std::string_view body) {
  RETURN_IF_ERROR_(CheckQuery(path, q, {"level", "mode"}));
  RETURN_IF_ERROR_(CheckNoBody(path, body));
  SleepCall c;
  if (auto it = q.find("level"); it != q.end()) {
    const std::string& v = it->second;
    if (v != "0" && v != "1" && v != "2") {
      return InvalidArgumentError("level must be 0, 1 or 2; got " + QuoteForError(v));
    }
    c.level = static_cast<uint32_t>(v[0] - '0');
  }
  if (auto it = q.find("mode"); it != q.end()) RETURN_IF_ERROR_(ParseMode("mode", it->second, &c.mode));
  return AdminCall(c);
}

Result<AdminCall> ResetPrefixCache(std::string_view path, const Query& q,
                                   std::string_view body) {
  RETURN_IF_ERROR_(CheckQuery(path, q, {"reset_running_requests"}));
  RETURN_IF_ERROR_(CheckNoBody(path, body));
  ResetPrefixCacheCall c;
  if (auto it = q.find("reset_running_requests"); it != q.end()) {
    RETURN_IF_ERROR_(ParseBool("reset_running_requests", it->second, &c.reset_running_requests));
  }
  return AdminCall(c);
}

template <typename Call>
Result<AdminCall> NoArguments(std::string_view path, const Query& q, std::string_view body) {
  RETURN_IF_ERROR_(CheckQuery(path, q, {}));
  RETURN_IF_ERROR_(CheckNoBody(path, body));
  return AdminCall(Call{});
}

Result<AdminCall> AbortRequests(std::string_view path, const Query& q, std::string_view body) {
  RETURN_IF_ERROR_(CheckQuery(path, q, {}));
  Result<json> j = BodyObject(path, body, {"request_ids"},
                              R"({"request_ids": ["id", ...]}, or {} to abort every request)");
  if (!j.ok()) return j.status();
  AbortRequestsCall c;
  auto it = j->find("request_ids");
  if (it == j->end()) {
    c.all = true;
    return AdminCall(std::move(c));
  }
  if (!it->is_array()) {
    return InvalidArgumentError("request_ids must be an array of strings (got " +
                                JsonTypeName(*it) + "); send {} to abort every request");
  }
  c.request_ids.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    if (!e.is_string()) {
      return InvalidArgumentError("request_ids[" + std::to_string(i) + "] must be a string (got " +
                                  JsonTypeName(e) + ")");
    }
    c.request_ids.push_back(e.get<std::string>());
  }
  return AdminCall(std::move(c));
}

Result<AdminCall> UpdateWeights(std::string_view path, const Query& q, std::string_view body) {
  RETURN_IF_ERROR_(CheckQuery(path, q, {}));
  Result<json> j = BodyObject(path, body, {"version", "mode"},
                              R"({"version": 2, "mode": "abort"})");
  if (!j.ok()) return j.status();
  UpdateWeightsCall c;
  auto v = j->find("version");
  if (v == j->end() || v->is_null()) {
    return InvalidArgumentError("version is required: the weights version to load, an integer >= 1");
  }
  if (!v->is_number_integer()) {
    return InvalidArgumentError("version must be an integer >= 1 (got " + JsonTypeName(*v) + ")");
  }
  if (!v->is_number_unsigned() || v->get<uint64_t>() == 0) {
    return InvalidArgumentError("version must be an integer >= 1; got " + v->dump());
  }
  c.version = v->get<uint64_t>();
  if (auto m = j->find("mode"); m != j->end() && !m->is_null()) {
    if (!m->is_string()) {
      return InvalidArgumentError("mode must be a string: abort, wait or keep (got " +
                                  JsonTypeName(*m) + ")");
    }
    RETURN_IF_ERROR_(ParseMode("mode", m->get_ref<const std::string&>(), &c.mode));
  }
  return AdminCall(c);
}

#undef RETURN_IF_ERROR_

}  // namespace

Result<AdminCall> ParseAdminCall(std::string_view path,
                                 const std::map<std::string, std::string>& query,
                                 std::string_view body) {
  if (path == "/pause") return Pause(path, query, body);
  if (path == "/resume") return NoArguments<ResumeCall>(path, query, body);
  if (path == "/sleep") return Sleep(path, query, body);
  if (path == "/wake_up") return NoArguments<WakeUpCall>(path, query, body);
  if (path == "/reset_prefix_cache") return ResetPrefixCache(path, query, body);
  if (path == "/release_kv_cache_memory") {
    return NoArguments<ReleaseKvCacheMemoryCall>(path, query, body);
  }
  if (path == "/abort_requests") return AbortRequests(path, query, body);
  if (path == "/update_weights") return UpdateWeights(path, query, body);
  return NotFoundError("no admin endpoint " + QuoteForError(path));
}

Result<AdminCall> ParseAdminRequest(std::string_view path,
                                    const std::multimap<std::string, std::string>& params,
                                    std::string_view body) {
  std::map<std::string, std::string> query;
  for (const auto& [key, value] : params) {
    if (!query.emplace(key, value).second) {
      return InvalidArgumentError("query parameter " + QuoteForError(key) +
                                  " is given more than once");
    }
  }
  return ParseAdminCall(path, query, body);
}

std::string_view AdminCallName(const AdminCall& call) {
  struct Namer {
    std::string_view operator()(const PauseCall&) const { return "pause"; }
    std::string_view operator()(const ResumeCall&) const { return "resume"; }
    std::string_view operator()(const SleepCall&) const { return "sleep"; }
    std::string_view operator()(const WakeUpCall&) const { return "wake_up"; }
    std::string_view operator()(const ResetPrefixCacheCall&) const {
      return "reset_prefix_cache";
    }
    std::string_view operator()(const ReleaseKvCacheMemoryCall&) const {
      return "release_kv_cache_memory";
    }
    std::string_view operator()(const AbortRequestsCall&) const { return "abort_requests"; }
    std::string_view operator()(const UpdateWeightsCall&) const { return "update_weights"; }
  };
  return std::visit(Namer{}, call);
}

std::string_view PauseModeName(engine::PauseMode mode) {
  switch (mode) {
    case PauseMode::kAbort: return "abort";
    case PauseMode::kWait: return "wait";
    case PauseMode::kKeep: return "keep";
  }
  return "abort";
}

const std::vector<std::string_view>& AdminPaths() {
  static const std::vector<std::string_view> kPaths = {
      "/pause", "/resume", "/sleep", "/wake_up", "/reset_prefix_cache",
      "/release_kv_cache_memory", "/abort_requests", "/update_weights"};
  return kPaths;
}

}  // namespace kvrelay::server
