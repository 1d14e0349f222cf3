#include "core/block_pool.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <vector>

#include "base/prng.h"
#include "base/status.h"

namespace kvrelay {
namespace {

BlockId MustAllocate(BlockPool& pool) {
  Result<BlockId> r = pool.Allocate();
  KV_CHECK_MSG(r.ok(), "test expected Allocate to succeed");
  return *r;
}

// ---------------------------------------------------------------------------
// Unit tests.

TEST(BlockPoolTest, FreshPool) {
  BlockPool pool(4);
  EXPECT_EQ(pool.capacity(), 4u);
  EXPECT_EQ(pool.num_free(), 4u);
  EXPECT_EQ(pool.num_referenced(), 0u);
  EXPECT_EQ(pool.num_cached_idle(), 0u);
  EXPECT_EQ(pool.num_cached(), 0u);
  // A default handle never names a live block.
  EXPECT_FALSE(pool.IsLive(BlockId{}));
  pool.CheckInvariants();
}

TEST(BlockPoolTest, AllocateRefUnref) {
  BlockPool pool(2);
  BlockId a = MustAllocate(pool);
  EXPECT_EQ(a.index, 0u);
  EXPECT_TRUE(pool.IsLive(a));
  EXPECT_EQ(pool.num_free(), 1u);
  EXPECT_EQ(pool.num_referenced(), 1u);

  pool.Ref(a);
  pool.Unref(a);
  EXPECT_TRUE(pool.IsLive(a));
  EXPECT_EQ(pool.num_referenced(), 1u);

  pool.Unref(a);
  EXPECT_FALSE(pool.IsLive(a));
  EXPECT_EQ(pool.num_free(), 2u);
  EXPECT_EQ(pool.num_referenced(), 0u);
  pool.CheckInvariants();
}

TEST(BlockPoolTest, ExhaustionReturnsResourceExhausted) {
  BlockPool pool(2);
  BlockId a = MustAllocate(pool);
  BlockId b = MustAllocate(pool);
  EXPECT_NE(a.index, b.index);
  Result<BlockId> r = pool.Allocate();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  pool.CheckInvariants();

  pool.Unref(a);
  Result<BlockId> again = pool.Allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->index, a.index);
}

TEST(BlockPoolTest, ZeroCapacityIsAlwaysExhausted) {
  BlockPool pool(0);
  EXPECT_EQ(pool.Allocate().status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.Reset());
  pool.CheckInvariants();
}

TEST(BlockPoolTest, GenerationBumpsOnFree) {
  BlockPool pool(1);
  BlockId a = MustAllocate(pool);
  pool.Unref(a);
  BlockId b = MustAllocate(pool);
  EXPECT_EQ(b.index, a.index);
  EXPECT_EQ(b.generation, a.generation + 1);
  EXPECT_FALSE(pool.IsLive(a));
  EXPECT_TRUE(pool.IsLive(b));
}

TEST(BlockPoolTest, StaleHandleDetection) {
  BlockPool pool(2);
  BlockId a = MustAllocate(pool);
  EXPECT_FALSE(pool.IsLive(BlockId{a.index, a.generation + 1}));
  EXPECT_FALSE(pool.IsLive(BlockId{7, a.generation}));  // out of range
  EXPECT_FALSE(pool.IsLive(BlockId{1, 1}));  // in range but free
  pool.Unref(a);
  EXPECT_FALSE(pool.IsLive(a));
  // Reusing the slot does not revive the old handle.
  BlockId b = MustAllocate(pool);
  EXPECT_EQ(b.index, a.index);
  EXPECT_FALSE(pool.IsLive(a));
}

TEST(BlockPoolTest, CacheHitAndMiss) {
  BlockPool pool(2);
  BlockId a = MustAllocate(pool);
  EXPECT_FALSE(pool.Contains(42));
  EXPECT_FALSE(pool.Lookup(42).has_value());

  pool.Cache(a, 42);
  EXPECT_TRUE(pool.Contains(42));
  EXPECT_EQ(pool.num_cached(), 1u);
  EXPECT_EQ(pool.num_referenced(), 1u);
  EXPECT_EQ(pool.num_cached_idle(), 0u);

  // Hit while referenced: adds a reference.
  std::optional<BlockId> hit = pool.Lookup(42);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, a);
  pool.Unref(a);
  EXPECT_EQ(pool.num_referenced(), 1u);

