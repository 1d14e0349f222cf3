// grant_table.h — GrantTable: which transfer may write each block of a
// rank's region, right now; ReadGrantTable: which transfers may read it.
//
// Why: on the tcp transport D's own receiver thread writes arriving bytes
// into D's KV. A peer must never write outside what it was granted, so
// the receiver checks every block a segment touches against this table
// before writing. D's connector grants a load's destination blocks when it
// sends the pull and revokes them when the load ends (answered, released
// or given up), so a late or hostile write is refused, not applied.
//
// Ownership: one per Region. Thread-safe (a mutex; the connector thread
// grants and revokes, receiver threads check).
// Invariant: a block is granted to at most one transfer.
//
// ReadGrantTable is the read direction's (read mode: D reads P's KV): on
// the tcp transport P's receiver serves a read request only if every block
// it touches is granted for read to the request's transfer. Unlike writes,
// several transfers may read one block at once — P's prefix cache shares a
// block between requests, and each request's transfer reads it — so a
// grant adds to a transfer's set and never takes a block from another.
// Ownership and threading as GrantTable. Memory: one sorted block list per
// transfer holding a grant; the connector revokes when a transfer ends.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/transfer_id.h"

namespace kvrelay::net {

class GrantTable {
 public:
  explicit GrantTable(uint32_t num_blocks) : num_blocks_(num_blocks), owner_(num_blocks) {}

  // Blocks `blocks` may now be written by `transfer` (a later grant of the
  // same block replaces an earlier one). Out-of-range blocks are ignored.
  void Grant(TransferId transfer, std::span<const uint32_t> blocks) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    for (uint32_t b : blocks) {
      if (b < num_blocks_) owner_[b] = transfer;
    }
  }
  // Revokes `transfer`'s grant on `blocks` (blocks granted to another
  // transfer since are left alone).
  void Revoke(TransferId transfer, std::span<const uint32_t> blocks) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    for (uint32_t b : blocks) {
      if (b < num_blocks_ && owner_[b] == transfer) owner_[b] = TransferId{};
    }
  }
  // True if every block in [first, last] is granted to `transfer`.
  bool Allows(TransferId transfer, uint32_t first, uint32_t last) const EXCLUDES(mu_) {
    if (transfer == TransferId{} || first > last || last >= num_blocks_) return false;
    MutexLock lock(&mu_);
    for (uint32_t b = first; b <= last; ++b) {
      if (owner_[b] != transfer) return false;
    }
    return true;
  }
  void Clear() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    std::fill(owner_.begin(), owner_.end(), TransferId{});
  }

 private:
  const uint32_t num_blocks_;
  mutable Mutex mu_;
  // Per block: the transfer that may write it (zero: none). Its size,
  // num_blocks_, never changes.
  std::vector<TransferId> owner_ GUARDED_BY(mu_);
};

class ReadGrantTable {
 public:
  explicit ReadGrantTable(uint32_t num_blocks) : num_blocks_(num_blocks) {}

  // `transfer` may now read `blocks` as well as what it was granted before
  // (other transfers' grants are untouched). Out-of-range blocks and the
  // zero transfer are ignored.
  void Grant(TransferId transfer, std::span<const uint32_t> blocks) EXCLUDES(mu_) {
    if (transfer == TransferId{}) return;
    MutexLock lock(&mu_);
    std::vector<uint32_t>& mine = blocks_[transfer];
    for (uint32_t b : blocks) {
      if (b < num_blocks_) mine.push_back(b);
    }
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
    if (mine.empty()) blocks_.erase(transfer);
  }
  // Revokes `transfer`'s read grant on `blocks`.
  void Revoke(TransferId transfer, std::span<const uint32_t> blocks) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    auto it = blocks_.find(transfer);
    if (it == blocks_.end()) return;
    std::vector<uint32_t> gone(blocks.begin(), blocks.end());
    std::sort(gone.begin(), gone.end());
    std::vector<uint32_t> kept;
    std::set_difference(it->second.begin(), it->second.end(), gone.begin(), gone.end(),
                        std::back_inserter(kept));
    if (kept.empty()) {
      blocks_.erase(it);
    } else {
      it->second = std::move(kept);
    }
  }
  // Revokes every read grant `transfer` holds.
  void RevokeAll(TransferId transfer) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    blocks_.erase(transfer);
  }
  // True if every block in [first, last] is granted for read to `transfer`.
  bool Allows(TransferId transfer, uint32_t first, uint32_t last) const EXCLUDES(mu_) {
    if (transfer == TransferId{} || first > last || last >= num_blocks_) return false;
    MutexLock lock(&mu_);
    auto it = blocks_.find(transfer);
    if (it == blocks_.end()) return false;
    // Sorted and unique: [first, last] is all there iff `first` is, and
    // the entry (last - first) places after it is `last`.
    const std::vector<uint32_t>& mine = it->second;
    const auto at = std::lower_bound(mine.begin(), mine.end(), first);
    if (at == mine.end() || *at != first) return false;
    const uint64_t span = uint64_t{last} - first;
    return span < static_cast<uint64_t>(mine.end() - at) && at[span] == last;
  }
  void Clear() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    blocks_.clear();
  }
  // How many transfers hold a read grant (tests; a leak shows here).
  size_t transfers() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return blocks_.size();
  }

 private:
  const uint32_t num_blocks_;
  mutable Mutex mu_;
  // Per transfer: its readable blocks, sorted and unique, never empty.
  std::unordered_map<TransferId, std::vector<uint32_t>> blocks_ GUARDED_BY(mu_);
};

}  // namespace kvrelay::net
