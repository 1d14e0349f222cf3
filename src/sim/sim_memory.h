// sim_memory.h — SimMemory: one engine's registered KV memory, simulated.
//
// Every block carries an owner tag: the generation of the block's current
// life and, for a block a remote load writes, the transfer. A write that
// lands in a block whose tag is not the writer's transfer and generation —
// or reads a P block whose life ended — is a violation the moment it
// happens: the bug that in a real system hands one request's prompt to
// another. Content is one digest per (block, head group): the engine's
// emulated model (engine/model.h) makes every digest checkable.
//
// Thread safety: none; owned by the simulator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "engine/kv_memory.h"
#include "engine/model.h"

namespace kvrelay::sim {

class SimMemory final : public engine::KvMemory {
 public:
  explicit SimMemory(uint32_t blocks)
      : tags_(blocks), content_(size_t{blocks} * engine::kHeadGroups, 0) {}

  struct Tag {
    TransferId owner;
    uint32_t generation = 0;
    bool set = false;
  };

  // engine::KvMemory
  void Write(BlockId b, uint32_t group, uint64_t digest) override { At(b, group) = digest; }
  uint64_t Read(BlockId b, uint32_t group) const override {
    return content_.at(size_t{b.index} * engine::kHeadGroups + group);
  }
  void OnAllocate(BlockId b, TransferId owner) override {
    tags_.at(b.index) = Tag{owner, b.generation, true};
  }
  void OnFree(BlockId b) override {
    tags_.at(b.index) = Tag{};
    freed_.push_back(b);
  }
  // Blocks freed since the last call (the simulator checks no write into
  // them is in flight).
  std::vector<BlockId> TakeFreed() {
    std::vector<BlockId> out;
    out.swap(freed_);
    return out;
  }
  void OnReset() override {
    for (Tag& t : tags_) t = Tag{};
    std::fill(content_.begin(), content_.end(), 0);
  }

  // The block's current life is `b` (it was not freed or reused since).
  bool Live(BlockId b) const {
    const Tag& t = tags_.at(b.index);
    return t.set && t.generation == b.generation;
  }
  // ...and a remote load of `owner` may write it.
  bool OwnedBy(BlockId b, TransferId owner) const {
    return Live(b) && tags_.at(b.index).owner == owner;
  }
  uint64_t& At(BlockId b, uint32_t group) {
    KV_CHECK_LT(group, engine::kHeadGroups);
    return content_.at(size_t{b.index} * engine::kHeadGroups + group);
  }

 private:
  std::vector<Tag> tags_;
  std::vector<uint64_t> content_;
  std::vector<BlockId> freed_;
};

}  // namespace kvrelay::sim
