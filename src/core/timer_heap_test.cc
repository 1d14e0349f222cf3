#include "core/timer_heap.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/prng.h"
#include "base/time.h"

namespace kvrelay {
namespace {

Instant At(int64_t ns) { return Instant::FromNanos(ns); }

// Pops everything due by `now`, in order.
std::vector<uint32_t> DrainExpired(TimerHeap& h, Instant now) {
  std::vector<uint32_t> out;
  while (std::optional<uint32_t> k = h.PopExpired(now)) out.push_back(*k);
  return out;
}

// ---------------------------------------------------------------------------
// Unit tests.

TEST(TimerHeapTest, Empty) {
  TimerHeap h;
  EXPECT_TRUE(h.empty());
  EXPECT_EQ(h.size(), 0u);
  EXPECT_FALSE(h.Top().has_value());
  EXPECT_FALSE(h.PopExpired(Instant::Never()).has_value());
  EXPECT_FALSE(h.IsArmed(0));
  EXPECT_FALSE(h.IsArmed(1000));
  h.CheckInvariants();
}

TEST(TimerHeapTest, ArmAndTop) {
  TimerHeap h;
  h.Arm(5, At(300));
  h.Arm(2, At(100));
  h.Arm(9, At(200));
  EXPECT_EQ(h.size(), 3u);
  EXPECT_FALSE(h.empty());
  ASSERT_TRUE(h.Top().has_value());
  EXPECT_EQ(*h.Top(), std::make_pair(At(100), uint32_t{2}));
  EXPECT_TRUE(h.IsArmed(5));
  EXPECT_TRUE(h.IsArmed(2));
  EXPECT_TRUE(h.IsArmed(9));
  EXPECT_FALSE(h.IsArmed(0));
  EXPECT_FALSE(h.IsArmed(3));
  EXPECT_FALSE(h.IsArmed(10));
  h.CheckInvariants();
}

TEST(TimerHeapTest, PopExpiredRespectsNow) {
  TimerHeap h;
  h.Arm(1, At(100));
  h.Arm(2, At(200));
  EXPECT_FALSE(h.PopExpired(At(99)).has_value());
  EXPECT_EQ(h.size(), 2u);
  // A deadline equal to now has expired.
  EXPECT_EQ(h.PopExpired(At(100)), std::optional<uint32_t>(1));
  EXPECT_FALSE(h.IsArmed(1));
  EXPECT_FALSE(h.PopExpired(At(199)).has_value());
  EXPECT_EQ(h.PopExpired(At(1000)), std::optional<uint32_t>(2));
  EXPECT_FALSE(h.PopExpired(At(1000)).has_value());
  EXPECT_TRUE(h.empty());
  h.CheckInvariants();
}

TEST(TimerHeapTest, PopExpiredOrderWithTiesBrokenByKey) {
  TimerHeap h;
  // Armed in scrambled order; several share a deadline.
  h.Arm(7, At(50));
  h.Arm(3, At(50));
  h.Arm(10, At(10));
  h.Arm(0, At(50));
  h.Arm(4, At(10));
  h.Arm(8, At(30));
  h.Arm(1, At(30));
  h.CheckInvariants();
  const std::vector<uint32_t> want = {4, 10, 1, 8, 0, 3, 7};
  EXPECT_EQ(DrainExpired(h, At(50)), want);
  EXPECT_TRUE(h.empty());
}

TEST(TimerHeapTest, AllSameDeadlinePopInKeyOrder) {
  TimerHeap h;
  for (uint32_t k : {9u, 2u, 5u, 0u, 7u, 1u, 8u, 3u, 6u, 4u}) h.Arm(k, At(42));
  const std::vector<uint32_t> want = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(DrainExpired(h, At(42)), want);
}

TEST(TimerHeapTest, ReArmMovesLater) {
  TimerHeap h;
  h.Arm(1, At(100));
  h.Arm(2, At(200));
  h.Arm(1, At(300));  // moves, does not duplicate
  EXPECT_EQ(h.size(), 2u);
  h.CheckInvariants();
  EXPECT_EQ(*h.Top(), std::make_pair(At(200), uint32_t{2}));
  EXPECT_FALSE(h.PopExpired(At(100)).has_value());
  const std::vector<uint32_t> want = {2, 1};
  EXPECT_EQ(DrainExpired(h, At(300)), want);
}

TEST(TimerHeapTest, ReArmMovesEarlier) {
  TimerHeap h;
  h.Arm(1, At(100));
  h.Arm(2, At(200));
  h.Arm(3, At(300));
  h.Arm(3, At(50));
  EXPECT_EQ(h.size(), 3u);
  h.CheckInvariants();
  EXPECT_EQ(*h.Top(), std::make_pair(At(50), uint32_t{3}));
  const std::vector<uint32_t> want = {3, 1, 2};
  EXPECT_EQ(DrainExpired(h, At(1000)), want);
}

TEST(TimerHeapTest, ReArmSameDeadlineIsStable) {
  TimerHeap h;
  h.Arm(1, At(100));
  h.Arm(1, At(100));
  EXPECT_EQ(h.size(), 1u);
  EXPECT_EQ(*h.Top(), std::make_pair(At(100), uint32_t{1}));
  h.CheckInvariants();
}

TEST(TimerHeapTest, ReArmIntoATie) {
  TimerHeap h;
  h.Arm(5, At(100));
  h.Arm(2, At(200));
  h.Arm(2, At(100));  // ties with 5; key 2 wins
  const std::vector<uint32_t> want = {2, 5};
  EXPECT_EQ(DrainExpired(h, At(100)), want);
}

TEST(TimerHeapTest, Cancel) {
  TimerHeap h;
  h.Arm(1, At(100));
  h.Arm(2, At(200));
  h.Arm(3, At(300));
  h.Cancel(1);
  EXPECT_FALSE(h.IsArmed(1));
  EXPECT_EQ(h.size(), 2u);
  h.CheckInvariants();
  EXPECT_EQ(*h.Top(), std::make_pair(At(200), uint32_t{2}));
  h.Cancel(3);  // the last slot in the array
  EXPECT_EQ(h.size(), 1u);
  h.CheckInvariants();
  const std::vector<uint32_t> want = {2};
  EXPECT_EQ(DrainExpired(h, Instant::Never()), want);
}

TEST(TimerHeapTest, CancelOfUnarmedIsNoOp) {
  TimerHeap h;
  h.Cancel(0);           // empty heap, empty position table
  h.Cancel(1000000);     // far beyond the position table
  h.Arm(3, At(10));
  h.Cancel(1);           // inside the table, never armed
  h.Cancel(4);           // beyond the largest key seen
  EXPECT_EQ(h.size(), 1u);
  EXPECT_TRUE(h.IsArmed(3));
  h.Cancel(3);
  h.Cancel(3);           // twice
  EXPECT_TRUE(h.empty());
  EXPECT_FALSE(h.IsArmed(3));
  h.CheckInvariants();
}

TEST(TimerHeapTest, CancelAfterPopIsNoOp) {
  TimerHeap h;
  h.Arm(1, At(10));
  h.Arm(2, At(20));
  EXPECT_EQ(h.PopExpired(At(10)), std::optional<uint32_t>(1));
  h.Cancel(1);
  EXPECT_EQ(h.size(), 1u);
  EXPECT_TRUE(h.IsArmed(2));
  h.CheckInvariants();
}

TEST(TimerHeapTest, ReArmAfterCancelAndPop) {
  TimerHeap h;
  h.Arm(1, At(10));
  h.Cancel(1);
  h.Arm(1, At(30));
  EXPECT_TRUE(h.IsArmed(1));
  EXPECT_EQ(h.PopExpired(At(30)), std::optional<uint32_t>(1));
  h.Arm(1, At(5));
  EXPECT_EQ(*h.Top(), std::make_pair(At(5), uint32_t{1}));
  h.CheckInvariants();
}

TEST(TimerHeapTest, ExtremeDeadlines) {
  TimerHeap h;
  h.Arm(0, Instant::Never());
  h.Arm(1, Instant::Epoch());
  h.Arm(2, Instant::FromNanos(-5));  // before the epoch
  const std::vector<uint32_t> want = {2, 1};
  EXPECT_EQ(DrainExpired(h, Instant::Epoch()), want);
  EXPECT_FALSE(h.PopExpired(Instant::Never() - Duration::Nanoseconds(1)));
  EXPECT_EQ(h.PopExpired(Instant::Never()), std::optional<uint32_t>(0));
}

TEST(TimerHeapTest, LargeKeysGrowThePositionTable) {
  TimerHeap h;
  h.Arm(100000, At(2));
  h.Arm(0, At(1));
  EXPECT_TRUE(h.IsArmed(100000));
  EXPECT_FALSE(h.IsArmed(99999));
  h.CheckInvariants();
  const std::vector<uint32_t> want = {0, 100000};
  EXPECT_EQ(DrainExpired(h, At(2)), want);
}

TEST(TimerHeapTest, ManyTimersDrainSorted) {
  TimerHeap h;
  Prng p(0x7131);
  std::set<std::pair<int64_t, uint32_t>> model;
  for (uint32_t k = 0; k < 2000; ++k) {
    const int64_t when = p.Range(0, 500);
    h.Arm(k, At(when));
    model.emplace(when, k);
  }
  h.CheckInvariants();
  for (const auto& [when, key] : model) {
    ASSERT_EQ(h.PopExpired(Instant::Never()), std::optional<uint32_t>(key));
  }
  EXPECT_TRUE(h.empty());
}

// ---------------------------------------------------------------------------
// Death tests.

TEST(TimerHeapDeathTest, ArmOfReservedKeyChecks) {
  TimerHeap h;
  EXPECT_DEATH(h.Arm(UINT32_MAX, At(1)), "CHECK failed");
}

// ---------------------------------------------------------------------------
// Seeded randomized test against a simple model: a set ordered by
// (deadline, key) plus a map key -> deadline.

class Model {
 public:
  void Arm(uint32_t key, int64_t when) {
    Cancel(key);
    by_key_[key] = when;
    order_.emplace(when, key);
  }
  void Cancel(uint32_t key) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return;
    order_.erase({it->second, key});
    by_key_.erase(it);
  }
  std::optional<uint32_t> PopExpired(int64_t now) {
    if (order_.empty() || order_.begin()->first > now) return std::nullopt;
    const uint32_t key = order_.begin()->second;
    order_.erase(order_.begin());
    by_key_.erase(key);
    return key;
  }
  std::optional<std::pair<int64_t, uint32_t>> Top() const {
    if (order_.empty()) return std::nullopt;
    return *order_.begin();
  }
  bool IsArmed(uint32_t key) const { return by_key_.count(key) != 0; }
  size_t size() const { return order_.size(); }