  // Last reference gone: cached-idle, still live, still in the cache.
  pool.Unref(a);
  EXPECT_EQ(pool.num_referenced(), 0u);
  EXPECT_EQ(pool.num_cached_idle(), 1u);
  EXPECT_EQ(pool.num_free(), 1u);
  EXPECT_TRUE(pool.IsLive(a));
  EXPECT_TRUE(pool.Contains(42));
  pool.CheckInvariants();

  // Hit while idle: leaves the LRU list with refcount 1, same generation.
  hit = pool.Lookup(42);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, a);
  EXPECT_EQ(pool.num_cached_idle(), 0u);
  EXPECT_EQ(pool.num_referenced(), 1u);
  pool.CheckInvariants();
}

TEST(BlockPoolTest, CacheFirstRegistrationWins) {
  BlockPool pool(2);
  BlockId a = MustAllocate(pool);
  BlockId b = MustAllocate(pool);
  pool.Cache(a, 1);
  pool.Cache(b, 1);  // hash taken by a: no-op
  EXPECT_EQ(pool.num_cached(), 1u);
  EXPECT_EQ(*pool.Lookup(1), a);
  pool.Unref(a);

  pool.Cache(a, 2);  // a already has a hash: no-op
  EXPECT_FALSE(pool.Contains(2));
  pool.Cache(a, 1);  // same block, same hash: no-op
  EXPECT_EQ(pool.num_cached(), 1u);

  // b, never cached, goes straight back to the free list.
  pool.Unref(b);
  EXPECT_FALSE(pool.IsLive(b));
  EXPECT_EQ(pool.num_free(), 1u);
  pool.CheckInvariants();
}

TEST(BlockPoolTest, RefOfCachedIdleBlockMakesItUnevictable) {
  BlockPool pool(1);
  BlockId a = MustAllocate(pool);
  pool.Cache(a, 9);
  pool.Unref(a);
  ASSERT_EQ(pool.num_cached_idle(), 1u);
  pool.Ref(a);
  EXPECT_EQ(pool.num_cached_idle(), 0u);
  EXPECT_EQ(pool.Allocate().status().code(), StatusCode::kResourceExhausted);
  pool.Unref(a);
  EXPECT_EQ(pool.num_cached_idle(), 1u);
  pool.CheckInvariants();
}

TEST(BlockPoolTest, EvictionPrefersFreeBlocks) {
  BlockPool pool(2);
  BlockId a = MustAllocate(pool);
  pool.Cache(a, 5);
  pool.Unref(a);
  BlockId b = MustAllocate(pool);
  EXPECT_NE(b.index, a.index);
  EXPECT_TRUE(pool.Contains(5));
  EXPECT_TRUE(pool.IsLive(a));
}

TEST(BlockPoolTest, LruEvictionOrder) {
  BlockPool pool(3);
  BlockId a = MustAllocate(pool);
  BlockId b = MustAllocate(pool);
  BlockId c = MustAllocate(pool);
  pool.Cache(a, 1);
  pool.Cache(b, 2);
  pool.Cache(c, 3);
  // Idle order: b, a, c.
  pool.Unref(b);
  pool.Unref(a);
  pool.Unref(c);
  // A hit moves a to the most-recent end: b, c, a.
  ASSERT_TRUE(pool.Lookup(1).has_value());
  pool.Unref(a);
  ASSERT_EQ(pool.num_cached_idle(), 3u);
  ASSERT_EQ(pool.num_free(), 0u);

  BlockId e1 = MustAllocate(pool);
  EXPECT_EQ(e1.index, b.index);
  EXPECT_EQ(e1.generation, b.generation + 1);
  EXPECT_FALSE(pool.IsLive(b));
  EXPECT_FALSE(pool.Contains(2));
  EXPECT_TRUE(pool.Contains(1));
  EXPECT_TRUE(pool.Contains(3));
  pool.CheckInvariants();

  BlockId e2 = MustAllocate(pool);
  EXPECT_EQ(e2.index, c.index);
  EXPECT_FALSE(pool.Contains(3));

  BlockId e3 = MustAllocate(pool);
  EXPECT_EQ(e3.index, a.index);
  EXPECT_FALSE(pool.Contains(1));
  EXPECT_EQ(pool.num_cached(), 0u);

  EXPECT_EQ(pool.Allocate().status().code(), StatusCode::kResourceExhausted);
  pool.CheckInvariants();
}

