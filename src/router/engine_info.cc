#include "router/engine_info.h"

#include <charconv>

namespace kvrelay::router {

using nlohmann::json;

json EngineInfo::ToJson() const {
  return json{{"engine_id", engine_id},     {"incarnation", incarnation},
              {"role", role},               {"tp", tp},
              {"kv_host", kv_host},         {"kv_port", kv_port},
              {"transport", transport},     {"kv_mode", kv_mode},
              {"model", model},
              {"model_shape", model_shape}, {"max_context", max_context}};
}

namespace {

Status FieldError(const char* field, const char* want) {
  return InvalidArgumentError(std::string("/kv_info: \"") + field + "\" must be " + want);
}

bool GetUint(const json& j, const char* field, uint64_t max, uint64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_number_unsigned()) return false;
  const uint64_t v = it->get<uint64_t>();
  if (v > max) return false;
  *out = v;
  return true;
}

bool GetString(const json& j, const char* field, std::string* out) {
  auto it = j.find(field);
  if (it == j.end() || !it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

}  // namespace

Result<EngineInfo> ParseEngineInfo(std::string_view body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError("/kv_info: the body is not a JSON object");
  }
  EngineInfo info;
  uint64_t v = 0;
  if (!GetUint(j, "engine_id", UINT32_MAX, &v)) return FieldError("engine_id", "a uint32");
  info.engine_id = static_cast<uint32_t>(v);
  if (!GetUint(j, "incarnation", UINT32_MAX, &v)) return FieldError("incarnation", "a uint32");
  info.incarnation = static_cast<uint32_t>(v);
  if (!GetString(j, "role", &info.role)) return FieldError("role", "a string");
  if (!GetUint(j, "tp", 64, &v) || v == 0) return FieldError("tp", "an integer in 1..64");
  info.tp = static_cast<uint32_t>(v);
  if (!GetString(j, "kv_host", &info.kv_host) || info.kv_host.empty()) {
    return FieldError("kv_host", "a non-empty string");
  }
  if (!GetUint(j, "kv_port", 65535, &v) || v == 0) {
    return FieldError("kv_port", "an integer in 1..65535");
  }
  info.kv_port = static_cast<uint16_t>(v);
  if (!GetString(j, "transport", &info.transport)) return FieldError("transport", "a string");
  if (j.contains("kv_mode")) {
    if (!GetString(j, "kv_mode", &info.kv_mode) ||
        (info.kv_mode != "push" && info.kv_mode != "read")) {
      return FieldError("kv_mode", "\"push\" or \"read\"");
    }
  }
  if (!GetString(j, "model", &info.model)) return FieldError("model", "a string");
  if (!GetString(j, "model_shape", &info.model_shape)) {
    return FieldError("model_shape", "a string");
  }
  if (!GetUint(j, "max_context", UINT32_MAX, &v)) return FieldError("max_context", "a uint32");
  info.max_context = static_cast<uint32_t>(v);
  return info;
}

Result<std::string> NormalizeEngineUrl(std::string_view url) {
  const std::string original(url);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("engine URL \"" + original + "\": " + why +
                                " (want http://HOST:PORT)");
  };
  if (url.starts_with("http://")) {
    url.remove_prefix(7);
  } else if (url.find("://") != std::string_view::npos) {
    return bad("only http:// is supported");
  }
  while (url.ends_with("/")) url.remove_suffix(1);
  if (url.find('/') != std::string_view::npos) return bad("a path is not allowed");
  const size_t colon = url.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return bad("host and port are required");
  const std::string_view host = url.substr(0, colon);
  const std::string_view port_text = url.substr(colon + 1);
  for (char c : host) {
    if (c <= ' ' || c > '~') return bad("the host has a space or a non-ASCII character");
  }
  uint32_t port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
      port > 65535) {
    return bad("the port must be 1..65535");
  }
  return "http://" + std::string(host) + ":" + std::to_string(port);
}

Status CheckRoleFits(const std::string& url, const EngineInfo& info, LegRole as) {
  const bool fits = as == LegRole::kPrefill ? (info.role == "prefill" || info.role == "both")
                                            : (info.role == "decode" || info.role == "both");
  if (fits) return Status::Ok();
  return FailedPreconditionError(
      std::string("engine ") + url + " has role \"" + info.role + "\" but was given as " +
      (as == LegRole::kPrefill ? "--prefill (needs role prefill or both)"
                               : "--decode (needs role decode or both)"));
}

}  // namespace kvrelay::router
