// model_test.cc — the emulated model: shapes, hashes, digests, Reference.
#include "engine/model.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "base/prng.h"

namespace kvrelay::engine {
namespace {

std::vector<Token> MakePrompt(uint64_t seed, uint32_t len, uint32_t vocab = 32000) {
  std::vector<Token> out;
  for (uint32_t i = 0; i < len; ++i) {
    out.push_back(static_cast<Token>(Mix64(seed * 1000003 + i) % vocab));
  }
  return out;
}

ModelShape Tiny() {
  ModelShape s;
  EXPECT_TRUE(ModelShapeByName("tiny", &s));
  return s;
}

// ---------------------------------------------------------------------------
// ModelShapeByName / BlockBytesPerRank

TEST(ModelShapeTest, TinyShape) {
  ModelShape s;
  ASSERT_TRUE(ModelShapeByName("tiny", &s));
  EXPECT_EQ(s.name, "tiny");
  EXPECT_EQ(s.layers, 2u);
  EXPECT_EQ(s.kv_heads, 4u);
  EXPECT_EQ(s.head_dim, 8u);
  EXPECT_EQ(s.dtype_bytes, 2u);
  EXPECT_EQ(s.block_tokens, 4u);
  EXPECT_EQ(s.vocab, 32000u);
  EXPECT_EQ(s.max_context, 1024u);
  // kv heads split evenly over every supported tp and over the head groups.
  EXPECT_EQ(s.kv_heads % kHeadGroups, 0u);
}

TEST(ModelShapeTest, EightBShape) {
  ModelShape s;
  ASSERT_TRUE(ModelShapeByName("8b", &s));
  EXPECT_EQ(s.name, "8b");
  EXPECT_EQ(s.layers, 36u);
  EXPECT_EQ(s.kv_heads, 8u);
  EXPECT_EQ(s.head_dim, 128u);
  EXPECT_EQ(s.dtype_bytes, 2u);
  EXPECT_EQ(s.block_tokens, 16u);
  EXPECT_EQ(s.vocab, 128256u);
  EXPECT_EQ(s.max_context, 32768u);
}

TEST(ModelShapeTest, UnknownNameIsFalseAndLeavesOutputAlone) {
  ModelShape s;
  s.name = "keep";
  s.layers = 7;
  EXPECT_FALSE(ModelShapeByName("unknown", &s));
  EXPECT_FALSE(ModelShapeByName("", &s));
  EXPECT_FALSE(ModelShapeByName("TINY", &s));
  EXPECT_FALSE(ModelShapeByName("8B", &s));
  EXPECT_EQ(s.name, "keep");
  EXPECT_EQ(s.layers, 7u);
}

TEST(ModelShapeTest, BlockBytesPerRank8b) {
  ModelShape s;
  ASSERT_TRUE(ModelShapeByName("8b", &s));
  const uint64_t tp1 = uint64_t{16} * 36 * 2 * 8 * 128 * 2;
  EXPECT_EQ(tp1, 2359296u);
  EXPECT_EQ(s.BlockBytesPerRank(1), tp1);
  EXPECT_EQ(s.BlockBytesPerRank(2), tp1 / 2);
  EXPECT_EQ(s.BlockBytesPerRank(4), tp1 / 4);
}

TEST(ModelShapeTest, BlockBytesPerRankTiny) {
  const ModelShape s = Tiny();
  EXPECT_EQ(s.BlockBytesPerRank(1), uint64_t{4} * 2 * 2 * 4 * 8 * 2);
  EXPECT_EQ(s.BlockBytesPerRank(2), uint64_t{4} * 2 * 2 * 2 * 8 * 2);
  EXPECT_EQ(s.BlockBytesPerRank(4), uint64_t{4} * 2 * 2 * 1 * 8 * 2);
}

// ---------------------------------------------------------------------------
// PrefixHash / KvDigest / BlockDigest

TEST(PrefixHashTest, Deterministic) {
  const std::vector<Token> p = MakePrompt(1, 10);
  EXPECT_EQ(PrefixHash(1, p), PrefixHash(1, p));
  const std::vector<Token> copy = p;
  EXPECT_EQ(PrefixHash(1, p), PrefixHash(1, copy));
}

TEST(PrefixHashTest, DiffersByWeightsVersion) {
  const std::vector<Token> p = MakePrompt(2, 8);
  std::set<uint64_t> seen;
  for (uint64_t v = 0; v < 64; ++v) seen.insert(PrefixHash(v, p));
  EXPECT_EQ(seen.size(), 64u);
  // Also for the empty sequence.
  EXPECT_NE(PrefixHash(1, std::span<const Token>()), PrefixHash(2, std::span<const Token>()));
}

TEST(PrefixHashTest, DiffersByAnyToken) {
  const std::vector<Token> p = MakePrompt(3, 12);
  const uint64_t base = PrefixHash(1, p);
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<Token> q = p;
    q[i] = (q[i] + 1) % 32000;
    EXPECT_NE(PrefixHash(1, q), base) << "position " << i;
  }
  // Swapping two distinct tokens changes it too (order matters).
  std::vector<Token> s = p;
  ASSERT_NE(s[0], s[1]);
  std::swap(s[0], s[1]);
  EXPECT_NE(PrefixHash(1, s), base);
}

TEST(PrefixHashTest, DiffersByLength) {
  const std::vector<Token> p = MakePrompt(4, 12);
  std::set<uint64_t> seen;
  for (size_t n = 0; n <= p.size(); ++n) {
    seen.insert(PrefixHash(1, std::span<const Token>(p.data(), n)));
  }
  EXPECT_EQ(seen.size(), p.size() + 1);
  // A trailing zero token is not the same as no token.
  std::vector<Token> z = {0};
  EXPECT_NE(PrefixHash(1, z), PrefixHash(1, std::span<const Token>()));
  std::vector<Token> zz = {0, 0};
  EXPECT_NE(PrefixHash(1, z), PrefixHash(1, zz));
}

TEST(KvDigestTest, DiffersByGroupAndPrefix) {
  std::set<uint64_t> seen;
  for (uint32_t g = 0; g < kHeadGroups; ++g) {
    seen.insert(KvDigest(123, g));
    seen.insert(KvDigest(124, g));
  }
  EXPECT_EQ(seen.size(), 2u * kHeadGroups);
  EXPECT_EQ(KvDigest(99, 2), KvDigest(99, 2));
}

TEST(BlockDigestTest, FullAndPartialBlocks) {
  const std::vector<Token> p = MakePrompt(5, 10);  // blocks of 4: [0,4) [4,8) [8,10)
  const std::span<const Token> s(p);
  for (uint32_t g = 0; g < kHeadGroups; ++g) {
    EXPECT_EQ(BlockDigest(1, s, 4, 0, g), KvDigest(PrefixHash(1, s.subspan(0, 4)), g));
    EXPECT_EQ(BlockDigest(1, s, 4, 1, g), KvDigest(PrefixHash(1, s.subspan(0, 8)), g));
    EXPECT_EQ(BlockDigest(1, s, 4, 2, g), KvDigest(PrefixHash(1, s), g));
  }
  // A full block does not depend on tokens after it.
  std::vector<Token> q = p;
  q[9] = (q[9] + 7) % 32000;
  EXPECT_EQ(BlockDigest(1, p, 4, 1, 0), BlockDigest(1, q, 4, 1, 0));
  EXPECT_NE(BlockDigest(1, p, 4, 2, 0), BlockDigest(1, q, 4, 2, 0));
  // But it depends on tokens before it, and on the weights.
  std::vector<Token> r = p;
  r[0] = (r[0] + 1) % 32000;
  EXPECT_NE(BlockDigest(1, p, 4, 1, 0), BlockDigest(1, r, 4, 1, 0));
  EXPECT_NE(BlockDigest(1, p, 4, 1, 0), BlockDigest(2, p, 4, 1, 0));
}

// ---------------------------------------------------------------------------
// Reference

TEST(ReferenceTest, Deterministic) {
  const ModelShape s = Tiny();
  const std::vector<Token> p = MakePrompt(6, 9);
  const std::vector<Token> a = Reference(p, 1, 20, s);
  const std::vector<Token> b = Reference(p, 1, 20, s);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 20u);
  for (Token t : a) EXPECT_LT(t, s.vocab);
  EXPECT_TRUE(Reference(p, 1, 0, s).empty());
}

