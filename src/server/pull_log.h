// pull_log.h — PullLog: D's most recent pull→answer samples, one per
// answer, for `GET /debug/pulls` and `kvrelay bench transfer`.
//
// Why: /metrics has the pull→answer histogram, but a benchmark needs each
// transfer's own time (bandwidth per size, p50/p99 of one-block pulls) and
// the moment each answer arrived (abort on P → answer at D is measured
// across two processes on CLOCK_MONOTONIC, which is host-wide on Linux).
//
// Ownership: one per engine server. Thread safety: Add is called by rank
// actor threads, Since by HTTP threads; one mutex guards the ring.
// Invariants: at most `capacity` samples are kept (the oldest are
// dropped); `seq` numbers samples from 1 without gaps, so a reader that
// passes the last seq it saw never sees a sample twice and learns how many
// it missed.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "base/mutex.h"
#include "base/transfer_id.h"
#include "core/transfer_result.h"

namespace kvrelay::server {

struct PullSample {
  uint64_t seq = 0;
  TransferId transfer;
  uint32_t rank = 0;
  uint32_t blocks = 0;              // destination blocks the pull named
  double pull_to_answer_s = 0;
  TransferResult result = TransferResult::kOk;
  int64_t answered_mono_ns = 0;     // CLOCK_MONOTONIC when the answer arrived
};

class PullLog {
 public:
  explicit PullLog(size_t capacity = 65536) : capacity_(capacity == 0 ? 1 : capacity) {}
  void Add(PullSample sample);
  // Samples with seq > after, oldest first, at most `max`.
  std::vector<PullSample> Since(uint64_t after, size_t max) const;
  uint64_t last_seq() const;

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  std::deque<PullSample> ring_ GUARDED_BY(mu_);
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
};

}  // namespace kvrelay::server