 private:
  std::map<uint32_t, int64_t> by_key_;
  std::set<std::pair<int64_t, uint32_t>> order_;
};

void RunRandomized(uint64_t seed, int ops) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng p(seed);
  TimerHeap h;
  Model m;
  int64_t now = 0;
  // Phase parameters are redrawn now and then so one run covers dense and
  // sparse key spaces and narrow (tie-heavy) and wide deadline windows.
  uint32_t key_space = 16;
  int64_t window = 8;
  for (int step = 0; step < ops; ++step) {
    if (step % 5000 == 0) {
      key_space = static_cast<uint32_t>(1) << p.Range(1, 12);
      window = int64_t{1} << p.Range(0, 20);
    }
    const uint64_t op = p.Uniform(100);
    if (op < 45) {
      const uint32_t key = static_cast<uint32_t>(p.Uniform(key_space));
      // Deadlines may lie in the past, so some fire at once.
      const int64_t when = now + p.Range(-window / 4, window);
      h.Arm(key, At(when));
      m.Arm(key, when);
    } else if (op < 65) {
      const uint32_t key = static_cast<uint32_t>(p.Uniform(key_space + 4));
      h.Cancel(key);
      m.Cancel(key);
    } else if (op < 95) {
      now += p.Range(0, window / 4);
      const std::optional<uint32_t> got = h.PopExpired(At(now));
      const std::optional<uint32_t> want = m.PopExpired(now);
      ASSERT_EQ(got, want) << "step " << step << " now " << now;
    } else {
      // Drain everything due.
      now += p.Range(0, window);
      for (;;) {
        const std::optional<uint32_t> got = h.PopExpired(At(now));
        const std::optional<uint32_t> want = m.PopExpired(now);
        ASSERT_EQ(got, want) << "step " << step << " now " << now;
        if (!got.has_value()) break;
      }
    }

    ASSERT_EQ(h.size(), m.size()) << "step " << step;
    ASSERT_EQ(h.empty(), m.size() == 0) << "step " << step;
    const auto top = h.Top();
    const auto mtop = m.Top();
    ASSERT_EQ(top.has_value(), mtop.has_value()) << "step " << step;
    if (top.has_value()) {
      ASSERT_EQ(top->first.ns(), mtop->first) << "step " << step;
      ASSERT_EQ(top->second, mtop->second) << "step " << step;
    }
    const uint32_t probe = static_cast<uint32_t>(p.Uniform(key_space + 4));
    ASSERT_EQ(h.IsArmed(probe), m.IsArmed(probe))
        << "step " << step << " key " << probe;
    if (step % 1000 == 0) h.CheckInvariants();
  }
  h.CheckInvariants();
  // Finally everything drains in model order.
  for (;;) {
    const std::optional<uint32_t> got = h.PopExpired(Instant::Never());
    const std::optional<uint32_t> want = m.PopExpired(Instant::Never().ns());
    ASSERT_EQ(got, want);
    if (!got.has_value()) break;
  }
  EXPECT_TRUE(h.empty());
  h.CheckInvariants();
}

TEST(TimerHeapRandomizedTest, MatchesModel) {
  RunRandomized(0x74696d6572ull, 100000);
}

TEST(TimerHeapRandomizedTest, MatchesModelMoreSeeds) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    RunRandomized(seed, 20000);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace kvrelay
