// thread_priority_test.cc — thread names and per-thread nice values.
#include "os/thread_priority.h"

#include <pthread.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace kvrelay {
namespace {

std::string ThisThreadName() {
  char buf[32] = {};
  pthread_getname_np(pthread_self(), buf, sizeof buf);
  return buf;
}

TEST(ThreadPriorityTest, NamesAreCutToFifteenCharacters) {
  std::string name;
  std::thread t([&] {
    NameThisThread("kv-a-name-longer-than-fifteen");
    name = ThisThreadName();
  });
  t.join();
  EXPECT_EQ(name, "kv-a-name-longe");
}

// Linux keeps a nice value per thread: setting one leaves the others, and
// a thread started afterwards inherits its creator's (which Node relies on
// to start ZeroMQ's threads at the control threads' value).
TEST(ThreadPriorityTest, NiceIsPerThreadAndInherited) {
  const int main_before = ThisThreadNice();
  int set = 99, child = 99;
  std::thread t([&] {
    ASSERT_TRUE(SetThisThreadNice(main_before + 3).ok());  // raising needs no privilege
    set = ThisThreadNice();
    std::thread c([&] { child = ThisThreadNice(); });
    c.join();
  });
  t.join();
  EXPECT_EQ(set, main_before + 3);
  EXPECT_EQ(child, main_before + 3);
  EXPECT_EQ(ThisThreadNice(), main_before);
}

TEST(ThreadPriorityTest, OutOfRangeIsRefused) {
  EXPECT_EQ(SetThisThreadNice(-21).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SetThisThreadNice(20).code(), StatusCode::kInvalidArgument);
}

// The probe answers for this process and changes no running thread.
TEST(ThreadPriorityTest, CanSetNiceProbesOnItsOwnThread) {
  const int before = ThisThreadNice();
  EXPECT_TRUE(CanSetNice(before + 1));
  const bool lower = CanSetNice(-5);
  EXPECT_EQ(ThisThreadNice(), before);
  int got = 99;
  Status s;
  std::thread t([&] {
    s = SetThisThreadNice(-5);
    got = ThisThreadNice();
  });
  t.join();
  EXPECT_EQ(s.ok(), lower) << s.ToString();
  if (lower) {
    EXPECT_EQ(got, -5);
  } else {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  }
}

TEST(ThreadPriorityTest, SliceOutOfRangeIsRefused) {
  EXPECT_EQ(SetThisThreadSliceUs(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SetThisThreadSliceUs(99).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SetThisThreadSliceUs(100001).code(), StatusCode::kInvalidArgument);
}

// A slice is per thread, inherited by threads started afterwards, keeps the
// nice value, and 0 gives the default back. Node relies on the inheritance
// for ZeroMQ's threads and EngineServer for httplib's.
TEST(ThreadPriorityTest, SliceIsPerThreadInheritedAndKeepsNice) {
  const int main_slice = ThisThreadSliceUs();
  Status s;
  int set = -1, child = -1, nice_before = 99, nice_after = 99, reset = -1;
  std::thread t([&] {
    ASSERT_TRUE(SetThisThreadNice(ThisThreadNice() + 2).ok());
    nice_before = ThisThreadNice();
    s = SetThisThreadSliceUs(250);
    if (!s.ok()) return;
    set = ThisThreadSliceUs();
    nice_after = ThisThreadNice();
    std::thread c([&] { child = ThisThreadSliceUs(); });
    c.join();
    ASSERT_TRUE(SetThisThreadSliceUs(0).ok());
    reset = ThisThreadSliceUs();
  });
  t.join();
  if (s.code() == StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "this kernel keeps no per-thread slice: " << s.ToString();
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(set, 250);
  EXPECT_EQ(child, 250);
  EXPECT_EQ(nice_after, nice_before);
  EXPECT_EQ(reset, main_slice);  // the default again
  EXPECT_EQ(ThisThreadSliceUs(), main_slice);
}

}  // namespace
}  // namespace kvrelay
