// flat_map_test.cc — FlatMap: unit tests, a seeded randomized churn test,
// and a rapidcheck property test against std::unordered_map as the model.
#include "base/flat_map.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/prng.h"
#include "base/transfer_id.h"
#include "base/typed_id.h"

namespace kvrelay {
namespace {

using RequestId = TypedId<struct FlatMapTestTag>;

// Every key hashes alike: all entries share one probe run.
struct CollidingHash {
  size_t operator()(uint64_t) const { return 42; }
};

template <typename K, typename V, typename H>
std::vector<std::pair<K, V>> Entries(const FlatMap<K, V, H>& m) {
  std::vector<std::pair<K, V>> out;
  for (const auto& [k, v] : m) out.emplace_back(k, v);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FlatMapTest, Empty) {
  FlatMap<uint64_t, int> m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.size(), 0u);
  EXPECT_TRUE(m.find(7) == m.end());
  EXPECT_EQ(m.count(7), 0u);
  EXPECT_EQ(m.erase(7), 0u);
  EXPECT_TRUE(m.begin() == m.end());
  m.CheckInvariants();
}

TEST(FlatMapTest, InsertFindErase) {
  FlatMap<uint64_t, int> m;
  auto [it, inserted] = m.emplace(5, 50);
  EXPECT_TRUE(inserted);
  EXPECT_EQ(it->first, 5u);
  EXPECT_EQ(it->second, 50);
  // A second emplace leaves the first value.
  auto [it2, inserted2] = m.emplace(5, 99);
  EXPECT_FALSE(inserted2);
  EXPECT_EQ(it2->second, 50);
  EXPECT_EQ(m.size(), 1u);
  m.find(5)->second = 51;
  EXPECT_EQ(m.find(5)->second, 51);
  m[5] = 52;
  m[6] = 60;
  EXPECT_EQ(m.find(5)->second, 52);
  EXPECT_EQ(m.find(6)->second, 60);
  EXPECT_EQ(m.count(6), 1u);
  EXPECT_EQ(m.erase(5), 1u);
  EXPECT_EQ(m.erase(5), 0u);
  EXPECT_TRUE(m.find(5) == m.end());
  EXPECT_EQ(m.size(), 1u);
  m.CheckInvariants();
}

TEST(FlatMapTest, TransferIdKeys) {
  FlatMap<TransferId, uint32_t> m;
  for (uint32_t i = 0; i < 1000; ++i) m.emplace(TransferId{i, ~uint64_t{i}}, i);
  m.CheckInvariants();
  EXPECT_EQ(m.size(), 1000u);
  for (uint32_t i = 0; i < 1000; ++i) {
    auto it = m.find(TransferId{i, ~uint64_t{i}});
    ASSERT_TRUE(it != m.end());
    EXPECT_EQ(it->second, i);
  }
  EXPECT_EQ(m.count(TransferId{1000, 0}), 0u);
  size_t visited = 0;
  for (const auto& [k, v] : m) {
    EXPECT_EQ(k.hi, v);
    ++visited;
  }
  EXPECT_EQ(visited, 1000u);
  // The load bound holds after growth.
  EXPECT_LE(m.size() * 2, m.capacity());
}

// Dense, structured keys (an engine's request slots: index | generation,
// whose std::hash is a single multiply) must not cluster into long runs.
TEST(FlatMapTest, DenseTypedIdKeysSpread) {
  FlatMap<RequestId, uint32_t> m;
  for (uint32_t i = 0; i < 100000; ++i) m.emplace(RequestId{i, 1}, i);
  EXPECT_LE(m.MaxProbeLength(), 64u);
  FlatMap<uint64_t, uint32_t> seq;
  for (uint32_t i = 0; i < 100000; ++i) seq.emplace(uint64_t{i} << 20, i);
  EXPECT_LE(seq.MaxProbeLength(), 64u);
}

// A Hash that declares its keys sequential picks home slots by its low
// bits: keys from a counter sit in adjacent slots (probe length 1), a
// sliding window of them (insert new, erase oldest) keeps it so across the
// wrap of the array, and keys that share low bits still all work.
struct SequentialHash {
  static constexpr bool kSequentialKeys = true;
  size_t operator()(uint64_t k) const { return static_cast<size_t>(k); }
};

TEST(FlatMapTest, SequentialKeysSitTogether) {
  FlatMap<uint64_t, uint64_t, SequentialHash> m;
  ASSERT_TRUE(decltype(m)::kSequential);
  ASSERT_FALSE((FlatMap<uint64_t, uint64_t>::kSequential));
  for (uint64_t k = 0; k < 1000; ++k) m.emplace(k, k);
  EXPECT_EQ(m.MaxProbeLength(), 1u);
  for (uint64_t k = 1000; k < 50000; ++k) {  // a window of 1,000 slides on
    m.emplace(k, k);
    ASSERT_EQ(m.erase(k - 1000), 1u);
  }
  m.CheckInvariants();
  EXPECT_EQ(m.size(), 1000u);
  EXPECT_EQ(m.MaxProbeLength(), 1u);
  for (uint64_t k = 49000; k < 50000; ++k) ASSERT_EQ(m.find(k)->second, k);
  // Keys equal in their low bits (same index, other generation) collide
  // but stay correct.
  FlatMap<uint64_t, uint64_t, SequentialHash> same;
  for (uint64_t g = 0; g < 100; ++g) same.emplace(7 + (g << 32), g);
  same.CheckInvariants();
  for (uint64_t g = 0; g < 100; g += 3) EXPECT_EQ(same.erase(7 + (g << 32)), 1u);
  same.CheckInvariants();
  for (uint64_t g = 0; g < 100; ++g) {
    EXPECT_EQ(same.count(7 + (g << 32)), g % 3 == 0 ? 0u : 1u);
  }
}

TEST(FlatMapTest, AllCollideStillCorrect) {
  FlatMap<uint64_t, uint64_t, CollidingHash> m;
  for (uint64_t k = 0; k < 200; ++k) m.emplace(k, k * 3);
  m.CheckInvariants();
  for (uint64_t k = 0; k < 200; k += 2) EXPECT_EQ(m.erase(k), 1u);
  m.CheckInvariants();
  for (uint64_t k = 0; k < 200; ++k) {
    if (k % 2 == 0) {
      EXPECT_TRUE(m.find(k) == m.end());
    } else {
      ASSERT_TRUE(m.find(k) != m.end());
      EXPECT_EQ(m.find(k)->second, k * 3);
    }
  }
}

// 32-byte slots (TransferId → uint32_t) are aligned to 32 bytes, so no slot
// straddles two cache lines; prefetch is a hint and changes nothing.
TEST(FlatMapTest, SlotsDoNotStraddleCacheLinesAndPrefetchIsInert) {
  FlatMap<TransferId, uint32_t> m;
  m.prefetch(TransferId{1, 2});  // empty: no array yet
  for (uint64_t i = 0; i < 1000; ++i) m.emplace(TransferId{i, ~i}, static_cast<uint32_t>(i));
  for (const auto& kv : m) {
    const auto addr = reinterpret_cast<uintptr_t>(&kv);
    ASSERT_EQ(addr % 32, 0u);
  }
  for (uint64_t i = 0; i < 2000; ++i) m.prefetch(TransferId{i, ~i});
  EXPECT_EQ(m.size(), 1000u);
  for (uint64_t i = 0; i < 1000; ++i) {
    auto it = m.find(TransferId{i, ~i});
    ASSERT_NE(it, m.end());
    EXPECT_EQ(it->second, i);
  }
  m.CheckInvariants();
}

TEST(FlatMapTest, ReserveAvoidsGrowth) {
  FlatMap<uint64_t, int> m;
  m.reserve(1000);
  const size_t cap = m.capacity();
  for (uint64_t k = 0; k < 1000; ++k) m.emplace(k, 0);
  EXPECT_EQ(m.capacity(), cap);
  m.clear();
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.count(3), 0u);
  m.CheckInvariants();
}

