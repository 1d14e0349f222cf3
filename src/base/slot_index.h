// slot_index.h — SlotIndex: a hash index from a key to a slot number of its
// owner's record array, 8 bytes per array entry.
//
// Why: the send table's and the load table's transfer indexes are looked up
// with a new random 128-bit transfer id on every input. As a
// FlatMap<TransferId, uint32_t> each entry took a 32-byte slot, so 100,000
// transfers in flight made an 8 MiB array at load 1/2, and nearly every
// lookup was a cache miss (bench core: 25,000 in flight ran at 0.9 of the
// speed at 1,000, 100,000 at 0.5). The key is already in the owner's
// record, so the index need not hold it: an entry here is a 32-bit hash tag
// and the 32-bit slot. The array is a quarter of the size (2 MiB for
// 100,000), and the owner's record, which a lookup reads anyway, confirms
// the key.
//
// The owner passes `key_of` (slot → const K&, reading its own record) to
// every call that compares keys. A tag mismatch skips an entry without
// reading its record; a tag match reads the record to confirm. Keys with the
// same home share the tag's low bits, so the rest tell them apart (14 bits
// at 100,000 entries): a false match, which costs one extra record read,
// comes about once in 40,000 lookups.
//
// Robin Hood linear probing with backward-shift deletion, as FlatMap: the
// home slot is the tag's low bits, an entry's distance from home is
// computed from its tag, an insert displaces entries closer to home, an
// erase shifts the following run back by one (no deleted markers, so churn
// never degrades lookups). Load at or below 1/2; the array doubles when it
// would pass that, rehashing from the tags alone (no record is read), and
// never shrinks. Capacity stays below 2^32 entries.
//
// Thread safety: none; a value owned by one actor.
// Invariants: size_ == number of occupied entries; an occupied entry at
// position i sits Distance(i) ≤ i's predecessor's distance + 1 from its home
// (Robin Hood order); no key appears twice; no slot number appears twice;
// size_ <= capacity / 2.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "base/check.h"

namespace kvrelay {

template <typename K, typename Hash = std::hash<K>>
class SlotIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;  // "absent"; never a slot