TEST(BlockPoolTest, ResetFailsWhileReferenced) {
  BlockPool pool(3);
  BlockId a = MustAllocate(pool);
  BlockId b = MustAllocate(pool);
  pool.Cache(b, 7);
  pool.Unref(b);  // b cached-idle; a still referenced

  EXPECT_FALSE(pool.Reset());
  EXPECT_FALSE(pool.ResetPrefixCache());
  // Nothing changed.
  EXPECT_TRUE(pool.IsLive(a));
  EXPECT_TRUE(pool.IsLive(b));
  EXPECT_TRUE(pool.Contains(7));
  EXPECT_EQ(pool.num_referenced(), 1u);
  EXPECT_EQ(pool.num_cached_idle(), 1u);
  EXPECT_EQ(pool.num_free(), 1u);
  pool.CheckInvariants();

  pool.Unref(a);
  EXPECT_TRUE(pool.Reset());
  EXPECT_EQ(pool.num_free(), 3u);
  EXPECT_EQ(pool.num_cached(), 0u);
  EXPECT_EQ(pool.num_cached_idle(), 0u);
  EXPECT_FALSE(pool.IsLive(b));
  EXPECT_FALSE(pool.Contains(7));
  pool.CheckInvariants();
}

TEST(BlockPoolTest, ResetBumpsEveryGeneration) {
  constexpr uint32_t kCap = 4;
  BlockPool pool(kCap);
  // Give the blocks different generations and leave one cached-idle.
  std::vector<BlockId> before(kCap);
  for (uint32_t round = 0; round < 3; ++round) {
    BlockId x = MustAllocate(pool);
    pool.Unref(x);
  }
  for (uint32_t i = 0; i < kCap; ++i) before[i] = MustAllocate(pool);
  pool.Cache(before[2], 11);
  for (BlockId id : before) pool.Unref(id);
  std::sort(before.begin(), before.end(),
            [](BlockId x, BlockId y) { return x.index < y.index; });

  ASSERT_TRUE(pool.Reset());
  // Take every block and compare: all generations moved on, including the
  // free ones (whose old handles were already stale).
  std::vector<BlockId> after(kCap);
  for (uint32_t i = 0; i < kCap; ++i) after[i] = MustAllocate(pool);
  std::sort(after.begin(), after.end(),
            [](BlockId x, BlockId y) { return x.index < y.index; });
  for (uint32_t i = 0; i < kCap; ++i) {
    ASSERT_EQ(after[i].index, i);
    // A free block was bumped once when freed and once more by Reset.
    const uint32_t expected =
        before[i].generation + (before[i].index == 2 ? 1u : 2u);
    EXPECT_EQ(after[i].generation, expected) << "block " << i;
  }
  pool.CheckInvariants();
}

TEST(BlockPoolTest, ResetPrefixCacheDropsOnlyCachedIdle) {
  BlockPool pool(3);
  BlockId a = MustAllocate(pool);
  BlockId b = MustAllocate(pool);
  BlockId c = MustAllocate(pool);
  pool.Cache(a, 1);
  pool.Cache(b, 2);
  pool.Unref(a);
  pool.Unref(b);
  pool.Unref(c);  // uncached: free at c.generation + 1

  EXPECT_TRUE(pool.ResetPrefixCache());
  EXPECT_EQ(pool.num_free(), 3u);
  EXPECT_EQ(pool.num_cached(), 0u);
  EXPECT_FALSE(pool.Contains(1));
  EXPECT_FALSE(pool.Contains(2));
  EXPECT_FALSE(pool.IsLive(a));
  EXPECT_FALSE(pool.IsLive(b));
  pool.CheckInvariants();

  std::vector<BlockId> after;
  for (int i = 0; i < 3; ++i) after.push_back(MustAllocate(pool));
  for (BlockId id : after) {
    if (id.index == c.index) {
      EXPECT_EQ(id.generation, c.generation + 1);  // untouched by the reset
    } else if (id.index == a.index) {
      EXPECT_EQ(id.generation, a.generation + 1);
    } else {
      EXPECT_EQ(id.generation, b.generation + 1);
    }
  }
}

TEST(BlockPoolTest, ResetPrefixCacheFailsWhileReferencedViaCache) {
  BlockPool pool(1);
  BlockId a = MustAllocate(pool);
  pool.Cache(a, 3);
  EXPECT_FALSE(pool.ResetPrefixCache());
  EXPECT_FALSE(pool.Reset());
  EXPECT_TRUE(pool.Contains(3));
  pool.Unref(a);
  EXPECT_TRUE(pool.ResetPrefixCache());
  EXPECT_FALSE(pool.Contains(3));
}

