// control_call.h — ControlCall: a lifecycle call the load generator lands
// while its load runs, parsed from `--control "CALL:k=v,...@Ts"`.
//
//   pause:mode=abort,target=p@3s        POST /pause?mode=abort on every P at 3 s
//   sleep:level=1,target=d@2.5s         POST /sleep?level=1 on every D
//   reset_prefix_cache:target=all@4s
//   update_weights:version=2,target=all@3s   (JSON body {"version": 2, ...})
//   abort_requests:target=p@3s          (body {}: every request)
//   abort_requests:some=1,target=d@3s   (the even-numbered requests in flight)
//
// Keys other than `target`, `order`, `gap_ms` and `resume_after_ms` become
// query parameters (or body fields for update_weights). `target`: p | d |
// all (default p). On `all`, `order` says which side is called first:
// d-first (default), p-first or together; the second side is called
// `gap_ms` (default 20) later. Every order must return promptly.
// `resume_after_ms` after a call returned (default 200; -1: never), every
// target left paused gets /resume and every one asleep or with its KV
// released gets /wake_up, so the load can finish.
//
// Authentication: with a token (`--auth-token-file`), every admin call and
// /debug/* read is signed — AdminAuthorizationFor() fetches a nonce from
// the engine's GET /auth/nonce and returns the Authorization header value
// (server/admin_auth.h; the token itself never crosses the wire).
//
// Thread safety: a value type; AdminAuthorizationFor from any thread.
#pragma once

#include <map>
#include <string>

#include "base/result.h"

namespace kvrelay {

struct ControlCall {
  std::string call;                            // admin path without '/'
  std::map<std::string, std::string> params;   // query / body fields
  std::string target = "p";                    // p | d | all
  std::string order = "d-first";               // d-first | p-first | together
  int gap_ms = 20;
  double at_s = 0;
  int resume_after_ms = 200;
  std::string ToString() const;
};

Result<ControlCall> ParseControlCall(const std::string& spec);

// The Authorization header value for `method target` with `body` on the
// engine at `engine_url` (e.g. "http://127.0.0.1:8100"), signed with
// `token`. Errors: kUnavailable if the engine cannot give a nonce.
Result<std::string> AdminAuthorizationFor(const std::string& engine_url,
                                          const std::string& token, const std::string& method,
                                          const std::string& target, const std::string& body);

}  // namespace kvrelay
