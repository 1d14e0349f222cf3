// sha256.h — Sha256: the SHA-256 hash of FIPS 180-4, pure.
//
// Why here, hand-written: kvrelay authenticates its control channel and
// admin calls with HMAC-SHA256 (base/hmac.h) and takes no new library
// dependency for it. It is pure code (bytes in, digest out), so it lives in
// the pure base layer; sha256_test.cc checks it against the FIPS 180-4 /
// NIST example vectors, including a million-byte message and every split of
// the input across Update() calls.
//
// Not hardened against side channels beyond what SHA-256 needs (it has no
// secret-dependent branches or table lookups).
//
// Thread safety: a value type; one object per thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvrelay {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  static constexpr size_t kBlockBytes = 64;
  static constexpr size_t kDigestBytes = 32;

  Sha256();
  void Update(std::span<const uint8_t> data);
  void Update(std::string_view data) {
    Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  }
  // Pads and returns the digest; the object must not be used afterwards
  // (REQUIRES: Final() not called before).
  Sha256Digest Final();

  static Sha256Digest Hash(std::span<const uint8_t> data);
  static Sha256Digest Hash(std::string_view data);

 private:
  void Compress(const uint8_t* block);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, kBlockBytes> buf_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

// Lowercase hex of `bytes` (two digits per byte).
std::string HexOf(std::span<const uint8_t> bytes);
// Parses lowercase or uppercase hex of exactly out.size() bytes.
bool ParseHex(std::string_view hex, std::span<uint8_t> out);

}  // namespace kvrelay
