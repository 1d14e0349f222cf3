#include "base/prng.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

namespace kvrelay {
namespace {

// ---------------------------------------------------------------------------
// Bit-exactness: these values were computed once from the implementation
// (xoshiro256** seeded by splitmix64) and must never change, on any compiler:
// every committed regression seed and simulator replay depends on them.

TEST(PrngTest, SeedZeroStreamIsBitExact) {
  constexpr std::array<uint64_t, 8> kExpected = {
      0x422ea740d0977210ull, 0xe062b061b42e2928ull, 0x5a071fc5930841b6ull,
      0x01334ef8ed3cc2bdull, 0xe45cbd6a2d9e96dbull, 0x3bc1fe841a5f292full,
      0x60001d95ebbbd8e6ull, 0xa0aee00b5b303762ull,
  };
  Prng p(0);
  for (size_t i = 0; i < kExpected.size(); ++i) {
    EXPECT_EQ(p.Next64(), kExpected[i]) << "draw " << i;
  }
}

TEST(PrngTest, Seed42StreamIsBitExact) {
  constexpr std::array<uint64_t, 8> kExpected = {
      0xbe15272cdf80b6c2ull, 0xaf6e2ee49ff5d0e3ull, 0xca56edd0338a318full,
      0x4945f1d915ae1af2ull, 0x0ddbfbac9994b020ull, 0x3427202c1d3400bcull,
      0xde14ff6e4026b899ull, 0x0b6b22a8945cbe3full,
  };
  Prng p(42);
  for (size_t i = 0; i < kExpected.size(); ++i) {
    EXPECT_EQ(p.Next64(), kExpected[i]) << "draw " << i;
  }
}

TEST(PrngTest, SameSeedSameStream) {
  for (uint64_t seed : {0ull, 1ull, 42ull, 0xdeadbeefull, ~0ull}) {
    Prng a(seed);
    Prng b(seed);
    for (int i = 0; i < 1000; ++i) {
      ASSERT_EQ(a.Next64(), b.Next64()) << "seed " << seed << " draw " << i;
    }
  }
}

TEST(PrngTest, SameSeedSameBoundedDraws) {
  Prng a(7);
  Prng b(7);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(a.Uniform(1000), b.Uniform(1000));
    ASSERT_EQ(a.Range(-50, 50), b.Range(-50, 50));
    ASSERT_EQ(a.Chance(1, 3), b.Chance(1, 3));
  }
}

TEST(PrngTest, DifferentSeedsDiffer) {
  // Adjacent seeds must not produce the same or a shifted stream.
  std::set<uint64_t> firsts;
  for (uint64_t seed = 0; seed < 256; ++seed) {
    Prng p(seed);
    firsts.insert(p.Next64());
  }
  EXPECT_EQ(firsts.size(), 256u);

  Prng a(1);
  Prng b(2);
  int equal = 0;
  for (int i = 0; i < 64; ++i) equal += a.Next64() == b.Next64();
  EXPECT_EQ(equal, 0);
}

// ---------------------------------------------------------------------------
// Uniform.

TEST(PrngTest, UniformStaysInRange) {
  const std::vector<uint64_t> ns = {1,       2, 3, 7, uint64_t{1} << 40,
                                    UINT64_MAX};
  Prng p(0x5eed);
  for (uint64_t n : ns) {
    for (int i = 0; i < 100000; ++i) {
      const uint64_t v = p.Uniform(n);
      ASSERT_LT(v, n) << "n=" << n;
    }
  }
}

TEST(PrngTest, UniformOfOneIsZero) {
  Prng p(3);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(p.Uniform(1), 0u);
}

TEST(PrngTest, UniformSmallNHitsEveryValue) {
  Prng p(11);
  for (uint64_t n : {2ull, 3ull, 7ull}) {
    std::vector<int> counts(n, 0);
    constexpr int kDraws = 70000;
    for (int i = 0; i < kDraws; ++i) ++counts[p.Uniform(n)];
    for (uint64_t v = 0; v < n; ++v) {
      // Expected kDraws/n each; a loose bound, not a statistical test.
      const double expected = static_cast<double>(kDraws) / static_cast<double>(n);
      EXPECT_GT(counts[v], expected * 0.9) << "n=" << n << " v=" << v;
      EXPECT_LT(counts[v], expected * 1.1) << "n=" << n << " v=" << v;
    }
  }
}

TEST(PrngTest, UniformLargeNReachesHighHalf) {
  // A draw bounded by a huge n should not be stuck in the low bits.
  Prng p(12);
  for (uint64_t n : {uint64_t{1} << 40, UINT64_MAX}) {
    bool high = false;
    bool low = false;
    for (int i = 0; i < 1000; ++i) {
      const uint64_t v = p.Uniform(n);
      if (v >= n / 2) high = true; else low = true;
    }
    EXPECT_TRUE(high) << "n=" << n;
    EXPECT_TRUE(low) << "n=" << n;
  }
}

// ---------------------------------------------------------------------------
// Range.

TEST(PrngTest, RangeInclusiveBounds) {
  struct Case {
    int64_t lo, hi;
  };
  const std::vector<Case> cases = {
      {0, 0}, {5, 5}, {-5, -5}, {0, 1}, {-3, 3}, {-10, -7}, {-1, 0}, {100, 104},
  };
  Prng p(21);
  for (const Case& c : cases) {
    std::set<int64_t> seen;
    for (int i = 0; i < 20000; ++i) {
      const int64_t v = p.Range(c.lo, c.hi);
      ASSERT_GE(v, c.lo);
      ASSERT_LE(v, c.hi);
      seen.insert(v);
    }
    // Both endpoints (and everything between) are reachable.
    EXPECT_EQ(seen.size(), static_cast<size_t>(c.hi - c.lo + 1))
        << "[" << c.lo << ", " << c.hi << "]";
    EXPECT_EQ(*seen.begin(), c.lo);
    EXPECT_EQ(*seen.rbegin(), c.hi);
  }
}

TEST(PrngTest, RangeExtremes) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Prng p(22);
  // The full span (span + 1 overflows) takes its own path.
  bool neg = false;
  bool pos = false;
  for (int i = 0; i < 1000; ++i) {
    const int64_t v = p.Range(kMin, kMax);
    if (v < 0) neg = true; else pos = true;
  }
  EXPECT_TRUE(neg);
  EXPECT_TRUE(pos);
  for (int i = 0; i < 1000; ++i) {
    const int64_t a = p.Range(kMin, kMin + 1);
    ASSERT_TRUE(a == kMin || a == kMin + 1);
    const int64_t b = p.Range(kMax - 1, kMax);
    ASSERT_TRUE(b == kMax - 1 || b == kMax);
    const int64_t c = p.Range(kMin, -1);
    ASSERT_LT(c, 0);
    const int64_t d = p.Range(0, kMax);
    ASSERT_GE(d, 0);
  }
  EXPECT_EQ(p.Range(kMin, kMin), kMin);
  EXPECT_EQ(p.Range(kMax, kMax), kMax);
}

