// client_slots_test.cc — per-client admission: the cap, release on
// destruction, moves, independence of clients, no limit, and many threads.
#include "server/client_slots.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kvrelay::server {
namespace {

TEST(ClientSlotsTest, CapsEachClientAndFreesOnDestruction) {
  ClientSlots slots(2);
  std::optional<ClientSlots::Lease> a = slots.Acquire("10.0.0.1");
  std::optional<ClientSlots::Lease> b = slots.Acquire("10.0.0.1");
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(slots.Acquire("10.0.0.1").has_value());
  EXPECT_EQ(slots.held("10.0.0.1"), 2u);
  std::optional<ClientSlots::Lease> other = slots.Acquire("10.0.0.2");
  EXPECT_TRUE(other.has_value());
  a.reset();
  EXPECT_EQ(slots.held("10.0.0.1"), 1u);
  EXPECT_TRUE(slots.Acquire("10.0.0.1").has_value());  // taken and freed at once
  EXPECT_EQ(slots.held("10.0.0.1"), 1u);
  // A moved-from lease frees nothing; the moved-to one frees once.
  ClientSlots::Lease moved(std::move(*b));
  b.reset();
  EXPECT_EQ(slots.held("10.0.0.1"), 1u);
  { ClientSlots::Lease gone(std::move(moved)); }
  EXPECT_EQ(slots.held("10.0.0.1"), 0u);
}

TEST(ClientSlotsTest, ZeroMeansNoLimit) {
  ClientSlots slots(0);
  std::vector<ClientSlots::Lease> held;
  for (int i = 0; i < 1000; ++i) {
    std::optional<ClientSlots::Lease> l = slots.Acquire("c");
    ASSERT_TRUE(l.has_value());
    held.push_back(std::move(*l));
  }
  EXPECT_EQ(slots.held("c"), 0u);
}

TEST(ClientSlotsTest, ManyThreadsNeverExceedTheCap) {
  ClientSlots slots(3);
  std::atomic<int> now{0}, peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (std::optional<ClientSlots::Lease> l = slots.Acquire("same")) {
          const int n = ++now;
          int p = peak.load();
          while (n > p && !peak.compare_exchange_weak(p, n)) {
          }
          --now;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(peak.load(), 3);
  EXPECT_EQ(slots.held("same"), 0u);
}

}  // namespace
}  // namespace kvrelay::server
