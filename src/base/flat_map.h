// flat_map.h — FlatMap: an open-addressing hash map, keys and values inline.
//
// Why: the core's indexes (send table: tombstones, pull keys, remembered
// answers; load table: request → slot) are looked up several times per
// input. (The transfer → slot indexes, whose key already sits in the
// owner's record, use the smaller SlotIndex: base/slot_index.h.)
// std::unordered_map allocates one node per
// entry and reaches it through a bucket array: two or three dependent cache
// misses per lookup once the table outgrows the cache (100,000 transfers in
// flight), plus a malloc/free per insert/erase. Here an entry lives in one
// array slot next to its neighbours: a lookup costs one cache miss, inserts
// and erases allocate nothing (except when the array doubles).
//
// Robin Hood linear probing with backward-shift deletion: every entry
// records its distance from its home slot; an insert displaces richer
// entries, so probe lengths stay short and even, and a miss stops as soon
// as it meets an entry closer to home than itself. The load is kept at or
// below 1/2: an insert or an erase moves the rest of its run, and at 7/8
// those runs span several cache lines (measured: 100,000 live keys cost 40%
// more instructions and twice the cache misses per input than at 1/2).
// Deletion shifts the following run back by one, so there are no deleted
// markers and churn (the core's steady state) never degrades lookups.
//
// Iteration order is a pure function of the sequence of operations (no
// random seed), but it is not insertion order; callers that act on every
// entry in an order that matters sort first (as they did with
// std::unordered_map).
//
// The interface is the subset of std::unordered_map the core uses (find,
// count, emplace, operator[], erase by key, iteration over pair<K, V>), so
// a table switches by changing a member's type. Iterators and references
// are valid until the next emplace, operator[] or erase.
// The array doubles when full and never shrinks (as unordered_map's buckets);
// the owner bounds the entry count.
//
// Thread safety: none; a value owned by one actor.
// Invariants: size_ == number of occupied slots; each occupied slot's
// dist == 1 + its distance from Home(key) (mod capacity); along a probe run
// dist grows by at most one per slot (Robin Hood order); no key appears
// twice; size_ <= capacity / 2.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/check.h"

namespace kvrelay {

template <typename K, typename V, typename Hash = std::hash<K>>
class FlatMap {
  struct Slot;

 public:
  using key_type = K;
  using mapped_type = V;
  using value_type = std::pair<K, V>;

  // A Hash declaring `static constexpr bool kSequentialKeys = true` hashes
  // keys handed out in sequence (a counter): its low bits pick the home
  // slot as they are, so the entries made last sit in adjacent slots and
  // stay in cache while the rest of a large table does not. Such keys fill
  // the array evenly by construction; any other Hash is mixed.
  static constexpr bool kSequential = requires { requires Hash::kSequentialKeys; };

  // Visits occupied slots in slot order. The key must not be modified
  // through an iterator.
  template <bool kConst>
  class Iter {
   public:
    using SlotPtr = std::conditional_t<kConst, const Slot*, Slot*>;
    using Ref = std::conditional_t<kConst, const value_type&, value_type&>;
    using Ptr = std::conditional_t<kConst, const value_type*, value_type*>;
    Iter() = default;
    Iter(SlotPtr slot, SlotPtr end) : slot_(slot), end_(end) { Skip(); }
    Ref operator*() const { return slot_->kv; }
    Ptr operator->() const { return &slot_->kv; }
    Iter& operator++() {
      ++slot_;
      Skip();
      return *this;
    }
    bool operator==(const Iter& o) const { return slot_ == o.slot_; }

   private:
    void Skip() {
      while (slot_ != end_ && slot_->dist == 0) ++slot_;
    }
    SlotPtr slot_ = nullptr;
    SlotPtr end_ = nullptr;
  };
  using iterator = Iter<false>;
  using const_iterator = Iter<true>;

  FlatMap() = default;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return slots_.size(); }

  iterator begin() { return iterator(slots_.data(), slots_.data() + slots_.size()); }
  iterator end() { return At(slots_.size()); }
  const_iterator begin() const {
    return const_iterator(slots_.data(), slots_.data() + slots_.size());
  }
  const_iterator end() const { return At(slots_.size()); }

  iterator find(const K& key) {
    const size_t i = Locate(key);
    return i == kNotFound ? end() : At(i);
  }
  const_iterator find(const K& key) const {
    const size_t i = Locate(key);
    return i == kNotFound ? end() : At(i);
  }
  size_t count(const K& key) const { return Locate(key) == kNotFound ? 0 : 1; }

  // A hint: starts loading the cache line where `key`'s probe begins, so a
  // caller that will look up several independent keys can overlap their
  // cache misses (issue them all, then do the lookups). No effect on the
  // contents; pure (a compiler builtin, no call).
  void prefetch(const K& key) const {
    if (slots_.empty()) return;
    __builtin_prefetch(&slots_[Home(key)]);
  }
  bool contains(const K& key) const { return Locate(key) != kNotFound; }

  // Inserts (key, value) if `key` is absent; leaves an existing entry as it
  // is. Returns the entry and whether it was inserted.
  std::pair<iterator, bool> emplace(const K& key, const V& value) {
    if (const size_t i = Locate(key); i != kNotFound) return {At(i), false};
    if ((size_ + 1) * 2 > slots_.size()) Grow();
    return {At(Place(key, value)), true};
  }

  V& operator[](const K& key) { return emplace(key, V{}).first->second; }

