// clock.h — the process's clock: the one place real time enters kvrelay.
//
// Pure layers take `Instant now` as an argument; the drivers (net, runtime,
// server, router) read it here (steady, monotonic) and pass it in.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

#include "base/time.h"

namespace kvrelay {

inline Instant MonoNow() {
  return Instant::FromNanos(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count());
}

// Steady-clock seconds since `t0`: the drivers', benches' and CLI's spans,
// timeouts and progress lines.
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Wall-clock seconds since the Unix epoch (for the `created` field of API
// responses and for incarnation numbers; never for deadlines).
inline int64_t WallSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// An incarnation number that grows across restarts of a process:
// deciseconds since 2025-01-01 (fits 32 bits until 2038).
inline uint32_t NewIncarnation() {
  const int64_t ds = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count() / 100 - int64_t{1735689600} * 10;
  return static_cast<uint32_t>(ds > 0 ? ds : 1);
}

}  // namespace kvrelay