// CapacityFor(n) is exactly what growth by inserts reaches at n entries:
// never less (an owner's check against it would fail on a correct map) and
// never more (it would miss a map that grew for one entry too many).
TEST(FlatMapTest, CapacityForMatchesGrowth) {
  FlatMap<uint64_t, int> m;
  for (uint64_t n = 1; n <= 5000; ++n) {
    m.emplace(n, 0);
    ASSERT_EQ(m.capacity(), (FlatMap<uint64_t, int>::CapacityFor(n))) << n;
  }
  FlatMap<uint64_t, int> r;
  r.reserve(1000);
  EXPECT_EQ(r.capacity(), (FlatMap<uint64_t, int>::CapacityFor(1000)));
}

// Steady churn (the core's pattern: insert new keys, erase old ones) keeps
// the capacity fixed: erasing leaves no markers behind.
TEST(FlatMapTest, ChurnDoesNotGrow) {
  const uint64_t seed = 7;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng p(seed);
  FlatMap<uint64_t, uint64_t> m;
  std::vector<uint64_t> live;
  for (int i = 0; i < 5000; ++i) {
    live.push_back(p.Next64());
    m.emplace(live.back(), i);
  }
  const size_t cap = m.capacity();
  for (int i = 0; i < 200000; ++i) {
    const size_t victim = p.Uniform(live.size());
    ASSERT_EQ(m.erase(live[victim]), 1u);
    live[victim] = p.Next64();
    m.emplace(live[victim], i);
  }
  EXPECT_EQ(m.capacity(), cap);
  EXPECT_EQ(m.size(), live.size());
  m.CheckInvariants();
}

