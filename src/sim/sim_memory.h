// sim_memory.h — SimMemory: one engine's registered KV memory, simulated.
//
// Every block carries an owner tag: the transfer whose KV it holds (or is
// receiving) and the generation of the block's current life. A write that
// lands in a block whose tag is not the writer's transfer and generation is
// a violation the moment it lands — the bug that in a real system hands one
// request's prompt to another. Content is a digest per (rank, producer
// slot), enough to check end to end that D decodes on exactly the bytes P
// computed for that prompt.
//
// Thread safety: none; owned by the simulator.
#pragma once

#include <cstdint>
#include <vector>

#include "base/check.h"
#include "base/prng.h"
#include "base/transfer_id.h"
#include "core/block_id.h"

namespace kvrelay::sim {

inline constexpr uint32_t kMaxSlots = 4;  // producers per D rank (tp <= 4)

// The KV digest of block `index` of the prompt fingerprinted `prompt` as
// P rank `p_rank` computes it: a function of the prompt, not of the
// transfer_id, so KV of another prompt under the same id is detected.
inline uint64_t KvDigest(uint64_t prompt, uint32_t index, uint32_t p_rank) {
  return Mix64(prompt ^ Mix64((uint64_t{index} << 8) | p_rank));
}

class SimMemory {
 public:
  SimMemory(uint32_t blocks, uint32_t ranks)
      : ranks_(ranks), tags_(blocks), content_(size_t{blocks} * ranks * kMaxSlots, 0) {}

  struct Tag {
    TransferId owner;
    uint32_t generation = 0;
    bool set = false;
  };

  void SetOwner(BlockId b, TransferId owner) {
    tags_.at(b.index) = Tag{owner, b.generation, true};
  }
  void ClearOwner(BlockId b) { tags_.at(b.index) = Tag{}; }
  bool OwnedBy(BlockId b, TransferId owner) const {
    const Tag& t = tags_.at(b.index);
    return t.set && t.owner == owner && t.generation == b.generation;
  }
  bool AnyOwned() const {
    for (const Tag& t : tags_) if (t.set) return true;
    return false;
  }
  uint64_t& At(uint32_t block, uint32_t rank, uint32_t slot) {
    KV_CHECK_LT(rank, ranks_);
    KV_CHECK_LT(slot, kMaxSlots);
    return content_.at((size_t{block} * ranks_ + rank) * kMaxSlots + slot);
  }

 private:
  uint32_t ranks_;
  std::vector<Tag> tags_;
  std::vector<uint64_t> content_;
};

}  // namespace kvrelay::sim
