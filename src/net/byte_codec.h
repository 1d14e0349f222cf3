// byte_codec.h — little-endian field encoding with bounds-checked reads,
// and a region layout's size with overflow checks: what every transport's
// registration codec (shm, tcp) is built from.
//
// Thread safety: pure functions; a Reader is a value owned by one caller.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/byte_codec.h"
#include "net/transport.h"

namespace kvrelay::net {

// The project's one codec (base/byte_codec.h), under the names net uses.
using kvrelay::AppendLe;
using kvrelay::GetLe;
using kvrelay::PutLe;
using Reader = kvrelay::ByteReader;

inline bool LayoutBytes(const RegionLayout& layout, uint64_t* bytes) {
  if (layout.planes == 0 || layout.num_blocks == 0 || layout.block_stride_bytes == 0) {
    return false;
  }
  uint64_t blocks = 0;
  if (__builtin_mul_overflow(layout.planes, uint64_t{layout.num_blocks}, &blocks)) return false;
  if (__builtin_mul_overflow(blocks, layout.block_stride_bytes, bytes)) return false;
  return *bytes <= static_cast<uint64_t>(SIZE_MAX / 2);
}

}  // namespace kvrelay::net
