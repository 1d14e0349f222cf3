// slot_index_test.cc — SlotIndex: unit tests, a seeded randomized churn test
// and a rapidcheck property test against std::unordered_map as the model.
#include "base/slot_index.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/prng.h"
#include "base/transfer_id.h"

namespace kvrelay {
namespace {

// Every key hashes alike: one probe run, every tag equal, so every
// comparison has to read the record.
struct CollidingHash {
  size_t operator()(const TransferId&) const { return 42; }
};

// An owner's record array: slot → key, with a free list, as the send and
// load tables keep theirs. Counts how often the index reads a record.
struct Records {
  std::vector<TransferId> keys;
  std::vector<uint32_t> free;
  mutable uint64_t reads = 0;

  uint32_t Add(const TransferId& t) {
    if (!free.empty()) {
      const uint32_t s = free.back();
      free.pop_back();
      keys[s] = t;
      return s;
    }
    keys.push_back(t);
    return static_cast<uint32_t>(keys.size() - 1);
  }
  void Remove(uint32_t s) {
    keys[s] = TransferId{};
    free.push_back(s);
  }
  auto KeyOf() const {
    return [this](uint32_t s) -> const TransferId& {
      ++reads;
      return keys.at(s);
    };
  }
};

template <typename Hash>
class Indexed {
 public:
  uint32_t Find(const TransferId& t) const { return index_.Find(t, records_.KeyOf()); }
  uint32_t Add(const TransferId& t) {
    const uint32_t s = records_.Add(t);
    index_.Insert(t, s, records_.KeyOf());
    return s;
  }
  bool Remove(const TransferId& t) {
    const uint32_t s = Find(t);
    if (s == SlotIndex<TransferId>::kNone) return false;
    EXPECT_TRUE(index_.Erase(t, records_.KeyOf()));
    records_.Remove(s);
    return true;
  }
  void Check() const { index_.CheckInvariants(records_.KeyOf()); }
  std::vector<TransferId> Keys() const {
    std::vector<TransferId> out;
    index_.ForEach([&](uint32_t s) { out.push_back(records_.keys[s]); });
    std::sort(out.begin(), out.end());
    return out;
  }
  SlotIndex<TransferId, Hash>& index() { return index_; }
  Records& records() { return records_; }

