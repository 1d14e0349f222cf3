// engine_info.h — EngineInfo: what GET /kv_info of an engine says about it,
// and the pure checks the router makes on it (URL form, role fit, agreement
// between engines).
//
// Why: the router learns every engine's engine_id, kv host/port and tp from
// /kv_info and copies them into the D leg's kv_transfer_params; parsing and
// checking that answer is pure so a table of bodies can test it.
//
// Owner: EnginePool keeps one EngineInfo per engine. Thread safety: pure
// functions and value types; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace kvrelay::router {

// Which list of the router an engine was given in.
enum class LegRole : uint8_t { kPrefill, kDecode };

struct EngineInfo {
  uint32_t engine_id = 0;
  uint32_t incarnation = 0;
  std::string role;          // "prefill" | "decode" | "both" | "plain"
  uint32_t tp = 1;
  std::string kv_host;       // where D engines reach this engine's control port
  uint16_t kv_port = 0;
  std::string transport;     // "shm" | "tcp" | "ucx"
  std::string kv_mode = "push";  // "push" | "read" (absent from older engines: push)
  std::string model;
  std::string model_shape;
  uint32_t max_context = 0;

  bool operator==(const EngineInfo&) const = default;
  nlohmann::json ToJson() const;
};

// Parses a /kv_info body. kInvalidArgument names the missing or mistyped
// field.
Result<EngineInfo> ParseEngineInfo(std::string_view body);

// An engine base URL as the router keeps it: "http://host:port" (no path,
// no trailing slash). Accepts "host:port" (http assumed) and a trailing "/".
// kInvalidArgument for anything else (https, a path, no port, port 0).
Result<std::string> NormalizeEngineUrl(std::string_view url);

// OK if an engine whose /kv_info says `info.role` may serve `as`: prefill
// legs need "prefill" or "both", decode legs "decode" or "both".
// kFailedPrecondition with a message naming `url` otherwise.
Status CheckRoleFits(const std::string& url, const EngineInfo& info, LegRole as);

}  // namespace kvrelay::router
