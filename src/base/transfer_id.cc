#include "base/transfer_id.h"

namespace kvrelay {

std::string TransferId::ToString() const {
  static const char* kHex = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kHex[(hi >> (4 * i)) & 0xF];
    s[31 - i] = kHex[(lo >> (4 * i)) & 0xF];
  }
  return s;
}

bool TransferId::Parse(const std::string& s, TransferId* out) {
  if (s.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    char c = s[i];
    uint64_t v;
    if (c >= '0' && c <= '9') v = static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') v = static_cast<uint64_t>(c - 'a' + 10);
    else return false;
    parts[i / 16] = (parts[i / 16] << 4) | v;
  }
  out->hi = parts[0];
  out->lo = parts[1];
  return true;
}

}  // namespace kvrelay
