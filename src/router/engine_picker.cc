#include "router/engine_picker.h"

#include "base/check.h"

namespace kvrelay::router {

std::optional<size_t> PickLeastLoaded(std::span<const PickCandidate> candidates,
                                      size_t* cursor) {
  KV_CHECK(cursor != nullptr);
  const size_t n = candidates.size();
  if (n == 0) return std::nullopt;
  std::optional<uint64_t> least;
  for (const PickCandidate& c : candidates) {
    if (c.eligible && (!least || c.outstanding < *least)) least = c.outstanding;
  }
  if (!least) return std::nullopt;
  const size_t start = *cursor % n;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (start + k) % n;
    if (candidates[i].eligible && candidates[i].outstanding == *least) {
      *cursor = (i + 1) % n;
      return i;
    }
  }
  KV_CHECK_MSG(false, "an eligible engine with the least load must exist");
  return std::nullopt;
}

}  // namespace kvrelay::router