// ---------------------------------------------------------------------------
// Chance and OneIn.

TEST(PrngTest, ChanceZeroNeverFullAlways) {
  Prng p(31);
  for (uint64_t d :
       {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{1000}, UINT64_MAX}) {
    for (int i = 0; i < 1000; ++i) {
      ASSERT_FALSE(p.Chance(0, d)) << "d=" << d;
      ASSERT_TRUE(p.Chance(d, d)) << "d=" << d;
    }
  }
  // num > den is documented as allowed: always.
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(p.Chance(5, 3));
}

TEST(PrngTest, ChanceHalfIsNearHalf) {
  Prng p(32);
  constexpr int kDraws = 100000;
  int hits = 0;
  for (int i = 0; i < kDraws; ++i) hits += p.Chance(1, 2);
  // Standard deviation ~158; this bound is ~12 sigma wide.
  EXPECT_GT(hits, 48000);
  EXPECT_LT(hits, 52000);
}

TEST(PrngTest, ChanceOneTenthIsNearTenth) {
  Prng p(33);
  constexpr int kDraws = 100000;
  int hits = 0;
  for (int i = 0; i < kDraws; ++i) hits += p.Chance(1, 10);
  EXPECT_GT(hits, 9000);
  EXPECT_LT(hits, 11000);
}

