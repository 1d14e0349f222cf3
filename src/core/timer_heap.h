// timer_heap.h — TimerHeap: an indexed binary min-heap of (deadline, key).
//
// Why: the send table arms one expiry per send and one deadline per pull,
// and cancels most of them long before they fire. A lazily-deleted heap
// would keep every cancelled timer until its time (480 s by default), so
// memory would grow with the arrival rate. An indexed heap removes a timer
// in O(log n) and holds exactly the armed ones. Ties break by key so the
// firing order is a pure function of the inputs.
//
// Keys are small integers chosen by the owner (slab slot indices); the
// position table grows to the largest key seen.
//
// Thread safety: none; owned by one actor.
// Invariants: heap order on (when, key); pos_[heap_[i].key] == i for all i;
// pos_[k] == kNone iff k is not armed.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "base/time.h"

namespace kvrelay {

class TimerHeap {
 public:
  // Arms `key` at `when`, moving it if it was already armed.
  void Arm(uint32_t key, Instant when);
  // Disarms `key`; a no-op if it was not armed.
  void Cancel(uint32_t key);
  bool IsArmed(uint32_t key) const {
    return key < pos_.size() && pos_[key] != kNone;
  }
  // The earliest timer, if any.
  std::optional<std::pair<Instant, uint32_t>> Top() const;
  // Removes and returns the earliest timer whose deadline is <= now.
  std::optional<uint32_t> PopExpired(Instant now);
  size_t size() const { return heap_.size(); }
  bool empty() const { return heap_.empty(); }
  // O(n): verifies the heap and position invariants.
  void CheckInvariants() const;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Entry {
    Instant when;
    uint32_t key;
  };
  static bool Less(const Entry& a, const Entry& b) {
    return a.when < b.when || (a.when == b.when && a.key < b.key);
  }
  void SiftUp(size_t i);
  void SiftDown(size_t i);
  void Swap(size_t a, size_t b);
  void RemoveAt(size_t i);

  std::vector<Entry> heap_;
  std::vector<uint32_t> pos_;
};

}  // namespace kvrelay