TEST(ReferenceTest, DependsOnWeightsVersion) {
  const ModelShape s = Tiny();
  const std::vector<Token> p = MakePrompt(7, 5);
  EXPECT_NE(Reference(p, 1, 8, s), Reference(p, 2, 8, s));
  // Even the first token differs for most versions.
  int same = 0;
  for (uint64_t v = 2; v < 40; ++v) same += Reference(p, 1, 1, s) == Reference(p, v, 1, s);
  EXPECT_LE(same, 1);
}

TEST(ReferenceTest, DependsOnPrompt) {
  const ModelShape s = Tiny();
  const std::vector<Token> p = MakePrompt(8, 7);
  const std::vector<Token> base = Reference(p, 1, 8, s);
  for (size_t i = 0; i < p.size(); ++i) {
    std::vector<Token> q = p;
    q[i] = (q[i] + 1) % s.vocab;
    EXPECT_NE(Reference(q, 1, 8, s), base) << "position " << i;
  }
  std::vector<Token> longer = p;
  longer.push_back(3);
  EXPECT_NE(Reference(longer, 1, 8, s), base);
}

TEST(ReferenceTest, PrefixConsistent) {
  const ModelShape s = Tiny();
  const std::vector<Token> p = MakePrompt(9, 6);
  const std::vector<Token> full = Reference(p, 3, 15, s);
  for (uint32_t n = 0; n <= 15; ++n) {
    const std::vector<Token> part = Reference(p, 3, n, s);
    EXPECT_EQ(part, std::vector<Token>(full.begin(), full.begin() + n));
  }
  // Continuing from the prompt plus k generated tokens gives the rest.
  for (uint32_t k = 0; k < 15; ++k) {
    std::vector<Token> seq = p;
    seq.insert(seq.end(), full.begin(), full.begin() + k);
    EXPECT_EQ(Reference(seq, 3, 15 - k, s), std::vector<Token>(full.begin() + k, full.end()))
        << "k=" << k;
  }
}

