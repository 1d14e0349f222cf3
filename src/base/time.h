// time.h — Duration and Instant: integer nanoseconds.
//
// Why: pure code never reads a clock. Time enters as an Instant argument
// (`now`) chosen by the driver: the simulator's virtual clock or the
// runtime's monotonic clock. Integers keep arithmetic exact and runs
// bit-identical across compilers. Instant 0 is the driver's epoch.
//
// Thread safety: value types.
#pragma once

#include <compare>
#include <cstdint>
#include <limits>

namespace kvrelay {

class Duration {
 public:
  constexpr Duration() = default;
  static constexpr Duration Nanoseconds(int64_t n) { return Duration(n); }
  static constexpr Duration Microseconds(int64_t n) { return Duration(n * 1000); }
  static constexpr Duration Milliseconds(int64_t n) {
    return Duration(n * 1000000);
  }
  static constexpr Duration Seconds(int64_t n) {
    return Duration(n * 1000000000);
  }
  static constexpr Duration Zero() { return Duration(0); }
  static constexpr Duration Max() {
    return Duration(std::numeric_limits<int64_t>::max() / 4);
  }

  constexpr int64_t ns() const { return ns_; }
  constexpr double seconds() const { return static_cast<double>(ns_) / 1e9; }
  constexpr double millis() const { return static_cast<double>(ns_) / 1e6; }

  constexpr Duration operator+(Duration o) const { return Duration(ns_ + o.ns_); }
  constexpr Duration operator-(Duration o) const { return Duration(ns_ - o.ns_); }
  constexpr Duration operator*(int64_t k) const { return Duration(ns_ * k); }
  constexpr Duration operator/(int64_t k) const { return Duration(ns_ / k); }
  constexpr auto operator<=>(const Duration&) const = default;

 private:
  constexpr explicit Duration(int64_t ns) : ns_(ns) {}
  int64_t ns_ = 0;
};

class Instant {
 public:
  constexpr Instant() = default;
  static constexpr Instant FromNanos(int64_t ns) { return Instant(ns); }
  static constexpr Instant Epoch() { return Instant(0); }
  // Far enough in the future that adding any Duration::Max() still fits.
  static constexpr Instant Never() {
    return Instant(std::numeric_limits<int64_t>::max() / 2);
  }

  constexpr int64_t ns() const { return ns_; }
  // Seconds since the driver's epoch, for logs and reports.
  constexpr double seconds() const { return static_cast<double>(ns_) / 1e9; }
  constexpr Instant operator+(Duration d) const { return Instant(ns_ + d.ns()); }
  constexpr Instant operator-(Duration d) const { return Instant(ns_ - d.ns()); }
  constexpr Duration operator-(Instant o) const {
    return Duration::Nanoseconds(ns_ - o.ns_);
  }
  constexpr auto operator<=>(const Instant&) const = default;

 private:
  constexpr explicit Instant(int64_t ns) : ns_(ns) {}
  int64_t ns_ = 0;
};

}  // namespace kvrelay
