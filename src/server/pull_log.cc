#include "server/pull_log.h"

#include <algorithm>

namespace kvrelay::server {

void PullLog::Add(PullSample sample) {
  MutexLock lock(&mu_);
  sample.seq = next_seq_++;
  if (ring_.size() == capacity_) ring_.pop_front();
  ring_.push_back(sample);
}

std::vector<PullSample> PullLog::Since(uint64_t after, size_t max) const {
  MutexLock lock(&mu_);
  std::vector<PullSample> out;
  if (ring_.empty()) return out;
  // seq is contiguous in the ring: index = seq - front.seq.
  const uint64_t first = ring_.front().seq;
  size_t i = after < first ? 0 : static_cast<size_t>(after - first + 1);
  for (; i < ring_.size() && out.size() < max; ++i) out.push_back(ring_[i]);
  return out;
}

uint64_t PullLog::last_seq() const {
  MutexLock lock(&mu_);
  return next_seq_ - 1;
}

}  // namespace kvrelay::server