// Seeded randomized differential test with a small key space (many hits,
// many collisions), checked after every operation.
void RunAgainstModel(uint64_t seed, int ops) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng p(seed);
  FlatMap<uint64_t, uint64_t> m;
  std::unordered_map<uint64_t, uint64_t> model;
  for (int i = 0; i < ops; ++i) {
    const uint64_t key = p.Uniform(300);
    switch (p.Uniform(4)) {
      case 0:
      case 1: {
        const bool inserted = m.emplace(key, i).second;
        EXPECT_EQ(inserted, model.emplace(key, i).second);
        break;
      }
      case 2:
        EXPECT_EQ(m.erase(key), model.erase(key));
        break;
      case 3: {
        auto got = m.find(key);
        auto it = model.find(key);
        ASSERT_EQ(got != m.end(), it != model.end());
        if (got != m.end()) {
          EXPECT_EQ(got->second, it->second);
        }
        break;
      }
    }
    ASSERT_EQ(m.size(), model.size());
    if (i % 64 == 0) m.CheckInvariants();
  }
  m.CheckInvariants();
  std::vector<std::pair<uint64_t, uint64_t>> want(model.begin(), model.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Entries(m), want);
}

TEST(FlatMapTest, RandomizedAgainstUnorderedMap) {
  for (uint64_t seed = 1; seed <= 5; ++seed) RunAgainstModel(seed, 20000);
}

// --- rapidcheck: any sequence of operations agrees with std::unordered_map.

struct Op {
  uint8_t kind;   // 0..1 emplace, 2 operator[]=, 3 erase, 4 find
  uint16_t key;
  uint32_t value;
};

RC_GTEST_PROP(FlatMapProperty, AgreesWithUnorderedMap, ()) {
  // Small key ranges give collisions and long runs; large ones growth.
  const auto key_range = *rc::gen::element<uint16_t>(4, 64, 4096);
  const auto ops = *rc::gen::container<std::vector<Op>>(rc::gen::build<Op>(
      rc::gen::set(&Op::kind, rc::gen::inRange<uint8_t>(0, 5)),
      rc::gen::set(&Op::key, rc::gen::inRange<uint16_t>(0, key_range)),
      rc::gen::set(&Op::value, rc::gen::arbitrary<uint32_t>())));
  FlatMap<TransferId, uint32_t> m;
  std::unordered_map<TransferId, uint32_t> model;
  for (const Op& op : ops) {
    // Keys that differ in one half only.
    const TransferId key{static_cast<uint64_t>(op.key % 3), op.key};
    switch (op.kind) {
      case 0:
      case 1:
        RC_ASSERT(m.emplace(key, op.value).second == model.emplace(key, op.value).second);
        break;
      case 2:
        m[key] = op.value;
        model[key] = op.value;
        break;
      case 3:
        RC_ASSERT(m.erase(key) == model.erase(key));
        break;
      case 4: {
        auto got = m.find(key);
        auto it = model.find(key);
        RC_ASSERT((got != m.end()) == (it != model.end()));
        if (got != m.end()) RC_ASSERT(got->second == it->second);
        break;
      }
    }
    RC_ASSERT(m.size() == model.size());
  }
  m.CheckInvariants();
  std::vector<std::pair<TransferId, uint32_t>> want(model.begin(), model.end());
  std::sort(want.begin(), want.end());
  RC_ASSERT(Entries(m) == want);
}

}  // namespace
}  // namespace kvrelay