 private:
  Records records_;
  SlotIndex<TransferId, Hash> index_;
};

constexpr uint32_t kNone = SlotIndex<TransferId>::kNone;

TransferId RandomId(Prng& p) { return TransferId{p.Next64(), p.Next64()}; }

// Adds `n` random keys to `m`; returns them in the order added.
template <typename Hash>
std::vector<TransferId> AddRandom(Indexed<Hash>& m, Prng& p, int n) {
  std::vector<TransferId> keys;
  for (int i = 0; i < n; ++i) {
    keys.push_back(RandomId(p));
    m.Add(keys.back());
  }
  return keys;
}

TEST(SlotIndexTest, Empty) {
  Indexed<std::hash<TransferId>> m;
  EXPECT_TRUE(m.index().empty());
  EXPECT_EQ(m.Find(TransferId{1, 2}), kNone);
  EXPECT_FALSE(m.Remove(TransferId{1, 2}));
  m.Check();
}

TEST(SlotIndexTest, InsertFindErase) {
  Indexed<std::hash<TransferId>> m;
  const uint32_t a = m.Add(TransferId{1, 1});
  const uint32_t b = m.Add(TransferId{1, 2});
  EXPECT_EQ(m.Find(TransferId{1, 1}), a);
  EXPECT_EQ(m.Find(TransferId{1, 2}), b);
  EXPECT_EQ(m.Find(TransferId{2, 1}), kNone);
  EXPECT_EQ(m.index().size(), 2u);
  EXPECT_TRUE(m.Remove(TransferId{1, 1}));
  EXPECT_FALSE(m.Remove(TransferId{1, 1}));
  EXPECT_EQ(m.Find(TransferId{1, 1}), kNone);
  EXPECT_EQ(m.Find(TransferId{1, 2}), b);
  // The freed slot is reused for another key; the index follows.
  EXPECT_EQ(m.Add(TransferId{9, 9}), a);
  EXPECT_EQ(m.Find(TransferId{9, 9}), a);
  m.Check();
}

TEST(SlotIndexTest, InsertingAPresentKeyIsABug) {
  Indexed<std::hash<TransferId>> m;
  m.Add(TransferId{3, 4});
  EXPECT_DEATH(m.Add(TransferId{3, 4}), "");
}

TEST(SlotIndexTest, AllCollideStillCorrect) {
  Indexed<CollidingHash> m;
  for (uint64_t k = 0; k < 200; ++k) m.Add(TransferId{k, k});
  m.Check();
  for (uint64_t k = 0; k < 200; k += 2) EXPECT_TRUE(m.Remove(TransferId{k, k}));
  m.Check();
  for (uint64_t k = 0; k < 200; ++k) {
    EXPECT_EQ(m.Find(TransferId{k, k}) != kNone, k % 2 == 1) << k;
  }
}

// The point of the tag: a lookup reads a record only when the tag matches,
// so a hit reads one record (its own) and a miss reads none.
TEST(SlotIndexTest, RecordsAreReadOnlyOnATagMatch) {
  const uint64_t seed = 11;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng p(seed);
  Indexed<std::hash<TransferId>> m;
  const std::vector<TransferId> keys = AddRandom(m, p, 10000);
  m.records().reads = 0;
  for (const TransferId& t : keys) ASSERT_NE(m.Find(t), kNone);
  EXPECT_EQ(m.records().reads, keys.size());
  m.records().reads = 0;
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(m.Find(RandomId(p)), kNone);
  EXPECT_EQ(m.records().reads, 0u);
}

// Load ≤ 1/2 with 8 bytes an entry: 100,000 keys in a 2 MiB array.
TEST(SlotIndexTest, HundredThousandKeysTakeTwoMiB) {
  Prng p(3);
  Indexed<std::hash<TransferId>> m;
  AddRandom(m, p, 100000);
  EXPECT_EQ(m.index().capacity(), 262144u);
  EXPECT_LE(m.index().MaxProbeLength(), 40u);
  m.Check();
}

TEST(SlotIndexTest, ReserveAvoidsGrowth) {
  SlotIndex<TransferId> idx;
  idx.Reserve(1000);
  const size_t cap = idx.capacity();
  EXPECT_GE(cap, 2000u);
  Records r;
  Prng p(5);
  for (int i = 0; i < 1000; ++i) {
    const TransferId t = RandomId(p);
    idx.Insert(t, r.Add(t), r.KeyOf());
  }
  EXPECT_EQ(idx.capacity(), cap);
  idx.Clear();
  EXPECT_TRUE(idx.empty());
  EXPECT_EQ(idx.capacity(), cap);
}

TEST(SlotIndexTest, ChurnDoesNotGrow) {
  const uint64_t seed = 7;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng p(seed);
  Indexed<std::hash<TransferId>> m;
  std::vector<TransferId> live = AddRandom(m, p, 5000);
  const size_t cap = m.index().capacity();
  for (int i = 0; i < 200000; ++i) {
    const size_t victim = p.Uniform(live.size());
    ASSERT_TRUE(m.Remove(live[victim]));
    live[victim] = RandomId(p);
    m.Add(live[victim]);
  }
  EXPECT_EQ(m.index().capacity(), cap);
  EXPECT_EQ(m.index().size(), live.size());
  m.Check();
}

// Seeded randomized differential test with a small key space (many hits,
// many collisions), checked as it goes.
template <typename Hash>
void RunAgainstModel(uint64_t seed, int ops) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng p(seed);
  Indexed<Hash> m;
  std::unordered_map<TransferId, uint32_t> model;
  for (int i = 0; i < ops; ++i) {
    const TransferId key{p.Uniform(3), p.Uniform(300)};
    switch (p.Uniform(3)) {
      case 0:
        if (model.count(key) == 0) model[key] = m.Add(key);
        break;
      case 1:
        EXPECT_EQ(m.Remove(key), model.erase(key) == 1);
        break;
      case 2: {
        auto it = model.find(key);
        EXPECT_EQ(m.Find(key), it == model.end() ? kNone : it->second);
        break;
      }
    }
    ASSERT_EQ(m.index().size(), model.size());
    if (i % 64 == 0) m.Check();
  }
  m.Check();
  std::vector<TransferId> want;
  for (const auto& [k, s] : model) want.push_back(k);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(m.Keys(), want);
}

TEST(SlotIndexTest, RandomizedAgainstUnorderedMap) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    RunAgainstModel<std::hash<TransferId>>(seed, 20000);
  }
  RunAgainstModel<CollidingHash>(6, 3000);
}

// --- rapidcheck: any sequence of operations agrees with std::unordered_map.

struct Op {
  uint8_t kind;  // 0..1 insert if absent, 2 erase, 3 find
  uint16_t key;
};

RC_GTEST_PROP(SlotIndexProperty, AgreesWithUnorderedMap, ()) {
  // Small key ranges give collisions and long runs; large ones growth.
  const auto key_range = *rc::gen::element<uint16_t>(4, 64, 4096);
  const auto ops = *rc::gen::container<std::vector<Op>>(rc::gen::build<Op>(
      rc::gen::set(&Op::kind, rc::gen::inRange<uint8_t>(0, 4)),
      rc::gen::set(&Op::key, rc::gen::inRange<uint16_t>(0, key_range))));
  Indexed<std::hash<TransferId>> m;
  std::unordered_map<TransferId, uint32_t> model;
  for (const Op& op : ops) {
    // Keys that differ in one half only.
    const TransferId key{static_cast<uint64_t>(op.key % 3), op.key};
    switch (op.kind) {
      case 0:
      case 1:
        if (model.count(key) == 0) model[key] = m.Add(key);
        break;
      case 2:
        RC_ASSERT(m.Remove(key) == (model.erase(key) == 1));
        break;
      case 3: {
        auto it = model.find(key);
        RC_ASSERT(m.Find(key) == (it == model.end() ? kNone : it->second));
        break;
      }
    }
    RC_ASSERT(m.index().size() == model.size());
  }
  m.Check();
}

}  // namespace
}  // namespace kvrelay
