#include "core/timer_heap.h"

#include "base/check.h"

namespace kvrelay {

void TimerHeap::Arm(uint32_t key, Instant when) {
  KV_CHECK_NE(key, kNone);
  if (key >= pos_.size()) pos_.resize(key + 1, kNone);
  if (pos_[key] != kNone) {
    size_t i = pos_[key];
    heap_[i].when = when;
    SiftUp(i);
    SiftDown(pos_[key]);
    return;
  }
  heap_.push_back(Entry{when, key});
  pos_[key] = static_cast<uint32_t>(heap_.size() - 1);
  SiftUp(heap_.size() - 1);
}

void TimerHeap::Cancel(uint32_t key) {
  if (!IsArmed(key)) return;
  RemoveAt(pos_[key]);
}

std::optional<std::pair<Instant, uint32_t>> TimerHeap::Top() const {
  if (heap_.empty()) return std::nullopt;
  return std::make_pair(heap_[0].when, heap_[0].key);
}

std::optional<uint32_t> TimerHeap::PopExpired(Instant now) {
  if (heap_.empty() || heap_[0].when > now) return std::nullopt;
  uint32_t key = heap_[0].key;
  RemoveAt(0);
  return key;
}

void TimerHeap::RemoveAt(size_t i) {
  KV_CHECK_LT(i, heap_.size());
  uint32_t key = heap_[i].key;
  size_t last = heap_.size() - 1;
  if (i != last) Swap(i, last);
  heap_.pop_back();
  pos_[key] = kNone;
  if (i < heap_.size()) {
    const uint32_t moved = heap_[i].key;
    SiftUp(i);
    SiftDown(pos_[moved]);
  }
}

void TimerHeap::Swap(size_t a, size_t b) {
  std::swap(heap_[a], heap_[b]);
  pos_[heap_[a].key] = static_cast<uint32_t>(a);
  pos_[heap_[b].key] = static_cast<uint32_t>(b);
}

void TimerHeap::SiftUp(size_t i) {
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!Less(heap_[i], heap_[parent])) break;
    Swap(i, parent);
    i = parent;
  }
}

void TimerHeap::SiftDown(size_t i) {
  const size_t n = heap_.size();
  for (;;) {
    size_t smallest = i;
    size_t l = 2 * i + 1, r = 2 * i + 2;
    if (l < n && Less(heap_[l], heap_[smallest])) smallest = l;
    if (r < n && Less(heap_[r], heap_[smallest])) smallest = r;
    if (smallest == i) return;
    Swap(i, smallest);
    i = smallest;
  }
}

void TimerHeap::CheckInvariants() const {
  size_t armed = 0;
  for (uint32_t k = 0; k < pos_.size(); ++k) {
    if (pos_[k] == kNone) continue;
    ++armed;
    KV_CHECK_LT(pos_[k], heap_.size());
    KV_CHECK_EQ(heap_[pos_[k]].key, k);
  }
  KV_CHECK_EQ(armed, heap_.size());
  for (size_t i = 1; i < heap_.size(); ++i) {
    KV_CHECK(!Less(heap_[i], heap_[(i - 1) / 2]));
  }
}

}  // namespace kvrelay