TEST(PrngTest, OneIn) {
  Prng p(34);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(p.OneIn(1));
  constexpr int kDraws = 100000;
  int hits = 0;
  for (int i = 0; i < kDraws; ++i) hits += p.OneIn(4);
  EXPECT_GT(hits, 23000);
  EXPECT_LT(hits, 27000);
  // A huge n almost never fires.
  int rare = 0;
  for (int i = 0; i < 1000; ++i) rare += p.OneIn(UINT64_MAX);
  EXPECT_EQ(rare, 0);
}

// ---------------------------------------------------------------------------
// Fork.

TEST(PrngTest, ForkIsDeterministic) {
  Prng a(41);
  Prng b(41);
  Prng fa = a.Fork();
  Prng fb = b.Fork();
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(fa.Next64(), fb.Next64());
    ASSERT_EQ(a.Next64(), b.Next64());
  }
}

TEST(PrngTest, ForkConsumesOneParentDraw) {
  Prng parent(42);
  Prng copy = parent;
  (void)parent.Fork();
  (void)copy.Next64();
  for (int i = 0; i < 16; ++i) ASSERT_EQ(parent.Next64(), copy.Next64());
}

TEST(PrngTest, ForkStreamIndependentOfParent) {
  Prng parent(43);
  Prng child = parent.Fork();
  std::vector<uint64_t> pv;
  std::vector<uint64_t> cv;
  for (int i = 0; i < 1000; ++i) {
    pv.push_back(parent.Next64());
    cv.push_back(child.Next64());
  }
  // No value in common and not a shifted copy of each other.
  std::set<uint64_t> ps(pv.begin(), pv.end());
  int common = 0;
  for (uint64_t v : cv) common += ps.count(v) != 0;
  EXPECT_EQ(common, 0);
  EXPECT_NE(pv, cv);

  // Two successive forks differ from each other too.
  Prng c1 = parent.Fork();
  Prng c2 = parent.Fork();
  int equal = 0;
  for (int i = 0; i < 64; ++i) equal += c1.Next64() == c2.Next64();
  EXPECT_EQ(equal, 0);
}

// ---------------------------------------------------------------------------
// Mix64.

TEST(PrngTest, Mix64KnownValues) {
  // Mix64(0) is the first output of the reference splitmix64 from state 0.
  EXPECT_EQ(Mix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(Mix64(1), 0x910a2dec89025cc1ull);
  EXPECT_EQ(Mix64(42), 0xbdd732262feb6e95ull);
  EXPECT_EQ(Mix64(UINT64_MAX), 0xe4d971771b652c20ull);
}

TEST(PrngTest, Mix64SpreadsAdjacentInputs) {
  std::set<uint64_t> out;
  for (uint64_t x = 0; x < 10000; ++x) out.insert(Mix64(x));
  EXPECT_EQ(out.size(), 10000u);
}

// ---------------------------------------------------------------------------
// Death tests: misuse is a bug.

TEST(PrngDeathTest, UniformZeroChecks) {
  Prng p(1);
  EXPECT_DEATH((void)p.Uniform(0), "CHECK failed: \\(n\\) > \\(0u\\)");
}

TEST(PrngDeathTest, RangeInvertedChecks) {
  Prng p(1);
  EXPECT_DEATH((void)p.Range(1, 0), "CHECK failed: \\(lo\\) <= \\(hi\\)");
}

TEST(PrngDeathTest, ChanceZeroDenominatorChecks) {
  Prng p(1);
  EXPECT_DEATH((void)p.Chance(0, 0), "CHECK failed: \\(den\\) > \\(0u\\)");
}

}  // namespace
}  // namespace kvrelay