TEST(ReferenceTest, FirstTokenFromFoldedBlockDigests) {
  const ModelShape s = Tiny();
  const std::vector<Token> p = MakePrompt(10, 10);
  uint64_t folded = 0;
  for (uint32_t b = 0; b < BlocksFor(10, 4); ++b) {
    for (uint32_t g = 0; g < kHeadGroups; ++g) {
      folded = FoldDigest(folded, BlockDigest(1, p, 4, b, g));
    }
  }
  EXPECT_EQ(Reference(p, 1, 1, s).at(0), NextToken(1, folded, 10, s.vocab));
  // A missing / zero digest changes the fold.
  uint64_t wrong = 0;
  for (uint32_t b = 0; b < BlocksFor(10, 4); ++b) {
    for (uint32_t g = 0; g < kHeadGroups; ++g) {
      wrong = FoldDigest(wrong, b == 1 && g == 2 ? 0 : BlockDigest(1, p, 4, b, g));
    }
  }
  EXPECT_NE(wrong, folded);
}

TEST(ReferenceTest, WorksFor8bShape) {
  ModelShape s;
  ASSERT_TRUE(ModelShapeByName("8b", &s));
  const std::vector<Token> p = MakePrompt(11, 40, s.vocab);
  const std::vector<Token> a = Reference(p, 1, 5, s);
  EXPECT_EQ(a, Reference(p, 1, 5, s));
  for (Token t : a) EXPECT_LT(t, s.vocab);
}

// ---------------------------------------------------------------------------
// BlocksFor

TEST(BlocksForTest, RoundsUp) {
  EXPECT_EQ(BlocksFor(0, 4), 0u);
  EXPECT_EQ(BlocksFor(1, 4), 1u);
  EXPECT_EQ(BlocksFor(3, 4), 1u);
  EXPECT_EQ(BlocksFor(4, 4), 1u);
  EXPECT_EQ(BlocksFor(5, 4), 2u);
  EXPECT_EQ(BlocksFor(8, 4), 2u);
  EXPECT_EQ(BlocksFor(9, 4), 3u);
  EXPECT_EQ(BlocksFor(16, 16), 1u);
  EXPECT_EQ(BlocksFor(17, 16), 2u);
  EXPECT_EQ(BlocksFor(32768, 16), 2048u);
  EXPECT_EQ(BlocksFor(7, 1), 7u);
}

}  // namespace
}  // namespace kvrelay::engine
