// admin_auth.cc — see admin_auth.h.
#include "server/admin_auth.h"

#include <cctype>

#include "base/hmac.h"
#include "base/sha256.h"
#include "os/clock.h"
#include "os/os_random.h"

namespace kvrelay::server {

std::string AdminRequestMac(std::string_view token, std::string_view nonce_hex,
                            std::string_view method, std::string_view target,
                            std::string_view body) {
  HmacSha256 h(token);
  h.Update(std::string_view("kvrelay-admin-v1\n"));
  h.Update(nonce_hex);
  h.Update(std::string_view("\n"));
  h.Update(method);
  h.Update(std::string_view("\n"));
  h.Update(target);
  h.Update(std::string_view("\n"));
  h.Update(HexOf(Sha256::Hash(body)));
  return HexOf(h.Final());
}

std::string AdminAuthorization(std::string_view token, std::string_view nonce_hex,
                               std::string_view method, std::string_view target,
                               std::string_view body) {
  return "KVRELAY-HMAC nonce=" + std::string(nonce_hex) +
         ", mac=" + AdminRequestMac(token, nonce_hex, method, target, body);
}

bool ParseAdminAuthorization(std::string_view header, std::string* nonce_hex,
                             std::string* mac_hex) {
  constexpr std::string_view kScheme = "KVRELAY-HMAC ";
  if (header.substr(0, kScheme.size()) != kScheme) return false;
  header.remove_prefix(kScheme.size());
  constexpr std::string_view kNonce = "nonce=", kMac = ", mac=";
  if (header.substr(0, kNonce.size()) != kNonce) return false;
  header.remove_prefix(kNonce.size());
  const size_t comma = header.find(kMac);
  if (comma == std::string_view::npos) return false;
  *nonce_hex = std::string(header.substr(0, comma));
  *mac_hex = std::string(header.substr(comma + kMac.size()));
  std::array<uint8_t, 16> n;
  std::array<uint8_t, 32> m;
  return ParseHex(*nonce_hex, n) && ParseHex(*mac_hex, m);
}

const char* AdminAuthVerdictName(AdminAuthVerdict v) {
  switch (v) {
    case AdminAuthVerdict::kOk: return "ok";
    case AdminAuthVerdict::kMissing: return "missing";
    case AdminAuthVerdict::kMalformed: return "malformed";
    case AdminAuthVerdict::kUnknownNonce: return "unknown_nonce";
    case AdminAuthVerdict::kBadMac: return "bad_mac";
  }
  return "?";
}

AdminAuth::AdminAuth(std::string token, size_t max_nonces, Duration ttl)
    : token_(std::move(token)), ttl_(ttl), nonces_(max_nonces, ttl) {}

std::string AdminAuth::IssueNonce() {
  const std::string nonce = HexOf(kvrelay::NonceFromOs());
  MutexLock lock(&mu_);
  nonces_.Add(nonce, kvrelay::MonoNow());
  return nonce;
}

AdminAuthVerdict AdminAuth::Verify(std::string_view method, std::string_view target,
                                   std::string_view body, std::string_view authorization) {
  if (!enabled()) return AdminAuthVerdict::kOk;
  if (authorization.empty()) return AdminAuthVerdict::kMissing;
  std::string nonce, mac_hex;
  if (!ParseAdminAuthorization(authorization, &nonce, &mac_hex)) {
    return AdminAuthVerdict::kMalformed;
  }
  for (char& c : nonce) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  {
    MutexLock lock(&mu_);
    if (!nonces_.Consume(nonce, kvrelay::MonoNow())) return AdminAuthVerdict::kUnknownNonce;
  }
  std::array<uint8_t, 32> got, want;
  ParseHex(mac_hex, got);
  ParseHex(AdminRequestMac(token_, nonce, method, target, body), want);
  return ConstantTimeEqual(got, want) ? AdminAuthVerdict::kOk : AdminAuthVerdict::kBadMac;
}

}  // namespace kvrelay::server
