// byte_codec.h — little-endian fields in bytes: PutLe/GetLe/AppendLe, a
// ByteWriter that appends them, a bounds-checked ByteReader, and FNV-1a-64.
//
// Why one: the control channel's wire codec (core/wire.cc), the transports'
// registrations and frames (net/) and the local lane all encode integers the
// same way; one codec means one place where a bound is checked. Fields are
// little-endian on every host.
//
// A ByteReader never reads past its input: a read that would sets bad() and
// yields zero (or false), and every later read fails too, so a decoder can
// read a whole header and check bad() once.
//
// Thread safety: value types and pure functions; one reader per thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvrelay {

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

// FNV-1a, 64 bit.
inline uint64_t Fnv1a64(std::span<const uint8_t> bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}
inline uint64_t Fnv1a64(std::string_view bytes) {
  return Fnv1a64(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                          bytes.size()));
}

// Appends fields to a vector it does not own.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(v); }
  void U16(uint16_t v) { AppendLe(*out_, v, 2); }
  void U32(uint32_t v) { AppendLe(*out_, v, 4); }
  void U64(uint64_t v) { AppendLe(*out_, v, 8); }
  void Bytes(std::span<const uint8_t> b) { out_->insert(out_->end(), b.begin(), b.end()); }

 private:
  std::vector<uint8_t>* out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
  // A `bytes`-wide little-endian field (1..8).
  uint64_t Get(int bytes) {
    if (!Have(static_cast<size_t>(bytes))) return 0;
    const uint64_t v = GetLe(in_.data() + pos_, bytes);
    pos_ += static_cast<size_t>(bytes);
    return v;
  }
  uint8_t U8() { return static_cast<uint8_t>(Get(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Get(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Get(4)); }
  uint64_t U64() { return Get(8); }
  std::string GetString(size_t n) {
    if (!Have(n)) return {};
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  bool Take(size_t n, std::vector<uint8_t>* out) {
    if (!Have(n)) return false;
    out->assign(in_.begin() + static_cast<std::ptrdiff_t>(pos_),
                in_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return true;
  }
  template <size_t N>
  bool Fixed(std::array<uint8_t, N>* out) {
    if (!Have(N)) return false;
    std::memcpy(out->data(), in_.data() + pos_, N);
    pos_ += N;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return in_.size() - pos_; }
  bool AtEnd() const { return pos_ == in_.size(); }
  bool ok() const { return !bad_; }
  bool bad() const { return bad_; }

 private:
  bool Have(size_t n) {
    if (bad_ || in_.size() - pos_ < n) {
      bad_ = true;
      return false;
    }
    return true;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool bad_ = false;
};

}  // namespace kvrelay
