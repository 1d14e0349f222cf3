#include "bench/control_call.h"

#include <cstdio>
#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "http/http_client.h"
#include "server/admin_auth.h"

namespace kvrelay {

std::string ControlCall::ToString() const {
  std::string s = call + ":";
  bool first = true;
  for (const auto& [k, v] : params) {
    s += (first ? "" : ",") + k + "=" + v;
    first = false;
  }
  char when[32];
  std::snprintf(when, sizeof when, "%g", at_s);
  s += std::string(first ? "" : ",") + "target=" + target;
  if (target == "all" && (order != "d-first" || gap_ms != 20)) {
    s += ",order=" + order + ",gap_ms=" + std::to_string(gap_ms);
  }
  s += std::string("@") + when + "s";
  return s;
}

Result<std::string> AdminAuthorizationFor(const std::string& engine_url,
                                          const std::string& token, const std::string& method,
                                          const std::string& target, const std::string& body) {
  http::ClientOptions opts;
  opts.connect_timeout = Duration::Seconds(5);
  opts.idle_timeout = Duration::Seconds(30);
  Result<http::ClientResponse> r = http::Get(engine_url, "/auth/nonce", opts);
  if (!r.ok() || r->status != 200) {
    return Status(StatusCode::kUnavailable,
                  engine_url + "/auth/nonce: " +
                      (r.ok() ? "HTTP " + std::to_string(r->status) : r.status().message()));
  }
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("nonce") || !j["nonce"].is_string()) {
    return Status(StatusCode::kUnavailable, engine_url + "/auth/nonce: no nonce in the answer");
  }
  return server::AdminAuthorization(token, j["nonce"].get<std::string>(), method, target, body);
}

Result<ControlCall> ParseControlCall(const std::string& spec) {
  static const std::set<std::string> kCalls = {
      "pause",          "resume",         "sleep",          "wake_up",
      "reset_prefix_cache", "release_kv_cache_memory", "abort_requests", "update_weights"};
  ControlCall c;
  const size_t at = spec.rfind('@');
  if (at == std::string::npos) {
    return InvalidArgumentError("--control '" + spec + "': missing '@<seconds>s'");
  }
  std::string when = spec.substr(at + 1);
  if (!when.empty() && when.back() == 's') when.pop_back();
  char* end = nullptr;
  c.at_s = std::strtod(when.c_str(), &end);
  if (when.empty() || end != when.c_str() + when.size() || c.at_s < 0) {
    return InvalidArgumentError("--control '" + spec + "': bad time '" + spec.substr(at + 1) +
                                "' (want e.g. 3s)");
  }
  const std::string head = spec.substr(0, at);
  const size_t colon = head.find(':');
  c.call = head.substr(0, colon);
  if (!kCalls.count(c.call)) {
    return InvalidArgumentError("--control '" + spec + "': unknown call '" + c.call +
                                "' (pause, resume, sleep, wake_up, reset_prefix_cache, "
                                "release_kv_cache_memory, abort_requests, update_weights)");
  }
  if (colon != std::string::npos) {
    std::string rest = head.substr(colon + 1);
    size_t pos = 0;
    while (pos <= rest.size() && !rest.empty()) {
      size_t comma = rest.find(',', pos);
      if (comma == std::string::npos) comma = rest.size();
      const std::string kv = rest.substr(pos, comma - pos);
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        return InvalidArgumentError("--control '" + spec + "': '" + kv + "' is not key=value");
      }
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (k == "target") {
        if (v != "p" && v != "d" && v != "all") {
          return InvalidArgumentError("--control '" + spec + "': target must be p, d or all");
        }
        c.target = v;
      } else if (k == "order") {
        if (v != "d-first" && v != "p-first" && v != "together") {
          return InvalidArgumentError("--control '" + spec +
                                      "': order must be d-first, p-first or together");
        }
        c.order = v;
      } else if (k == "gap_ms") {
        char* e = nullptr;
        const long g = std::strtol(v.c_str(), &e, 10);
        if (v.empty() || *e != '\0' || g < 0 || g > 600000) {
          return InvalidArgumentError("--control '" + spec +
                                      "': gap_ms must be a whole number of ms, 0..600000");
        }
        c.gap_ms = static_cast<int>(g);
      } else if (k == "resume_after_ms") {
        c.resume_after_ms = std::atoi(v.c_str());
      } else {
        c.params[k] = v;
      }
      pos = comma + 1;
      if (comma == rest.size()) break;
    }
  }
  return c;
}

}  // namespace kvrelay
