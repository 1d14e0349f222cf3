// transfer_id.h — TransferId: the router's name for one P→D hand-off.
//
// Why: P and D each have their own request ids; the transfer_id is the one
// name both share. It is 128 bits so that, when drawn from the OS at the
// edge (router), it cannot be guessed by a peer. Pure code never draws one
// from the OS; tests and the simulator build them from their seeded Prng.
//
// Thread safety: a value type.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kvrelay {

struct TransferId {
  uint64_t hi = 0;
  uint64_t lo = 0;

  constexpr auto operator<=>(const TransferId&) const = default;
  constexpr bool IsZero() const { return hi == 0 && lo == 0; }
  // 32 lowercase hex digits.
  std::string ToString() const;
  // Parses the 32-hex-digit form; false on anything else.
  static bool Parse(const std::string& s, TransferId* out);
};

}  // namespace kvrelay

template <>
struct std::hash<kvrelay::TransferId> {
  size_t operator()(const kvrelay::TransferId& t) const noexcept {
    uint64_t h = t.hi * 0x9E3779B97F4A7C15ull ^ (t.lo + 0x632BE59BD9B4E019ull);
    h ^= h >> 29;
    return static_cast<size_t>(h * 0xBF58476D1CE4E5B9ull);
  }
};
