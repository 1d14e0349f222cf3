// hmac.cc — HMAC (RFC 2104): H((K ^ opad) || H((K ^ ipad) || m)), keys longer
// than a block hashed first.
#include "base/hmac.h"

namespace kvrelay {

HmacSha256::HmacSha256(std::span<const uint8_t> key) {
  std::array<uint8_t, Sha256::kBlockBytes> k{};
  if (key.size() > Sha256::kBlockBytes) {
    const Sha256Digest d = Sha256::Hash(key);
    std::copy(d.begin(), d.end(), k.begin());
  } else {
    std::copy(key.begin(), key.end(), k.begin());
  }
  std::array<uint8_t, Sha256::kBlockBytes> inner_key;
  for (size_t i = 0; i < k.size(); ++i) {
    inner_key[i] = k[i] ^ 0x36;
    outer_key_[i] = k[i] ^ 0x5c;
  }
  inner_.Update(inner_key);
}

Sha256Digest HmacSha256::Final() {
  const Sha256Digest inner = inner_.Final();
  Sha256 outer;
  outer.Update(outer_key_);
  outer.Update(inner);
  return outer.Final();
}

Sha256Digest HmacSha256Of(std::span<const uint8_t> key, std::span<const uint8_t> data) {
  HmacSha256 h(key);
  h.Update(data);
  return h.Final();
}

Sha256Digest HmacSha256Of(std::string_view key, std::string_view data) {
  HmacSha256 h(key);
  h.Update(data);
  return h.Final();
}

bool ConstantTimeEqual(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace kvrelay
