#include "base/prng.h"

#include "base/check.h"

namespace kvrelay {

namespace {
inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Prng::Prng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) {
    x += 0x9E3779B97F4A7C15ull;
    s = Mix64(x);
  }
}

uint64_t Prng::Next64() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

uint64_t Prng::Uniform(uint64_t n) {
  KV_CHECK_GT(n, 0u);
  // Lemire: the high word of x*n is uniform once the biased low band is
  // rejected. Deterministic given the stream.
  unsigned __int128 m = static_cast<unsigned __int128>(Next64()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(Next64()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

int64_t Prng::Range(int64_t lo, int64_t hi) {
  KV_CHECK_LE(lo, hi);
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  if (span == UINT64_MAX) return static_cast<int64_t>(Next64());
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + Uniform(span + 1));
}

bool Prng::Chance(uint64_t num, uint64_t den) {
  KV_CHECK_GT(den, 0u);
  if (num == 0) return false;
  if (num >= den) return true;
  return Uniform(den) < num;
}

Prng Prng::Fork() { return Prng(Next64()); }

}  // namespace kvrelay
