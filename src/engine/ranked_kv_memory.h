// ranked_kv_memory.h — RankedKvMemory: an engine's KV split across its tp
// ranks, each rank's share in its own byte region.
//
// Why: the engine is one object and writes KV per head group; a real
// deployment keeps each rank's heads in that rank's registered memory (the
// region a transport exposes). Rank r of tp holds head groups
// [r*G/tp, (r+1)*G/tp), G = kHeadGroups; this class routes each group to
// its rank's ByteKvMemory.
//
// Ownership: owns the per-rank ByteKvMemory views, not the regions.
// Thread safety: the engine's thread only (like ByteKvMemory).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "base/check.h"
#include "engine/byte_kv_memory.h"

namespace kvrelay::engine {

class RankedKvMemory final : public KvMemory {
 public:
  // REQUIRES: regions.size() == tp, tp divides kHeadGroups, each region
  // at least ByteKvMemory::RegionBytes(shape, num_blocks, kHeadGroups/tp).
  RankedKvMemory(const ModelShape& shape, uint32_t num_blocks,
                 std::span<const std::span<uint8_t>> regions) {
    const uint32_t tp = static_cast<uint32_t>(regions.size());
    KV_CHECK_GT(tp, 0u);
    KV_CHECK_EQ(kHeadGroups % tp, 0u);
    groups_per_rank_ = kHeadGroups / tp;
    for (uint32_t r = 0; r < tp; ++r) {
      ranks_.push_back(std::make_unique<ByteKvMemory>(shape, num_blocks, r * groups_per_rank_,
                                                      groups_per_rank_, regions[r]));
    }
  }

  void Write(BlockId b, uint32_t group, uint64_t digest) override {
    RankOf(group).Write(b, group, digest);
  }
  uint64_t Read(BlockId b, uint32_t group) const override {
    return ranks_[group / groups_per_rank_]->Read(b, group);
  }
  void ReadBlocks(std::span<const BlockId> blocks, std::span<uint64_t> out) const override {
    for (const auto& r : ranks_) r->ReadOwnGroups(blocks, out);
  }
  // Rank 0's chunks, then rank 1's, ...
  void BlockBytes(BlockId b, std::vector<std::span<uint8_t>>* out) override {
    out->clear();
    for (auto& r : ranks_) r->AppendBlockBytes(b, out);
  }
  void OnAllocate(BlockId, TransferId) override {}
  void OnFree(BlockId) override {}
  void OnReset() override {
    for (auto& r : ranks_) r->OnReset();
  }

 private:
  ByteKvMemory& RankOf(uint32_t group) {
    KV_CHECK_LT(group, kHeadGroups);
    return *ranks_[group / groups_per_rank_];
  }
  uint32_t groups_per_rank_ = 1;
  std::vector<std::unique_ptr<ByteKvMemory>> ranks_;
};

}  // namespace kvrelay::engine
