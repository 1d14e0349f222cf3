#include "base/time.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace kvrelay {
namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

// ---------------------------------------------------------------------------
// Duration.

TEST(DurationTest, DefaultIsZero) {
  EXPECT_EQ(Duration().ns(), 0);
  EXPECT_EQ(Duration(), Duration::Zero());
  EXPECT_EQ(Duration::Zero().ns(), 0);
}

TEST(DurationTest, Units) {
  EXPECT_EQ(Duration::Nanoseconds(7).ns(), 7);
  EXPECT_EQ(Duration::Microseconds(1).ns(), 1000);
  EXPECT_EQ(Duration::Microseconds(3).ns(), 3000);
  EXPECT_EQ(Duration::Milliseconds(1).ns(), 1000000);
  EXPECT_EQ(Duration::Milliseconds(250).ns(), 250000000);
  EXPECT_EQ(Duration::Seconds(1).ns(), 1000000000);
  EXPECT_EQ(Duration::Seconds(480).ns(), int64_t{480} * 1000000000);
  EXPECT_EQ(Duration::Seconds(-2).ns(), -2000000000);
  EXPECT_EQ(Duration::Seconds(1), Duration::Milliseconds(1000));
  EXPECT_EQ(Duration::Milliseconds(1), Duration::Microseconds(1000));
  EXPECT_EQ(Duration::Microseconds(1), Duration::Nanoseconds(1000));
}

TEST(DurationTest, Arithmetic) {
  const Duration a = Duration::Milliseconds(1500);
  const Duration b = Duration::Milliseconds(500);
  EXPECT_EQ(a + b, Duration::Seconds(2));
  EXPECT_EQ(a - b, Duration::Seconds(1));
  EXPECT_EQ(b - a, Duration::Seconds(-1));
  EXPECT_EQ(b * 3, a);
  EXPECT_EQ(a / 3, b);
  EXPECT_EQ(Duration::Nanoseconds(7) / 2, Duration::Nanoseconds(3));  // truncates
  EXPECT_EQ(Duration::Nanoseconds(-7) / 2, Duration::Nanoseconds(-3));
  EXPECT_EQ(a * 0, Duration::Zero());
}

TEST(DurationTest, Comparisons) {
  const Duration a = Duration::Milliseconds(1);
  const Duration b = Duration::Milliseconds(2);
  EXPECT_LT(a, b);
  EXPECT_LE(a, b);
  EXPECT_LE(a, a);
  EXPECT_GT(b, a);
  EXPECT_GE(b, a);
  EXPECT_GE(b, b);
  EXPECT_EQ(a, Duration::Microseconds(1000));
  EXPECT_NE(a, b);
  EXPECT_LT(Duration::Seconds(-1), Duration::Zero());
  EXPECT_LT(Duration::Seconds(1000000), Duration::Max());
}

TEST(DurationTest, SecondsAndMillis) {
  EXPECT_DOUBLE_EQ(Duration::Milliseconds(1500).seconds(), 1.5);
  EXPECT_DOUBLE_EQ(Duration::Milliseconds(1500).millis(), 1500.0);
  EXPECT_DOUBLE_EQ(Duration::Microseconds(250).millis(), 0.25);
  EXPECT_DOUBLE_EQ(Duration::Nanoseconds(1).seconds(), 1e-9);
  EXPECT_DOUBLE_EQ(Duration::Seconds(-3).seconds(), -3.0);
  EXPECT_DOUBLE_EQ(Duration::Zero().millis(), 0.0);
}

TEST(DurationTest, MaxLeavesHeadroom) {
  EXPECT_EQ(Duration::Max().ns(), kI64Max / 4);
  // Two Max()es still add without overflow (UBSan would trap here).
  EXPECT_GT((Duration::Max() + Duration::Max()).ns(), Duration::Max().ns());
}

TEST(DurationTest, IsConstexpr) {
  static_assert(Duration::Seconds(2).ns() == 2000000000);
  static_assert(Duration::Milliseconds(3) + Duration::Microseconds(5) ==
                Duration::Nanoseconds(3005000));
  static_assert(Duration::Seconds(1) > Duration::Milliseconds(999));
  SUCCEED();
}

// ---------------------------------------------------------------------------
// Instant.

TEST(InstantTest, DefaultIsEpoch) {
  EXPECT_EQ(Instant(), Instant::Epoch());
  EXPECT_EQ(Instant::Epoch().ns(), 0);
  EXPECT_EQ(Instant::FromNanos(123).ns(), 123);
}

TEST(InstantTest, Arithmetic) {
  const Instant t0 = Instant::FromNanos(1000);
  const Instant t1 = t0 + Duration::Microseconds(2);
  EXPECT_EQ(t1.ns(), 3000);
  EXPECT_EQ(t1 - t0, Duration::Microseconds(2));
  EXPECT_EQ(t0 - t1, Duration::Microseconds(-2));
  EXPECT_EQ(t1 - Duration::Microseconds(2), t0);
  EXPECT_EQ(t0 - t0, Duration::Zero());
  EXPECT_EQ(Instant::Epoch() + Duration::Seconds(5) - Instant::Epoch(),
            Duration::Seconds(5));
  // Before the epoch is representable.
  EXPECT_EQ((Instant::Epoch() - Duration::Seconds(1)).ns(), -1000000000);
}

TEST(InstantTest, Comparisons) {
  const Instant a = Instant::FromNanos(10);
  const Instant b = Instant::FromNanos(20);
  EXPECT_LT(a, b);
  EXPECT_LE(a, a);
  EXPECT_GT(b, a);
  EXPECT_GE(b, b);
  EXPECT_EQ(a, Instant::FromNanos(10));
  EXPECT_NE(a, b);
  EXPECT_LT(b, Instant::Never());
  EXPECT_LT(Instant::Epoch() + Duration::Seconds(1000000), Instant::Never());
}

TEST(InstantTest, Seconds) {
  EXPECT_DOUBLE_EQ(Instant::FromNanos(2500000000).seconds(), 2.5);
  EXPECT_DOUBLE_EQ(Instant::Epoch().seconds(), 0.0);
}

TEST(InstantTest, NeverPlusMaxDoesNotOverflow) {
  EXPECT_EQ(Instant::Never().ns(), kI64Max / 2);
  // Under UBSan a signed overflow here would abort the test.
  const Instant later = Instant::Never() + Duration::Max();
  EXPECT_GT(later, Instant::Never());
  EXPECT_EQ(later.ns(), kI64Max / 2 + kI64Max / 4);
  EXPECT_EQ(later - Instant::Never(), Duration::Max());
  // An Instant near Never() plus a Max() deadline also fits.
  const Instant late = Instant::Never() - Duration::Seconds(1);
  EXPECT_GT(late + Duration::Max(), late);
  // Never() minus the epoch is a positive duration, not an overflow.
  EXPECT_GT(Instant::Never() - Instant::Epoch(), Duration::Max());
  static_assert((Instant::Never() + Duration::Max()).ns() > 0);
}

}  // namespace
}  // namespace kvrelay
