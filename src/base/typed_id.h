// typed_id.h — TypedId<Tag>: a slot index plus a generation.
//
// Why: handles into slabs (blocks, pulls, writes) outlive the thing they
// name — a completion can arrive after its transfer was aborted and the slot
// reused. The generation makes such a handle detectably stale, so it is
// counted and dropped rather than applied to the wrong owner. Distinct tags
// make a BlockId impossible to pass where a WriteId is expected.
//
// Thread safety: a value type.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kvrelay {

template <typename Tag>
struct TypedId {
  uint32_t index = 0;
  uint32_t generation = 0;

  constexpr auto operator<=>(const TypedId&) const = default;
  constexpr uint64_t Packed() const {
    return (static_cast<uint64_t>(generation) << 32) | index;
  }
  static constexpr TypedId FromPacked(uint64_t v) {
    return TypedId{static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32)};
  }
  std::string ToString() const {
    return std::to_string(index) + "@" + std::to_string(generation);
  }
};

}  // namespace kvrelay

template <typename Tag>
struct std::hash<kvrelay::TypedId<Tag>> {
  size_t operator()(const kvrelay::TypedId<Tag>& id) const noexcept {
    return std::hash<uint64_t>()(id.Packed() * 0x9E3779B97F4A7C15ull);
  }
};