  // Removes `key`; returns how many entries were removed (0 or 1).
  size_t erase(const K& key) {
    size_t i = Locate(key);
    if (i == kNotFound) return 0;
    // Backward shift: pull each following entry that is not at home one
    // slot closer to home, until an empty slot or an entry at home.
    for (;;) {
      const size_t next = (i + 1) & mask_;
      if (slots_[next].dist <= 1) break;
      slots_[i].kv = std::move(slots_[next].kv);
      slots_[i].dist = slots_[next].dist - 1;
      i = next;
    }
    slots_[i] = Slot{};
    --size_;
    return 1;
  }

  // Makes room for `n` entries without growing.
  void reserve(size_t n) {
    while (n * 2 > slots_.size()) Grow();
  }

  // The capacity a map that has never held more than `n` entries (n ≥ 1)
  // has at most: the first array is kMinCapacity slots, each growth
  // doubles it, and it grows only when an insert would pass load 1/2.
  static constexpr size_t kMinCapacity = 16;
  static constexpr size_t CapacityFor(size_t n) {
    return std::max(kMinCapacity, std::bit_ceil(2 * n));
  }

  void clear() {
    for (Slot& s : slots_) s = Slot{};
    size_ = 0;
  }

  // O(capacity): the longest probe a lookup of a present key makes (slots
  // visited). For tests: a weak hash shows up as long runs.
  uint32_t MaxProbeLength() const {
    uint32_t longest = 0;
    for (const Slot& s : slots_) longest = s.dist > longest ? s.dist : longest;
    return longest;
  }

  // O(capacity): verifies the invariants above. KV_CHECK-fails on a violation.
  void CheckInvariants() const {
    size_t used = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.dist == 0) continue;
      ++used;
      KV_CHECK_EQ(((i - Home(s.kv.first)) & mask_) + 1, s.dist);
      // Robin Hood order: an entry away from home follows an occupied slot
      // whose entry is at least one less far from its own home.
      if (s.dist > 1) KV_CHECK_GE(slots_[(i - 1) & mask_].dist + 1, s.dist);
      KV_CHECK_EQ(Locate(s.kv.first), i);
    }
    KV_CHECK_EQ(used, size_);
    KV_CHECK_LE(size_ * 2, slots_.size());
  }

 private:
  static constexpr size_t kNotFound = SIZE_MAX;
  struct RawSlot {
    value_type kv{};
    uint32_t dist = 0;  // 0: empty; else 1 + distance from the home slot
  };
  // A slot whose size is a power of two up to a cache line is aligned to
  // its size, so it never straddles two lines: malloc returns 16-byte
  // aligned blocks, and a 32-byte slot (TransferId → uint32_t) at offset
  // 16 mod 64 split every other slot, so a probe touched two lines where
  // one would do (cachegrind: 0.3-0.5 extra misses per lookup at 100,000
  // keys). std::allocator honours the alignment (aligned operator new).
  static constexpr size_t kSlotAlign =
      (sizeof(RawSlot) <= 64 && (sizeof(RawSlot) & (sizeof(RawSlot) - 1)) == 0)
          ? sizeof(RawSlot)
          : alignof(RawSlot);
  struct alignas(kSlotAlign) Slot : RawSlot {};

  iterator At(size_t i) {
    return iterator(slots_.data() + i, slots_.data() + slots_.size());
  }
  const_iterator At(size_t i) const {
    return const_iterator(slots_.data() + i, slots_.data() + slots_.size());
  }

  // Hash, then splitmix64's finalizer, whose top bits index the
  // power-of-two array: a weak Hash (identity, or a multiply, as for
  // TypedId's dense index|generation keys) would otherwise fill long runs.
  // A kSequential Hash is used as is (see kSequential).
  size_t Home(const K& key) const {
    if constexpr (kSequential) {
      return static_cast<size_t>(Hash{}(key)) & mask_;
    } else {
      uint64_t h = static_cast<uint64_t>(Hash{}(key));
      h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
      h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
      h ^= h >> 31;
      return static_cast<size_t>(h >> shift_);
    }
  }

  size_t Locate(const K& key) const {
    if (size_ == 0) return kNotFound;
    size_t i = Home(key);
    for (uint32_t dist = 1;; ++dist) {
      const Slot& s = slots_[i];
      // An empty slot, or an entry closer to its home than we would be
      // here: the key would have been placed before it.
      if (s.dist < dist) return kNotFound;
      if (s.kv.first == key) return i;
      i = (i + 1) & mask_;
    }
  }

  // Places an absent key; the array has room. Returns its slot.
  size_t Place(value_type kv) {
    size_t i = Home(kv.first);
    uint32_t dist = 1;
    size_t placed = kNotFound;
    for (;;) {
      Slot& s = slots_[i];
      if (s.dist == 0) {
        s.kv = std::move(kv);
        s.dist = dist;
        ++size_;
        return placed == kNotFound ? i : placed;
      }
      if (s.dist < dist) {
        // Take from the rich: the resident is closer to home; it moves on.
        std::swap(s.kv, kv);
        std::swap(s.dist, dist);
        if (placed == kNotFound) placed = i;
      }
      i = (i + 1) & mask_;
      ++dist;
    }
  }
  size_t Place(const K& key, const V& value) { return Place(value_type(key, value)); }

  void Grow() {
    std::vector<Slot> old = std::move(slots_);
    const size_t cap = old.empty() ? kMinCapacity : old.size() * 2;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    shift_ = 64;
    for (size_t c = cap; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (Slot& s : old) {
      if (s.dist != 0) Place(std::move(s.kv));
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
  size_t mask_ = 0;
  int shift_ = 64;
};

}  // namespace kvrelay
