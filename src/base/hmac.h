// hmac.h — HMAC-SHA256 (RFC 2104 over FIPS 180-4 SHA-256) and a
// constant-time comparison, pure.
//
// Why: a shared secret (`--auth-token-file`) is proved on the control
// channel and on admin HTTP calls by an HMAC over a fresh nonce, never sent
// in clear. hmac_test.cc checks every RFC 4231 HMAC-SHA-256 vector.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "base/sha256.h"

namespace kvrelay {

// Incremental HMAC-SHA256 for messages built from several pieces.
class HmacSha256 {
 public:
  explicit HmacSha256(std::span<const uint8_t> key);
  explicit HmacSha256(std::string_view key)
      : HmacSha256(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(key.data()),
                                            key.size())) {}
  void Update(std::span<const uint8_t> data) { inner_.Update(data); }
  void Update(std::string_view data) { inner_.Update(data); }
  // REQUIRES: called once.
  Sha256Digest Final();

 private:
  Sha256 inner_;
  std::array<uint8_t, Sha256::kBlockBytes> outer_key_{};
};

Sha256Digest HmacSha256Of(std::span<const uint8_t> key, std::span<const uint8_t> data);
Sha256Digest HmacSha256Of(std::string_view key, std::string_view data);

// True iff a and b are equal; the time taken depends only on the sizes, not
// on where they first differ (no early exit).
bool ConstantTimeEqual(std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace kvrelay