// A long seeded churn at a larger size, checking invariants as it goes.
TEST(BlockPoolTest, SeededChurnKeepsInvariants) {
  constexpr uint32_t kCap = 64;
  BlockPool pool(kCap);
  Prng prng(0x6b7672656c6179ull);
  std::vector<BlockId> held;  // one entry per reference we own
  for (int step = 0; step < 20000; ++step) {
    const uint64_t op = prng.Uniform(10);
    if (op < 4) {
      Result<BlockId> r = pool.Allocate();
      if (r.ok()) {
        held.push_back(*r);
        if (prng.OneIn(2)) pool.Cache(*r, prng.Uniform(128));
      } else {
        ASSERT_EQ(pool.num_referenced(), kCap);
      }
    } else if (op < 8) {
      if (held.empty()) continue;
      const size_t i = prng.Uniform(held.size());
      pool.Unref(held[i]);
      held[i] = held.back();
      held.pop_back();
    } else if (op < 9) {
      if (std::optional<BlockId> hit = pool.Lookup(prng.Uniform(128))) {
        held.push_back(*hit);
      }
    } else {
      const bool expect = held.empty();
      EXPECT_EQ(prng.OneIn(2) ? pool.Reset() : pool.ResetPrefixCache(),
                expect);
    }
    for (BlockId id : held) ASSERT_TRUE(pool.IsLive(id));
    if (step % 97 == 0) pool.CheckInvariants();
  }
  pool.CheckInvariants();
}

// ---------------------------------------------------------------------------
// Death tests: misuse is a bug and stops the process.

TEST(BlockPoolDeathTest, UnrefOfStaleHandle) {
  BlockPool pool(1);
  BlockId a = MustAllocate(pool);
  pool.Unref(a);
  EXPECT_DEATH(pool.Unref(a), "CHECK failed.*stale block handle");
  // Also after the slot was reused by someone else.
  BlockId b = MustAllocate(pool);
  EXPECT_DEATH(pool.Unref(a), "stale block handle");
  EXPECT_TRUE(pool.IsLive(b));
}

TEST(BlockPoolDeathTest, UnrefOfCachedIdleBlock) {
  BlockPool pool(1);
  BlockId a = MustAllocate(pool);
  pool.Cache(a, 1);
  pool.Unref(a);
  EXPECT_DEATH(pool.Unref(a), "Unref of an unreferenced block");
}

TEST(BlockPoolDeathTest, RefOfStaleHandle) {
  BlockPool pool(1);
  BlockId a = MustAllocate(pool);
  pool.Unref(a);
  EXPECT_DEATH(pool.Ref(a), "stale block handle");
  EXPECT_DEATH(pool.Ref(BlockId{5, 1}), "block index out of range");
}

TEST(BlockPoolDeathTest, CacheOfStaleHandle) {
  BlockPool pool(1);
  BlockId a = MustAllocate(pool);
  pool.Unref(a);
  EXPECT_DEATH(pool.Cache(a, 1), "stale block handle");
}

// ---------------------------------------------------------------------------
// Stateful property test against a model.
//
// The model does not predict which free block Allocate picks (the pool does
// not promise one). It names blocks by *logical handle*: the k-th successful
// Allocate in the run. The SUT keeps the BlockId each logical handle got.
// What the model does predict: whether Allocate succeeds, which logical
// handle an eviction takes (LRU order is the contract), refcounts, which
// hashes are cached, and which handles are live.

constexpr uint64_t kNumHashes = 6;

struct ModelHandle {
  bool live = true;
  uint32_t refcount = 1;
  std::optional<uint64_t> hash;
};

struct PoolModel {
  uint32_t capacity = 0;
  std::vector<ModelHandle> handles;  // one per successful Allocate
  std::vector<size_t> lru;           // cached-idle handles, idle longest first

  size_t NumLive() const {
    return static_cast<size_t>(std::count_if(
        handles.begin(), handles.end(),
        [](const ModelHandle& h) { return h.live; }));
  }
  size_t NumReferenced() const {
    return static_cast<size_t>(std::count_if(
        handles.begin(), handles.end(),
        [](const ModelHandle& h) { return h.live && h.refcount > 0; }));
  }
  size_t NumCached() const {
    return static_cast<size_t>(std::count_if(
        handles.begin(), handles.end(),
        [](const ModelHandle& h) { return h.live && h.hash.has_value(); }));
  }
  std::optional<size_t> Find(uint64_t hash) const {
    for (size_t k = 0; k < handles.size(); ++k) {
      if (handles[k].live && handles[k].hash == hash) return k;
    }
    return std::nullopt;
  }
  void RemoveFromLru(size_t k) {
    lru.erase(std::remove(lru.begin(), lru.end(), k), lru.end());
  }
  // The handle Allocate will evict, if it must evict.
  std::optional<size_t> Victim() const {
    if (NumLive() < capacity || lru.empty()) return std::nullopt;
    return lru.front();
  }
  bool AllocateSucceeds() const {
    return NumLive() < capacity || !lru.empty();
  }
};

