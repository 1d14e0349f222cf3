// prng.h — Prng: a seeded, bit-reproducible pseudo-random generator.
//
// Why: every randomized test and every simulator run must replay from its
// seed, on any compiler. std::uniform_int_distribution and friends are
// implementation-defined, so pure code draws only through this class:
// xoshiro256** seeded by splitmix64, with bounded draws by Lemire's
// multiply-shift and rejection (exact and portable).
//
// Thread safety: none; each owner holds its own Prng.
#pragma once

#include <cstdint>

namespace kvrelay {

class Prng {
 public:
  explicit Prng(uint64_t seed);

  uint64_t Next64();
  // Uniform in [0, n). REQUIRES: n > 0.
  uint64_t Uniform(uint64_t n);
  // Uniform in [lo, hi]. REQUIRES: lo <= hi.
  int64_t Range(int64_t lo, int64_t hi);
  // True with probability num/den. den > 0; num may be 0 (never) or >= den.
  bool Chance(uint64_t num, uint64_t den);
  // True with probability 1/n.
  bool OneIn(uint64_t n) { return Uniform(n) == 0; }
  // A new generator whose stream is independent of this one's future draws.
  Prng Fork();

 private:
  uint64_t s_[4];
};

// splitmix64 step: also a good 64-bit mixing function for hashing.
uint64_t Mix64(uint64_t x);

}  // namespace kvrelay
