// grant_table.h — GrantTable: which transfer may write each block of a
// rank's region, right now.
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
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "base/transfer_id.h"

namespace kvrelay::net {

class GrantTable {
 public:
  explicit GrantTable(uint32_t num_blocks) : owner_(num_blocks) {}

  // Blocks `blocks` may now be written by `transfer` (a later grant of the
  // same block replaces an earlier one). Out-of-range blocks are ignored.
  void Grant(TransferId transfer, std::span<const uint32_t> blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t b : blocks) {
      if (b < owner_.size()) owner_[b] = transfer;
    }
  }
  // Revokes `transfer`'s grant on `blocks` (blocks granted to another
  // transfer since are left alone).
  void Revoke(TransferId transfer, std::span<const uint32_t> blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t b : blocks) {
      if (b < owner_.size() && owner_[b] == transfer) owner_[b] = TransferId{};
    }
  }
  // True if every block in [first, last] is granted to `transfer`.
  bool Allows(TransferId transfer, uint32_t first, uint32_t last) const {
    if (transfer == TransferId{} || first > last || last >= owner_.size()) return false;
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t b = first; b <= last; ++b) {
      if (owner_[b] != transfer) return false;
    }
    return true;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(owner_.begin(), owner_.end(), TransferId{});
  }

 private:
  mutable std::mutex mu_;
  std::vector<TransferId> owner_;
};

}  // namespace kvrelay::net
