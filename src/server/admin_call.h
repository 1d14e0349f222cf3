// admin_call.h — ParseAdminCall: the inputs of the engine server's admin
// endpoints (vLLM's names) turned into one checked value, AdminCall.
//
// Why: the admin endpoints drive the engine's lifecycle operations, where a
// misread argument is expensive (a mistyped mode aborting every request
// instead of waiting for them). So parsing is strict: unknown query
// parameters, unknown body fields and bodies sent to query-only endpoints
// are refused rather than ignored. docs/http.md is the user reference.
//
//   POST /pause?mode=abort|wait|keep&clear_cache=BOOL   (abort, false)
//   POST /resume
//   POST /sleep?level=0|1|2&mode=abort|wait|keep        (1, abort)
//   POST /wake_up
//   POST /reset_prefix_cache?reset_running_requests=BOOL (false)
//   POST /release_kv_cache_memory
//   POST /abort_requests   body {"request_ids": [...]} | {} (all)
//   POST /update_weights   body {"version": N >= 1, "mode": "abort"|"wait"|"keep"}
//
// BOOL is true/false (any letter case) or 1/0. Query-only endpoints accept
// an empty body, or one that is only whitespace, {} or null.
//
// Errors: kNotFound for a path that is not an admin endpoint (HTTP 404);
// kInvalidArgument for anything else, naming the parameter and the values
// allowed (HTTP 400).
//
// Thread safety: pure functions and value types; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.h"
#include "engine/engine.h"

namespace kvrelay::server {

struct PauseCall {
  engine::PauseMode mode = engine::PauseMode::kAbort;
  bool clear_cache = false;
};
struct ResumeCall {};
struct SleepCall {
  uint32_t level = 1;   // 0, 1 or 2
  engine::PauseMode mode = engine::PauseMode::kAbort;
};
struct WakeUpCall {};
struct ResetPrefixCacheCall {
  bool reset_running_requests = false;
};
struct ReleaseKvCacheMemoryCall {};
struct AbortRequestsCall {
  bool all = false;                       // {}: every request
  std::vector<std::string> request_ids;   // else these (may be empty)
};
struct UpdateWeightsCall {
  uint64_t version = 1;   // >= 1
  engine::PauseMode mode = engine::PauseMode::kAbort;
};

using AdminCall = std::variant<PauseCall, ResumeCall, SleepCall, WakeUpCall,
                               ResetPrefixCacheCall, ReleaseKvCacheMemoryCall,
                               AbortRequestsCall, UpdateWeightsCall>;

// `path` is the request path without the query string ("/pause"); `query`
// its decoded parameters; `body` the raw request body.
Result<AdminCall> ParseAdminCall(std::string_view path,
                                 const std::map<std::string, std::string>& query,
                                 std::string_view body);

// The query parameters as the HTTP layer hands them over
// (http::Request::query: a key may come more than once), checked and flattened: a repeated
// parameter is refused (kInvalidArgument naming it), so "mode=wait&mode=abort"
// is never read as either. Then ParseAdminCall. The handler and
// fuzz/admin_call_fuzz.cc call this.
Result<AdminCall> ParseAdminRequest(std::string_view path,
                                    const std::multimap<std::string, std::string>& params,
                                    std::string_view body);

// The endpoint's name without the slash ("pause", "update_weights", ...),
// for logs and metric labels.
std::string_view AdminCallName(const AdminCall& call);

// "abort", "wait" or "keep".
std::string_view PauseModeName(engine::PauseMode mode);

// Every admin path, in the order above (for routing).
const std::vector<std::string_view>& AdminPaths();

}  // namespace kvrelay::server
