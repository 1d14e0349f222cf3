// stripe_plan.h — how one large write is cut into stripes that go over
// several connections in parallel: pure functions from (segments, stream
// count, minimum stripe size) to contiguous byte ranges of the segment
// list.
//
// Why: one tcp stream is one sender thread and one receiver thread; a big
// write over one stream cannot use more. Cutting the write's bytes (in
// segment order) into k contiguous ranges, each sent as its own frames on
// its own stream, lets k threads on each side move it. Contiguous ranges
// keep each stripe's iovecs long (large sendmsg/recvmsg calls) and its
// frames self-contained: the receiver checks every stripe's table against
// its grants on its own, exactly as for any frame. The tcp transport
// (tcp_target.h) and the raw tcp baseline (src/bench/raw_baseline.cc) cut
// the same way, so the baseline moves the same bytes over the same number
// of streams and threads.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "net/transport.h"

namespace kvrelay::net {

// Stripe cuts fall on multiples of this many bytes of the write (pages of
// the regions when segments start page-aligned, as PlanWrite's do).
constexpr uint64_t kStripeAlignBytes = 4096;

// How many stripes a write of `total_bytes` gets: 1 below 2 × min_stripe_bytes
// (a small write stays on one stream), else as many as `max_streams` allows
// with every stripe at least `min_stripe_bytes` long. REQUIRES:
// min_stripe_bytes ≥ kStripeAlignBytes.
uint32_t StripeCount(uint64_t total_bytes, uint32_t max_streams, uint64_t min_stripe_bytes);

// Cuts `segments` into `k` stripes of consecutive bytes (in segment order)
// of nearly equal size, cuts rounded down to kStripeAlignBytes (a segment
// cut in two has both offsets advanced alike); zero-byte segments are
// dropped. Concatenated, the stripes move exactly the bytes of `segments`.
// A stripe may be empty only if the write has fewer than k × kStripeAlignBytes
// bytes. REQUIRES: k ≥ 1.
std::vector<std::vector<Segment>> SplitIntoStripes(std::span<const Segment> segments, uint32_t k);

}  // namespace kvrelay::net
