// raw_baseline.h — the baselines `kvrelay bench transfer` compares kvrelay
// against: the same bytes moved between two processes with nothing but the
// raw mechanism (memcpy into a shared mapping, a blocking socket stream, a
// UCX put), and a bare ZeroMQ round trip.
//
// Why: this machine is shared and noisy, so a bandwidth figure means little
// on its own; a ratio to the raw mechanism measured minutes apart in the
// same run does. Each baseline moves exactly the segments kvrelay's write
// plan would (same sizes, same per-layer chunks) out of a source pool and
// into a destination pool as large as kvrelay's, walking through both so
// that no transfer finds its bytes in the cache — the mistake that makes
// same-host benchmarks report 40 GB/s.
//
// Each function forks one helper process (the receiver, or the echo
// server) and must be called while the calling process has a single thread
// (before any HTTP client or load thread starts, or after they ended).
// One transfer at a time, as kvrelay's bench drives it; on one thread,
// except tcp with tcp_streams > 1, which stripes a large transfer exactly as
// kvrelay's tcp transport does (net/stripe_plan.h): the same stripes over
// as many streams, one sending thread per stripe (the caller's and threads
// started per transfer, joined before the next) and one receiving thread
// per stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "net/transport.h"

namespace kvrelay::bench {

// One transfer: segments from the source pool to the destination pool.
using RawTransfer = std::vector<net::Segment>;

struct RawOptions {
  uint64_t src_pool_bytes = 0;   // every segment's src range lies inside
  uint64_t dst_pool_bytes = 0;   // every segment's dst range lies inside
  std::string ucx_tls;           // ucx: UCX_TLS ("" = UCX's choice)
  // tcp: streams, and the stripe size, as kvrelay's --tcp-streams and
  // TransportOptions::tcp_stripe_min_bytes (1: one stream, no striping).
  uint32_t tcp_streams = 1;
  uint64_t tcp_stripe_min_bytes = net::TransportOptions{}.tcp_stripe_min_bytes;
  // Each transfer (of both passes) starts after the sender slept this
  // long, as kvrelay's start after a prefill and two HTTP legs (0: back to
  // back, both processes' threads still awake from the last one). tcp's
  // receiving threads sleep in recv meanwhile; ucx's helper progresses its
  // worker throughout; shm has no receiver.
  std::chrono::microseconds idle_before{0};
};

// Seconds each transfer took, in order. Errors: kUnavailable (a helper
// process or the mechanism failed), kDataLoss (the receiver did not see the
// bytes that were sent: the baseline itself is broken).
Result<std::vector<double>> RawShmCopy(const std::vector<RawTransfer>& transfers,
                                       const RawOptions& options);
Result<std::vector<double>> RawTcpStream(const std::vector<RawTransfer>& transfers,
                                         const RawOptions& options);
Result<std::vector<double>> RawUcxPut(const std::vector<RawTransfer>& transfers,
                                      const RawOptions& options);

// Round-trip seconds of `samples` messages of `payload_bytes` from a DEALER
// to a ROUTER in another process that echoes them, over tcp loopback.
// `gap`: idle time before each round trip (0: back to back). With a gap
// both processes' threads are asleep when a message comes, as a rank's
// threads are when a pull comes; back to back they are still awake.
Result<std::vector<double>> ZmqRoundTrips(uint32_t samples, uint32_t payload_bytes,
                                          std::chrono::microseconds gap = {});

}  // namespace kvrelay::bench
