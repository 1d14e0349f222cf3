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

#include "net/transport.h"

namespace kvrelay::net {

inline void PutLe(uint8_t* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t GetLe(const uint8_t* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{in[i]} << (8 * i);
  return v;
}
inline void AppendLe(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Reads little-endian fields; any read past the end sets !ok() for good.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool ok() const { return ok_; }
  bool AtEnd() const { return pos_ == in_.size(); }
  uint64_t Get(int bytes) {
    if (!ok_ || in_.size() - pos_ < static_cast<size_t>(bytes)) {
      ok_ = false;
      return 0;
    }
    const uint64_t v = GetLe(in_.data() + pos_, bytes);
    pos_ += bytes;
    return v;
  }
  std::string GetString(size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// planes × num_blocks × stride; false on zero or overflow.
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
