// admin_auth.h — AdminAuth: proof of the shared secret on admin HTTP calls.
//
// Why: pause, sleep, abort, update_weights, /debug/state ... change or
// reveal an engine's state; with `--auth-token-file` set, only a caller
// holding the token may use them, and the token never crosses the wire.
//
// Protocol (docs/http.md, "Authentication"):
//   GET /auth/nonce → {"nonce": "<32 hex>", "expires_in_s": 30}
//   then the call with the header
//   Authorization: KVRELAY-HMAC nonce=<hex>, mac=<hex>
//   mac = hex(HMAC-SHA256(token, "kvrelay-admin-v1\n" nonce "\n" METHOD "\n"
//             target "\n" hex(SHA-256(body))))
// where target is the request target as sent (path and query, e.g.
// "/pause?mode=abort"). A nonce is accepted once and for `ttl` only
// (NonceStore), so a recorded call cannot be replayed.
//
// The pure pieces (AdminRequestMac, the header format) are shared with the
// clients (bench/control_call, the load generator, tests).
//
// Threading: AdminAuth is thread-safe (HTTP handler threads).
#pragma once

#include <string>
#include <string_view>

#include "base/mutex.h"
#include "server/nonce_store.h"

namespace kvrelay::server {

std::string AdminRequestMac(std::string_view token, std::string_view nonce_hex,
                            std::string_view method, std::string_view target,
                            std::string_view body);
// "KVRELAY-HMAC nonce=<nonce_hex>, mac=<AdminRequestMac(...)>".
std::string AdminAuthorization(std::string_view token, std::string_view nonce_hex,
                               std::string_view method, std::string_view target,
                               std::string_view body);
// Splits a header of that form; false if it is not one.
bool ParseAdminAuthorization(std::string_view header, std::string* nonce_hex,
                             std::string* mac_hex);

enum class AdminAuthVerdict : uint8_t { kOk, kMissing, kMalformed, kUnknownNonce, kBadMac };
inline constexpr int kAdminAuthVerdicts = 5;
const char* AdminAuthVerdictName(AdminAuthVerdict v);  // ok, missing, malformed, ...

class AdminAuth {
 public:
  // An empty token disables the check (every call is kOk).
  explicit AdminAuth(std::string token, size_t max_nonces = 1024,
                     Duration ttl = Duration::Seconds(30));
  bool enabled() const { return !token_.empty(); }
  Duration ttl() const { return ttl_; }

  // A fresh nonce (16 bytes from the OS, hex), remembered for `ttl`.
  std::string IssueNonce();
  // Checks `authorization` (the header's value, empty if absent) for this
  // request; consumes the nonce it names whatever the outcome.
  AdminAuthVerdict Verify(std::string_view method, std::string_view target,
                          std::string_view body, std::string_view authorization);

 private:
  const std::string token_;
  const Duration ttl_;
  Mutex mu_;
  NonceStore nonces_ GUARDED_BY(mu_);
};

}  // namespace kvrelay::server