struct PoolSut {
  explicit PoolSut(uint32_t capacity) : pool(capacity) {}
  BlockPool pool;
  std::vector<BlockId> handles;  // parallel to PoolModel::handles
};

using PoolCommand = rc::state::Command<PoolModel, PoolSut>;

// After every command: the pool agrees with the model.
void CheckAgreement(const PoolModel& m, const PoolSut& s) {
  const BlockPool& pool = s.pool;
  pool.CheckInvariants();
  RC_ASSERT(s.handles.size() == m.handles.size());
  RC_ASSERT(pool.capacity() == m.capacity);
  RC_ASSERT(pool.num_free() + pool.num_referenced() + pool.num_cached_idle() ==
            pool.capacity());
  RC_ASSERT(pool.num_referenced() == m.NumReferenced());
  RC_ASSERT(pool.num_cached_idle() == m.lru.size());
  RC_ASSERT(pool.num_free() == m.capacity - m.NumLive());
  RC_ASSERT(pool.num_cached() == m.NumCached());
  for (uint64_t h = 0; h < kNumHashes; ++h) {
    RC_ASSERT(pool.Contains(h) == m.Find(h).has_value());
  }
  std::vector<bool> used(m.capacity, false);
  for (size_t k = 0; k < m.handles.size(); ++k) {
    RC_ASSERT(pool.IsLive(s.handles[k]) == m.handles[k].live);
    if (m.handles[k].live) {
      const uint32_t index = s.handles[k].index;
      RC_ASSERT(index < m.capacity);
      RC_ASSERT(!used[index]);  // no two live handles share a block
      used[index] = true;
    }
  }
}

// Picks a logical handle satisfying `pred`, or discards the command.
template <typename Pred>
size_t PickHandle(const PoolModel& m, Pred pred) {
  std::vector<size_t> candidates;
  for (size_t k = 0; k < m.handles.size(); ++k) {
    if (pred(m.handles[k])) candidates.push_back(k);
  }
  if (candidates.empty()) RC_DISCARD("no suitable handle");
  return *rc::gen::elementOf(candidates);
}

bool IsLiveHandle(const ModelHandle& h) { return h.live; }
bool IsReferenced(const ModelHandle& h) { return h.live && h.refcount > 0; }

// Whether logical handle k exists and satisfies `pred`. (A plain bool on
// purpose: RC_PRE decomposes its expression and would not short-circuit &&.)
bool HandleIs(const PoolModel& m, size_t k, bool (*pred)(const ModelHandle&)) {
  return k < m.handles.size() && pred(m.handles[k]);
}

struct AllocateCmd : PoolCommand {
  void apply(PoolModel& m) const override {
    if (!m.AllocateSucceeds()) return;
    if (std::optional<size_t> v = m.Victim()) {
      m.handles[*v].live = false;
      m.handles[*v].hash.reset();
      m.RemoveFromLru(*v);
    }
    m.handles.push_back(ModelHandle{});
  }
  void run(const PoolModel& m, PoolSut& s) const override {
    Result<BlockId> r = s.pool.Allocate();
    if (!m.AllocateSucceeds()) {
      RC_ASSERT(!r.ok());
      RC_ASSERT(r.status().code() == StatusCode::kResourceExhausted);
    } else {
      RC_ASSERT(r.ok());
      if (std::optional<size_t> v = m.Victim()) {
        const BlockId old = s.handles[*v];
        RC_ASSERT(r->index == old.index);
        RC_ASSERT(r->generation != old.generation);
      }
      s.handles.push_back(*r);
    }
    PoolModel next = m;
    apply(next);
    CheckAgreement(next, s);
  }
  void show(std::ostream& os) const override { os << "Allocate"; }
};

