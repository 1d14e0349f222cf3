// block_pool.h — BlockPool: one rank's fixed set of KV blocks, with
// refcounts, generations and a content-hash prefix cache.
//
// Why: a KV block is shared by everything that reads it — the request that
// computed it, later requests that hit it in the prefix cache, and an
// in-flight hand-off to a decode engine. A block may only be rewritten once
// all of them are done, so each block carries a refcount. Handles outlive
// lives: a completion or an abort can name a block after it was freed and
// handed to another request, so every handle carries the generation of the
// life it names and the pool bumps the generation whenever that life ends
// (freed, evicted, reset). A stale handle is then detectable (IsLive) instead
// of silently touching another request's KV.
//
// Blocks whose content is registered under a hash stay in the prefix cache
// after their last reference is dropped ("cached-idle"): a later request with
// the same prefix can take them back via Lookup. When no free block is left,
// Allocate evicts the cached-idle block that went idle longest ago (LRU).
//
// Every block is in exactly one state:
//   free        refcount == 0, no hash, on the free list;
//   referenced  refcount  > 0, with or without a hash, on no list;
//   cached-idle refcount == 0, with a hash, on the LRU list.
//
// Owner: the rank's engine actor owns one BlockPool per KV pool.
// Thread safety: none; used from the owning actor's thread only.
// Invariants (checked by CheckInvariants):
//   num_free() + num_referenced() + num_cached_idle() == capacity();
//   the free list holds exactly the free blocks, each once;
//   the LRU list holds exactly the cached-idle blocks, each once, with
//   consistent prev/next links;
//   the hash index maps h -> b iff block b is cached with hash h;
//   no block's generation is 0, so a default BlockId{} is never live.
// Every operation except Reset, ResetPrefixCache and CheckInvariants is O(1)
// (the hash index is an unordered_map: O(1) expected). On the success paths
// only Cache allocates (a hash-index node); the ResourceExhausted status and
// CheckInvariants' scratch space allocate too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "core/block_id.h"

namespace kvrelay {

class BlockPool {
 public:
  // A pool of `capacity` free blocks, indices [0, capacity), all at
  // generation 1. REQUIRES: capacity < UINT32_MAX.
  explicit BlockPool(uint32_t capacity);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Takes a block with refcount 1: a free block if there is one, else the
  // least-recently-idled cached-idle block, which leaves the prefix cache and
  // starts a new generation (old handles to it become stale). Returns
  // ResourceExhaustedError if every block is referenced.
  Result<BlockId> Allocate();

  // Adds a reference. REQUIRES: IsLive(id). Ref of a cached-idle block takes
  // it off the LRU list (it is no longer evictable).
  void Ref(BlockId id);

  // Drops a reference. REQUIRES: the generation matches and refcount > 0.
  // At refcount 0 a cached block becomes cached-idle (LRU tail); an uncached
  // block returns to the free list and its generation is bumped.
  void Unref(BlockId id);

  // True iff `id` names a block's current life: the index is in range, the
  // generation matches, and the block is referenced or cached-idle.
  bool IsLive(BlockId id) const;

  // Registers referenced block `id` in the prefix cache under
  // `content_hash`. A no-op if the hash already names a block (this one or
  // another: the first registration wins) or if the block already has a
  // hash (a block has at most one). REQUIRES: generation matches and
  // refcount > 0.
  void Cache(BlockId id, uint64_t content_hash);

  // On a hit, adds a reference to the block cached under `content_hash`
  // (taking it off the LRU list if it was idle) and returns its handle.
  std::optional<BlockId> Lookup(uint64_t content_hash);

  // True iff a block is cached under `content_hash`. Adds no reference.
  bool Contains(uint64_t content_hash) const;

  // Drops every cached-idle block to the free list, bumping its generation,
  // and empties the hash index. Returns false and changes nothing if any
  // block is referenced. O(capacity).
  [[nodiscard]] bool ResetPrefixCache();

  // Resets the whole KV pool, for lifecycle operations that reset the cache
  // (e.g. weight reload): on success every block is free, the prefix cache
  // is empty, and EVERY block's generation is bumped, so no handle from
  // before the reset is live. Returns false and changes nothing while any
  // block is referenced (refcount > 0); never aborts. O(capacity).
  [[nodiscard]] bool Reset();

  size_t capacity() const { return blocks_.size(); }
  size_t num_free() const { return free_.size(); }
  // Blocks with refcount > 0.
  size_t num_referenced() const { return num_referenced_; }
  // Blocks in the prefix cache with refcount 0 (evictable).
  size_t num_cached_idle() const { return num_cached_idle_; }
  // Blocks with a hash, referenced or idle.
  size_t num_cached() const { return index_.size(); }

  // O(capacity + num_cached()): verifies the invariants above; KV_CHECK
  // fails on a violation.
  void CheckInvariants() const;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;

  struct Block {
    uint32_t refcount = 0;
    uint32_t generation = 1;
    // LRU links; kNone when not on the LRU list or at its end.
    uint32_t lru_prev = kNone;
    uint32_t lru_next = kNone;
    bool cached = false;
    uint64_t hash = 0;  // meaningful iff cached
  };

  // KV_CHECKs that `id` is in range and its generation matches; returns the
  // block.
  Block& CheckedBlock(BlockId id);
  // Ends the block's current life: next generation, skipping 0 on wrap.
  static void BumpGeneration(Block& b);
  void LruPushBack(uint32_t index);
  void LruRemove(uint32_t index);
  // Removes the block from the hash index and clears its hash.
  void Uncache(uint32_t index);
  // Common body of Reset and ResetPrefixCache.
  bool ResetImpl(bool bump_free);

  std::vector<Block> blocks_;
  // Stack of free block indices; capacity reserved up front so pushes never
  // allocate.
  std::vector<uint32_t> free_;
  // LRU list of cached-idle blocks: head = idle longest, tail = idle newest.
  uint32_t lru_head_ = kNone;
  uint32_t lru_tail_ = kNone;
  size_t num_referenced_ = 0;
  size_t num_cached_idle_ = 0;
  std::unordered_map<uint64_t, uint32_t> index_;  // content hash -> index
};

}  // namespace kvrelay