  SlotIndex() = default;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return entries_.size(); }

  // The slot `key` maps to, or kNone.
  template <typename KeyOf>
  uint32_t Find(const K& key, const KeyOf& key_of) const {
    const size_t i = Locate(key, TagOf(key), key_of);
    return i == kNotFound ? kNone : entries_[i].slot;
  }
  template <typename KeyOf>
  bool Contains(const K& key, const KeyOf& key_of) const {
    return Find(key, key_of) != kNone;
  }

  // A hint: starts loading the cache line where `key`'s probe begins, so a
  // caller can overlap this miss with unrelated work. No effect on the
  // contents; pure (a compiler builtin, no call).
  void Prefetch(const K& key) const {
    if (entries_.empty()) return;
    __builtin_prefetch(&entries_[TagOf(key) & mask_]);
  }

  // Maps `key` to `slot`. `key` must be absent and `slot` not kNone (a
  // caller bug otherwise: KV_CHECK). `key_of` is consulted for the entries
  // already present only.
  template <typename KeyOf>
  void Insert(const K& key, uint32_t slot, const KeyOf& key_of) {
    KV_CHECK_NE(slot, kNone);
    const uint32_t tag = TagOf(key);
    KV_CHECK(Locate(key, tag, key_of) == kNotFound);
    if ((size_ + 1) * 2 > entries_.size()) Grow();
    Place(Entry{tag, slot});
  }

  // Removes `key`; returns whether it was present. `key_of(slot)` must
  // still give `key` for its entry.
  template <typename KeyOf>
  bool Erase(const K& key, const KeyOf& key_of) {
    size_t i = Locate(key, TagOf(key), key_of);
    if (i == kNotFound) return false;
    // Backward shift: pull each following entry that is not at home one
    // position closer to home, until an empty entry or one at home.
    for (;;) {
      const size_t next = (i + 1) & mask_;
      if (entries_[next].slot == kNone || Distance(next) == 0) break;
      entries_[i] = entries_[next];
      i = next;
    }
    entries_[i] = Entry{};
    --size_;
    return true;
  }

  // Calls fn(slot) for every entry, in array order (a pure function of the
  // operations made, but not insertion order: sort if order matters).
  template <typename Fn>
  void ForEach(const Fn& fn) const {
    for (const Entry& e : entries_) {
      if (e.slot != kNone) fn(e.slot);
    }
  }

  // Makes room for `n` entries without growing.
  void Reserve(size_t n) {
    while (n * 2 > entries_.size()) Grow();
  }

  void Clear() {
    for (Entry& e : entries_) e = Entry{};
    size_ = 0;
  }

  // O(capacity): the longest probe a lookup of a present key makes (entries
  // visited). For tests: a weak hash shows up as long runs.
  uint32_t MaxProbeLength() const {
    uint32_t longest = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].slot == kNone) continue;
      const uint32_t d = static_cast<uint32_t>(Distance(i)) + 1;
      longest = d > longest ? d : longest;
    }
    return longest;
  }

  // O(capacity): verifies the invariants above, and that every entry's tag
  // is its record's key's tag. KV_CHECK-fails on a violation.
  template <typename KeyOf>
  void CheckInvariants(const KeyOf& key_of) const {
    size_t used = 0;
    std::vector<uint32_t> slots;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.slot == kNone) continue;
      ++used;
      slots.push_back(e.slot);
      const K& key = key_of(e.slot);
      KV_CHECK_EQ(e.tag, TagOf(key));
      const size_t prev = (i - 1) & mask_;
      if (Distance(i) > 0) {
        KV_CHECK(entries_[prev].slot != kNone);
        KV_CHECK_GE(Distance(prev) + 1, Distance(i));
      }
      KV_CHECK_EQ(Locate(key, e.tag, key_of), i);
    }
    KV_CHECK_EQ(used, size_);
    KV_CHECK_LE(size_ * 2, entries_.size());
    std::sort(slots.begin(), slots.end());
    KV_CHECK(std::adjacent_find(slots.begin(), slots.end()) == slots.end());
  }

 private:
  static constexpr size_t kNotFound = SIZE_MAX;
  struct Entry {
    uint32_t tag = 0;
    uint32_t slot = kNone;  // kNone: empty
  };
  static_assert(sizeof(Entry) == 8);

  // Hash, then splitmix64's finalizer (a weak Hash would otherwise fill
  // long runs); the tag is the top 32 bits, and its low bits pick home.
  static uint32_t TagOf(const K& key) {
    uint64_t h = static_cast<uint64_t>(Hash{}(key));
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return static_cast<uint32_t>(h >> 32);
  }
  // How far the occupied entry at `i` sits from its home.
  size_t Distance(size_t i) const { return (i - (entries_[i].tag & mask_)) & mask_; }

  template <typename KeyOf>
  size_t Locate(const K& key, uint32_t tag, const KeyOf& key_of) const {
    if (size_ == 0) return kNotFound;
    size_t i = tag & mask_;
    for (size_t dist = 0;; ++dist) {
      const Entry& e = entries_[i];
      // An empty entry, or one closer to its home than we would be here:
      // the key would have been placed before it.
      if (e.slot == kNone || Distance(i) < dist) return kNotFound;
      if (e.tag == tag && key_of(e.slot) == key) return i;
      i = (i + 1) & mask_;
    }
  }

  // Places an entry for an absent key; the array has room.
  void Place(Entry entry) {
    size_t i = entry.tag & mask_;
    size_t dist = 0;
    for (;;) {
      Entry& e = entries_[i];
      if (e.slot == kNone) {
        e = entry;
        ++size_;
        return;
      }
      const size_t resident = Distance(i);
      if (resident < dist) {
        // Take from the rich: the resident is closer to home; it moves on.
        std::swap(e, entry);
        dist = resident;
      }
      i = (i + 1) & mask_;
      ++dist;
    }
  }

  void Grow() {
    std::vector<Entry> old = std::move(entries_);
    const size_t cap = old.empty() ? 16 : old.size() * 2;
    KV_CHECK_LE(cap, size_t{1} << 32);
    entries_.assign(cap, Entry{});
    mask_ = cap - 1;
    size_ = 0;
    for (const Entry& e : old) {
      if (e.slot != kNone) Place(e);
    }
  }

  std::vector<Entry> entries_;
  size_t size_ = 0;
  size_t mask_ = 0;
};

}  // namespace kvrelay