struct RefCmd : PoolCommand {
  size_t k;
  explicit RefCmd(const PoolModel& m)
      : k(PickHandle(m, IsLiveHandle)) {}
  void checkPreconditions(const PoolModel& m) const override {
    RC_PRE(HandleIs(m, k, IsLiveHandle));
  }
  void apply(PoolModel& m) const override {
    if (m.handles[k].refcount++ == 0) m.RemoveFromLru(k);
  }
  void run(const PoolModel& m, PoolSut& s) const override {
    s.pool.Ref(s.handles[k]);
    PoolModel next = m;
    apply(next);
    CheckAgreement(next, s);
  }
  void show(std::ostream& os) const override { os << "Ref(h" << k << ")"; }
};

struct UnrefCmd : PoolCommand {
  size_t k;
  explicit UnrefCmd(const PoolModel& m) : k(PickHandle(m, IsReferenced)) {}
  void checkPreconditions(const PoolModel& m) const override {
    RC_PRE(HandleIs(m, k, IsReferenced));
  }
  void apply(PoolModel& m) const override {
    ModelHandle& h = m.handles[k];
    if (--h.refcount > 0) return;
    if (h.hash.has_value()) {
      m.lru.push_back(k);
    } else {
      h.live = false;
    }
  }
  void run(const PoolModel& m, PoolSut& s) const override {
    s.pool.Unref(s.handles[k]);
    PoolModel next = m;
    apply(next);
    CheckAgreement(next, s);
  }
  void show(std::ostream& os) const override { os << "Unref(h" << k << ")"; }
};

struct CacheCmd : PoolCommand {
  size_t k;
  uint64_t hash;
  explicit CacheCmd(const PoolModel& m)
      : k(PickHandle(m, IsReferenced)),
        hash(*rc::gen::inRange<uint64_t>(0, kNumHashes)) {}
  void checkPreconditions(const PoolModel& m) const override {
    RC_PRE(HandleIs(m, k, IsReferenced));
  }
  void apply(PoolModel& m) const override {
    if (m.handles[k].hash.has_value() || m.Find(hash).has_value()) return;
    m.handles[k].hash = hash;
  }
  void run(const PoolModel& m, PoolSut& s) const override {
    s.pool.Cache(s.handles[k], hash);
    PoolModel next = m;
    apply(next);
    CheckAgreement(next, s);
  }
  void show(std::ostream& os) const override {
    os << "Cache(h" << k << ", #" << hash << ")";
  }
};

struct LookupCmd : PoolCommand {
  uint64_t hash = *rc::gen::inRange<uint64_t>(0, kNumHashes);
  void apply(PoolModel& m) const override {
    std::optional<size_t> k = m.Find(hash);
    if (!k.has_value()) return;
    if (m.handles[*k].refcount++ == 0) m.RemoveFromLru(*k);
  }
  void run(const PoolModel& m, PoolSut& s) const override {
    std::optional<BlockId> got = s.pool.Lookup(hash);
    std::optional<size_t> k = m.Find(hash);
    RC_ASSERT(got.has_value() == k.has_value());
    if (k.has_value()) RC_ASSERT(*got == s.handles[*k]);
    PoolModel next = m;
    apply(next);
    CheckAgreement(next, s);
  }
  void show(std::ostream& os) const override {
    os << "Lookup(#" << hash << ")";
  }
};

struct ResetCmd : PoolCommand {
  bool whole_pool = *rc::gen::arbitrary<bool>();
  void apply(PoolModel& m) const override {
    if (m.NumReferenced() > 0) return;
    for (ModelHandle& h : m.handles) {
      h.live = false;
      h.hash.reset();
    }
    m.lru.clear();
  }
  void run(const PoolModel& m, PoolSut& s) const override {
    const bool ok = whole_pool ? s.pool.Reset() : s.pool.ResetPrefixCache();
    RC_ASSERT(ok == (m.NumReferenced() == 0));
    PoolModel next = m;
    apply(next);
    CheckAgreement(next, s);
    if (ok) RC_ASSERT(s.pool.num_free() == s.pool.capacity());
  }
  void show(std::ostream& os) const override {
    os << (whole_pool ? "Reset" : "ResetPrefixCache");
  }
};

RC_GTEST_PROP(BlockPoolProperty, AgreesWithModel, ()) {
  const uint32_t capacity = *rc::gen::inRange<uint32_t>(1, 9);
  PoolModel model;
  model.capacity = capacity;
  PoolSut sut(capacity);
  rc::state::check(model, sut, [](const PoolModel& m) {
    return rc::state::gen::execOneOfWithArgs<AllocateCmd, AllocateCmd, RefCmd,
                                             UnrefCmd, UnrefCmd, CacheCmd,
                                             CacheCmd, LookupCmd, ResetCmd>()(
        m);
  });
}

}  // namespace
}  // namespace kvrelay
