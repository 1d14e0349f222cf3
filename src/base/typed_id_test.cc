#include "base/typed_id.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/prng.h"
#include "base/transfer_id.h"

namespace kvrelay {
namespace {

using FooId = TypedId<struct FooTag>;
using BarId = TypedId<struct BarTag>;

// Distinct tags are distinct types: one cannot stand in for the other.
static_assert(!std::is_same_v<FooId, BarId>);
static_assert(!std::is_convertible_v<FooId, BarId>);
static_assert(!std::is_convertible_v<BarId, FooId>);

// ---------------------------------------------------------------------------
// TypedId.

TEST(TypedIdTest, DefaultIsZero) {
  FooId id;
  EXPECT_EQ(id.index, 0u);
  EXPECT_EQ(id.generation, 0u);
  EXPECT_EQ(id.Packed(), 0u);
}

TEST(TypedIdTest, PackedLayout) {
  const FooId id{7, 3};
  EXPECT_EQ(id.Packed(), (uint64_t{3} << 32) | 7);
  EXPECT_EQ(FooId::FromPacked((uint64_t{3} << 32) | 7), id);
  static_assert(FooId{1, 2}.Packed() == 0x0000000200000001ull);
  static_assert(FooId::FromPacked(0x0000000200000001ull) == FooId{1, 2});
}

TEST(TypedIdTest, PackedRoundTrip) {
  const std::vector<FooId> ids = {
      {0, 0},          {1, 0},          {0, 1},
      {UINT32_MAX, 0}, {0, UINT32_MAX}, {UINT32_MAX, UINT32_MAX},
      {12345, 678},    {0x80000000u, 0x80000000u},
  };
  for (const FooId& id : ids) {
    EXPECT_EQ(FooId::FromPacked(id.Packed()), id) << id.ToString();
  }
  Prng p(1);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t v = p.Next64();
    ASSERT_EQ(FooId::FromPacked(v).Packed(), v);
    const FooId id{static_cast<uint32_t>(p.Next64()),
                   static_cast<uint32_t>(p.Next64())};
    ASSERT_EQ(FooId::FromPacked(id.Packed()), id);
  }
}

TEST(TypedIdTest, Ordering) {
  // Member-wise: index first, then generation.
  EXPECT_LT((FooId{1, 0}), (FooId{1, 1}));
  EXPECT_LT((FooId{1, 9}), (FooId{2, 0}));
  EXPECT_EQ((FooId{4, 5}), (FooId{4, 5}));
  EXPECT_NE((FooId{4, 5}), (FooId{4, 6}));
  EXPECT_NE((FooId{4, 5}), (FooId{5, 5}));
  EXPECT_GT((FooId{UINT32_MAX, 0}), (FooId{0, UINT32_MAX}));
  EXPECT_LE((FooId{3, 3}), (FooId{3, 3}));
  EXPECT_GE((FooId{3, 4}), (FooId{3, 3}));

  std::vector<FooId> v = {{2, 1}, {1, 2}, {2, 0}, {1, 1}};
  std::sort(v.begin(), v.end());
  const std::vector<FooId> want = {{1, 1}, {1, 2}, {2, 0}, {2, 1}};
  EXPECT_EQ(v, want);
}

TEST(TypedIdTest, HashInUnorderedSet) {
  std::unordered_set<FooId> set;
  for (uint32_t i = 0; i < 100; ++i) {
    for (uint32_t g = 0; g < 10; ++g) set.insert(FooId{i, g});
  }
  EXPECT_EQ(set.size(), 1000u);
  // Re-inserting is a no-op.
  EXPECT_FALSE(set.insert(FooId{5, 5}).second);
  EXPECT_EQ(set.count(FooId{99, 9}), 1u);
  EXPECT_EQ(set.count(FooId{99, 10}), 0u);
  EXPECT_EQ(set.count(FooId{100, 0}), 0u);
  // Same slot, other generation: a stale handle is a different key.
  set.erase(FooId{7, 3});
  EXPECT_EQ(set.count(FooId{7, 3}), 0u);
  EXPECT_EQ(set.count(FooId{7, 4}), 1u);

  // Equal ids hash equally; the hash is not trivially constant.
  std::hash<FooId> h;
  EXPECT_EQ(h(FooId{3, 4}), h(FooId{3, 4}));
  std::unordered_set<size_t> hashes;
  for (uint32_t i = 0; i < 1000; ++i) hashes.insert(h(FooId{i, 1}));
  EXPECT_EQ(hashes.size(), 1000u);
}

TEST(TypedIdTest, ToString) {
  EXPECT_EQ((FooId{0, 0}).ToString(), "0@0");
  EXPECT_EQ((FooId{3, 7}).ToString(), "3@7");
  EXPECT_EQ((BarId{12, 0}).ToString(), "12@0");
  EXPECT_EQ((FooId{UINT32_MAX, UINT32_MAX}).ToString(),
            "4294967295@4294967295");
}

// ---------------------------------------------------------------------------
// TransferId.

bool IsLowerHex32(const std::string& s) {
  if (s.size() != 32) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

TEST(TransferIdTest, ToStringKnownValues) {
  EXPECT_EQ(TransferId{}.ToString(), std::string(32, '0'));
  EXPECT_EQ((TransferId{0x0123456789abcdefull, 0xfedcba9876543210ull}).ToString(),
            "0123456789abcdeffedcba9876543210");
  EXPECT_EQ((TransferId{0, 1}).ToString(), "00000000000000000000000000000001");
  EXPECT_EQ((TransferId{1, 0}).ToString(), "00000000000000010000000000000000");
  EXPECT_EQ((TransferId{UINT64_MAX, UINT64_MAX}).ToString(),
            std::string(32, 'f'));
}

TEST(TransferIdTest, ToStringIs32LowercaseHex) {
  Prng p(2);
  for (int i = 0; i < 1000; ++i) {
    const TransferId t{p.Next64(), p.Next64()};
    ASSERT_TRUE(IsLowerHex32(t.ToString())) << t.ToString();
  }
}

TEST(TransferIdTest, ParseRoundTrip) {
  Prng p(3);
  for (int i = 0; i < 10000; ++i) {
    const TransferId t{p.Next64(), p.Next64()};
    TransferId back;
    ASSERT_TRUE(TransferId::Parse(t.ToString(), &back)) << t.ToString();
    ASSERT_EQ(back, t);
  }
  for (const TransferId& t :
       {TransferId{}, TransferId{0, 1}, TransferId{1, 0},
        TransferId{UINT64_MAX, UINT64_MAX}, TransferId{UINT64_MAX, 0}}) {
    TransferId back{42, 42};
    ASSERT_TRUE(TransferId::Parse(t.ToString(), &back));
    EXPECT_EQ(back, t);
  }
  TransferId parsed;
  ASSERT_TRUE(
      TransferId::Parse("0123456789abcdeffedcba9876543210", &parsed));
  EXPECT_EQ(parsed.hi, 0x0123456789abcdefull);
  EXPECT_EQ(parsed.lo, 0xfedcba9876543210ull);
}

TEST(TransferIdTest, ParseRejectsWrongLength) {
  TransferId t;
  EXPECT_FALSE(TransferId::Parse("", &t));
  EXPECT_FALSE(TransferId::Parse("0", &t));
  EXPECT_FALSE(TransferId::Parse(std::string(31, '0'), &t));
  EXPECT_FALSE(TransferId::Parse(std::string(33, '0'), &t));
  EXPECT_FALSE(TransferId::Parse(std::string(64, '0'), &t));
  EXPECT_FALSE(TransferId::Parse("0123456789abcdeffedcba9876543210\n", &t));
  EXPECT_FALSE(TransferId::Parse(" 0123456789abcdeffedcba9876543210", &t));
}

TEST(TransferIdTest, ParseRejectsUppercase) {
  TransferId t;
  EXPECT_FALSE(TransferId::Parse("0123456789ABCDEFFEDCBA9876543210", &t));
  EXPECT_FALSE(TransferId::Parse("0123456789abcdeffedcba987654321A", &t));
  EXPECT_FALSE(TransferId::Parse("F123456789abcdeffedcba9876543210", &t));
}

TEST(TransferIdTest, ParseRejectsNonHex) {
  TransferId t;
  const std::string good = "0123456789abcdeffedcba9876543210";
  for (char bad : {'g', 'z', 'G', ' ', '-', 'x', '/', ':', '@', '`', '\0'}) {
    for (size_t pos : {size_t{0}, size_t{15}, size_t{16}, size_t{31}}) {
      std::string s = good;
      s[pos] = bad;
      EXPECT_FALSE(TransferId::Parse(s, &t))
          << "char " << static_cast<int>(bad) << " at " << pos;
    }
  }
  // A "0x" prefix on a 30-digit body is still 32 chars but not hex.
  EXPECT_FALSE(TransferId::Parse("0x23456789abcdeffedcba9876543210", &t));
  // A UUID-style dashed form is not accepted.
  EXPECT_FALSE(
      TransferId::Parse("01234567-89ab-cdef-fedc-ba9876543210", &t));
}

TEST(TransferIdTest, IsZero) {
  EXPECT_TRUE(TransferId{}.IsZero());
  EXPECT_TRUE((TransferId{0, 0}).IsZero());
  EXPECT_FALSE((TransferId{0, 1}).IsZero());
  EXPECT_FALSE((TransferId{1, 0}).IsZero());
  EXPECT_FALSE((TransferId{UINT64_MAX, UINT64_MAX}).IsZero());
  static_assert(TransferId{}.IsZero());
}

TEST(TransferIdTest, Ordering) {
  EXPECT_LT((TransferId{0, UINT64_MAX}), (TransferId{1, 0}));
  EXPECT_LT((TransferId{1, 0}), (TransferId{1, 1}));
  EXPECT_EQ((TransferId{5, 6}), (TransferId{5, 6}));
  EXPECT_NE((TransferId{5, 6}), (TransferId{6, 5}));
}

TEST(TransferIdTest, HashInUnorderedMap) {
  std::unordered_map<TransferId, int> m;
  Prng p(4);
  std::vector<TransferId> ids;
  for (int i = 0; i < 1000; ++i) {
    ids.push_back(TransferId{p.Next64(), p.Next64()});
    m[ids.back()] = i;
  }
  // Structured ids (small hi/lo, swapped halves) must not collide as keys.
  for (uint64_t i = 0; i < 100; ++i) {
    m[TransferId{i, 0}] = -1;
    m[TransferId{0, i + 1}] = -2;
  }
  EXPECT_EQ(m.size(), 1000u + 200u);
  for (int i = 0; i < 1000; ++i) {
    auto it = m.find(ids[static_cast<size_t>(i)]);
    ASSERT_NE(it, m.end());
    EXPECT_EQ(it->second, i);
  }
  EXPECT_EQ(m.count(TransferId{1, 1}), 0u);

  std::hash<TransferId> h;
  EXPECT_EQ(h(TransferId{1, 2}), h(TransferId{1, 2}));
  EXPECT_NE(h(TransferId{1, 2}), h(TransferId{2, 1}));
}

}  // namespace
}  // namespace kvrelay
