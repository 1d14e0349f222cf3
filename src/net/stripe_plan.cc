// stripe_plan.cc — see stripe_plan.h.
#include "net/stripe_plan.h"

#include <algorithm>

#include "base/check.h"

namespace kvrelay::net {

uint32_t StripeCount(uint64_t total_bytes, uint32_t max_streams, uint64_t min_stripe_bytes) {
  KV_CHECK(min_stripe_bytes >= kStripeAlignBytes);
  if (max_streams <= 1 || total_bytes < 2 * min_stripe_bytes) return 1;
  return static_cast<uint32_t>(std::min<uint64_t>(max_streams, total_bytes / min_stripe_bytes));
}

std::vector<std::vector<Segment>> SplitIntoStripes(std::span<const Segment> segments, uint32_t k) {
  KV_CHECK(k >= 1);
  uint64_t total = 0;
  for (const Segment& s : segments) total += s.bytes;
  std::vector<std::vector<Segment>> stripes(k);
  size_t i = 0;       // the segment being cut
  uint64_t done = 0;  // bytes of segments[i] already given to a stripe
  uint64_t at = 0;    // bytes of the write given to stripes so far
  for (uint32_t j = 0; j < k; ++j) {
    // Stripe j ends at the j+1-th cut; the last one takes the rest.
    const uint64_t end =
        j + 1 == k ? total
                   : std::max(at, static_cast<uint64_t>(static_cast<unsigned __int128>(total) *
                                                        (j + 1) / k) /
                                      kStripeAlignBytes * kStripeAlignBytes);
    while (at < end) {
      const Segment& s = segments[i];
      const uint64_t piece = std::min(s.bytes - done, end - at);
      if (piece > 0) stripes[j].push_back(Segment{s.src_offset + done, s.dst_offset + done, piece});
      done += piece;
      at += piece;
      if (done == s.bytes) {
        ++i;
        done = 0;
      }
    }
    // Skip zero-byte segments so the next stripe starts on bytes.
    while (i < segments.size() && segments[i].bytes == 0) ++i;
  }
  return stripes;
}

}  // namespace kvrelay::net
