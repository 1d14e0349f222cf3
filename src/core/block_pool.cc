#include "core/block_pool.h"

#include <string>

#include "base/check.h"

namespace kvrelay {

BlockPool::BlockPool(uint32_t capacity) : blocks_(capacity) {
  KV_CHECK_LT(capacity, kNone);
  free_.reserve(capacity);
  // A stack: push in reverse so that a fresh pool hands out index 0 first.
  for (uint32_t i = capacity; i > 0; --i) free_.push_back(i - 1);
  index_.reserve(capacity);
}

Result<BlockId> BlockPool::Allocate() {
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else if (lru_head_ != kNone) {
    index = lru_head_;
    LruRemove(index);
    Uncache(index);
    --num_cached_idle_;
    BumpGeneration(blocks_[index]);
  } else {
    return ResourceExhaustedError("block pool: all " +
                                  std::to_string(blocks_.size()) +
                                  " blocks referenced");
  }
  Block& b = blocks_[index];
  KV_CHECK_EQ(b.refcount, 0u);
  b.refcount = 1;
  ++num_referenced_;
  return BlockId{index, b.generation};
}

void BlockPool::Ref(BlockId id) {
  Block& b = CheckedBlock(id);
  KV_CHECK_LT(b.refcount, UINT32_MAX);
  if (b.refcount == 0) {
    KV_CHECK_MSG(b.cached, "Ref of a free block");
    LruRemove(id.index);
    --num_cached_idle_;
    ++num_referenced_;
  }
  ++b.refcount;
}

void BlockPool::Unref(BlockId id) {
  Block& b = CheckedBlock(id);
  KV_CHECK_MSG(b.refcount > 0, "Unref of an unreferenced block");
  if (--b.refcount > 0) return;
  --num_referenced_;
  if (b.cached) {
    LruPushBack(id.index);
    ++num_cached_idle_;
  } else {
    BumpGeneration(b);
    free_.push_back(id.index);
  }
}

bool BlockPool::IsLive(BlockId id) const {
  if (id.index >= blocks_.size()) return false;
  const Block& b = blocks_[id.index];
  return b.generation == id.generation && (b.refcount > 0 || b.cached);
}

void BlockPool::Cache(BlockId id, uint64_t content_hash) {
  Block& b = CheckedBlock(id);
  KV_CHECK_MSG(b.refcount > 0, "Cache of an unreferenced block");
  if (b.cached) return;
  auto [it, inserted] = index_.try_emplace(content_hash, id.index);
  if (!inserted) return;
  b.cached = true;
  b.hash = content_hash;
}

std::optional<BlockId> BlockPool::Lookup(uint64_t content_hash) {
  auto it = index_.find(content_hash);
  if (it == index_.end()) return std::nullopt;
  const uint32_t index = it->second;
  const BlockId id{index, blocks_[index].generation};
  Ref(id);
  return id;
}

bool BlockPool::Contains(uint64_t content_hash) const {
  return index_.contains(content_hash);
}

bool BlockPool::ResetPrefixCache() { return ResetImpl(/*bump_free=*/false); }

bool BlockPool::Reset() { return ResetImpl(/*bump_free=*/true); }

bool BlockPool::ResetImpl(bool bump_free) {
  if (num_referenced_ > 0) return false;
  // Every block is now free or cached-idle.
  for (Block& b : blocks_) {
    if (b.cached) {
      b.cached = false;
      b.hash = 0;
      b.lru_prev = b.lru_next = kNone;
      BumpGeneration(b);
    } else if (bump_free) {
      BumpGeneration(b);
    }
  }
  index_.clear();
  lru_head_ = lru_tail_ = kNone;
  num_cached_idle_ = 0;
  // Rebuild the free list in the fresh-pool order, so that what follows a
  // reset does not depend on the order blocks went idle before it.
  free_.clear();
  const auto n = static_cast<uint32_t>(blocks_.size());
  for (uint32_t i = n; i > 0; --i) free_.push_back(i - 1);
  return true;
}

BlockPool::Block& BlockPool::CheckedBlock(BlockId id) {
  KV_CHECK_MSG(id.index < blocks_.size(), "block index out of range");
  Block& b = blocks_[id.index];
  KV_CHECK_MSG(b.generation == id.generation, "stale block handle");
  return b;
}

void BlockPool::BumpGeneration(Block& b) {
  if (++b.generation == 0) b.generation = 1;
}

void BlockPool::LruPushBack(uint32_t index) {
  Block& b = blocks_[index];
  KV_CHECK(b.lru_prev == kNone && b.lru_next == kNone && lru_head_ != index);
  b.lru_prev = lru_tail_;
  if (lru_tail_ != kNone) {
    blocks_[lru_tail_].lru_next = index;
  } else {
    lru_head_ = index;
  }
  lru_tail_ = index;
}

void BlockPool::LruRemove(uint32_t index) {
  Block& b = blocks_[index];
  if (b.lru_prev != kNone) {
    blocks_[b.lru_prev].lru_next = b.lru_next;
  } else {
    KV_CHECK_EQ(lru_head_, index);
    lru_head_ = b.lru_next;
  }
  if (b.lru_next != kNone) {
    blocks_[b.lru_next].lru_prev = b.lru_prev;
  } else {
    KV_CHECK_EQ(lru_tail_, index);
    lru_tail_ = b.lru_prev;
  }
  b.lru_prev = b.lru_next = kNone;
}

void BlockPool::Uncache(uint32_t index) {
  Block& b = blocks_[index];
  KV_CHECK(b.cached);
  const size_t erased = index_.erase(b.hash);
  KV_CHECK_EQ(erased, 1u);
  b.cached = false;
  b.hash = 0;
}

void BlockPool::CheckInvariants() const {
  const size_t n = blocks_.size();
  size_t referenced = 0, cached_idle = 0, free_count = 0, cached = 0;
  for (const Block& b : blocks_) {
    KV_CHECK_NE(b.generation, 0u);
    if (b.refcount > 0) {
      ++referenced;
      KV_CHECK(b.lru_prev == kNone && b.lru_next == kNone);
    } else if (b.cached) {
      ++cached_idle;
    } else {
      ++free_count;
      KV_CHECK(b.lru_prev == kNone && b.lru_next == kNone);
    }
    if (b.cached) {
      ++cached;
      auto it = index_.find(b.hash);
      KV_CHECK_MSG(it != index_.end(), "cached block missing from index");
      KV_CHECK_EQ(&blocks_[it->second], &b);
    }
  }
  KV_CHECK_EQ(referenced, num_referenced_);
  KV_CHECK_EQ(cached_idle, num_cached_idle_);
  KV_CHECK_EQ(free_count, free_.size());
  KV_CHECK_EQ(cached, index_.size());
  KV_CHECK_EQ(free_.size() + num_referenced_ + num_cached_idle_, n);

  // The free list: each entry a free block, no duplicates (the count above
  // then makes it hold every free block).
  std::vector<bool> seen(n, false);
  for (uint32_t i : free_) {
    KV_CHECK_LT(i, n);
    KV_CHECK_MSG(!seen[i], "block twice on the free list");
    seen[i] = true;
    KV_CHECK(blocks_[i].refcount == 0 && !blocks_[i].cached);
  }

  // The LRU list: walk head to tail checking back links; each entry
  // cached-idle; length equals the cached-idle count (so no cycles and no
  // cached-idle block missing).
  size_t length = 0;
  uint32_t prev = kNone;
  for (uint32_t i = lru_head_; i != kNone; i = blocks_[i].lru_next) {
    KV_CHECK_LT(i, n);
    KV_CHECK_LE(++length, num_cached_idle_);
    const Block& b = blocks_[i];
    KV_CHECK(b.refcount == 0 && b.cached);
    KV_CHECK_EQ(b.lru_prev, prev);
    prev = i;
  }
  KV_CHECK_EQ(lru_tail_, prev);
  KV_CHECK_EQ(length, num_cached_idle_);

  // The index: every entry names a block cached under that hash.
  for (const auto& [hash, i] : index_) {
    KV_CHECK_LT(i, n);
    KV_CHECK(blocks_[i].cached && blocks_[i].hash == hash);
  }
}

}  // namespace kvrelay
