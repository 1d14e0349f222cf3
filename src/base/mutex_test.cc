// Why: Mutex/MutexLock/CondVar are thin, but every lock in the threaded
// layers goes through them; these tests pin that they exclude, that waits
// hold the lock again on return, and that timed waits time out.
#include "base/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace kvrelay {
namespace {

using namespace std::chrono_literals;

struct Counter {
  Mutex mu;
  CondVar cv;
  int value GUARDED_BY(mu) = 0;
  bool go GUARDED_BY(mu) = false;
};

TEST(MutexTest, LockExcludes) {
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c] {
      for (int i = 0; i < 10000; ++i) {
        MutexLock lock(&c.mu);
        c.value = c.value + 1;  // a lost update would show in the total
      }
    });
  }
  for (std::thread& t : threads) t.join();
  MutexLock lock(&c.mu);
  EXPECT_EQ(c.value, 40000);
}

// Whether another thread could take `mu` right now.
bool FreeElsewhere(Mutex& mu) {
  bool took = false;
  std::thread([&] {
    if (mu.TryLock()) {
      took = true;
      mu.Unlock();
    }
  }).join();
  return took;
}

TEST(MutexTest, TryLock) {
  Mutex mu;
  EXPECT_TRUE(FreeElsewhere(mu));
  if (mu.TryLock()) {
    EXPECT_FALSE(FreeElsewhere(mu));
    mu.Unlock();
  } else {
    ADD_FAILURE() << "TryLock failed on a free mutex";
  }
  EXPECT_TRUE(FreeElsewhere(mu));
  {
    MutexLock lock(&mu);
    EXPECT_FALSE(FreeElsewhere(mu));
  }
  EXPECT_TRUE(FreeElsewhere(mu));
}

TEST(CondVarTest, WaitWithPredicateSeesTheNotifiersWrite) {
  Counter c;
  std::thread notifier([&c] {
    MutexLock lock(&c.mu);
    c.value = 7;
    c.go = true;
    c.cv.NotifyAll();
  });
  {
    MutexLock lock(&c.mu);
    c.cv.Wait(&c.mu, [&c]() REQUIRES(c.mu) { return c.go; });
    EXPECT_EQ(c.value, 7);
    c.value = 8;  // the lock is held again after the wait
  }
  notifier.join();
  MutexLock lock(&c.mu);
  EXPECT_EQ(c.value, 8);
}

TEST(CondVarTest, PlainWaitInALoop) {
  Counter c;
  std::thread notifier([&c] {
    for (int i = 0; i < 3; ++i) {
      MutexLock lock(&c.mu);
      ++c.value;
      c.cv.NotifyOne();
    }
  });
  {
    MutexLock lock(&c.mu);
    while (c.value < 3) c.cv.Wait(&c.mu);
    EXPECT_EQ(c.value, 3);
  }
  notifier.join();
}

TEST(CondVarTest, WaitForTimesOut) {
  Counter c;
  MutexLock lock(&c.mu);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(c.cv.WaitFor(&c.mu, 20ms, [&c]() REQUIRES(c.mu) { return c.go; }));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
  c.go = true;  // still held
  EXPECT_TRUE(c.cv.WaitFor(&c.mu, 20ms, [&c]() REQUIRES(c.mu) { return c.go; }));
}

TEST(CondVarTest, WaitUntilTimesOutWithoutANotify) {
  Counter c;
  MutexLock lock(&c.mu);
  const auto deadline = std::chrono::steady_clock::now() + 10ms;
  bool notified = true;
  // Spurious wakeups may return true early; the deadline ends the loop.
  while (notified && std::chrono::steady_clock::now() < deadline) {
    notified = c.cv.WaitUntil(&c.mu, deadline);
  }
  EXPECT_GE(std::chrono::steady_clock::now(), deadline);
  EXPECT_FALSE(c.cv.WaitUntil(&c.mu, deadline, [&c]() REQUIRES(c.mu) { return c.go; }));
}

TEST(CondVarTest, WaitUntilWithPredicateWakesOnNotify) {
  Counter c;
  std::thread notifier([&c] {
    std::this_thread::sleep_for(5ms);
    MutexLock lock(&c.mu);
    c.go = true;
    c.cv.NotifyAll();
  });
  {
    MutexLock lock(&c.mu);
    EXPECT_TRUE(c.cv.WaitUntil(&c.mu, std::chrono::steady_clock::now() + 10s,
                               [&c]() REQUIRES(c.mu) { return c.go; }));
  }
  notifier.join();
}

}  // namespace
}  // namespace kvrelay
