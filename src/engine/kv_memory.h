// kv_memory.h — KvMemory: where an engine's KV lives, as the engine sees it.
//
// Why an interface: the engine is pure, but its KV must be real enough to
// check end to end. The simulator stores one digest per (block, head group)
// and tags owners; the runtime stores real bytes in registered memory. The
// engine writes what it computes, reads what is there (which may have been
// written by a remote P), and tells the memory when blocks change hands.
//
// Thread safety: called from the engine's thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/check.h"
#include "base/transfer_id.h"
#include "core/block_id.h"
#include "engine/model.h"

namespace kvrelay::engine {

class KvMemory {
 public:
  virtual ~KvMemory() = default;
  // KV of head group `group` in block `b`.
  virtual void Write(BlockId b, uint32_t group, uint64_t digest) = 0;
  virtual uint64_t Read(BlockId b, uint32_t group) const = 0;
  // Read of every head group of every block in `blocks`: out[i * kHeadGroups
  // + g] = Read(blocks[i], g). One call for a whole sequence lets a memory
  // walk its storage in its own order (ByteKvMemory: layer by layer, which
  // is sequential for runs of adjacent blocks).
  virtual void ReadBlocks(std::span<const BlockId> blocks, std::span<uint64_t> out) const {
    KV_CHECK_EQ(out.size(), blocks.size() * kHeadGroups);
    for (size_t i = 0; i < blocks.size(); ++i) {
      for (uint32_t g = 0; g < kHeadGroups; ++g) out[i * kHeadGroups + g] = Read(blocks[i], g);
    }
  }
  // The bytes of block `b`, as the pieces a transfer moves, in a fixed
  // order (ByteKvMemory: layer, K|V, head group): for a model that keeps its
  // KV itself and carries it in blocks as opaque bytes (llama.cpp's
  // sequence state, compute_model.h ExportKv). Empty for a memory without
  // bytes (the simulator's digests).
  virtual void BlockBytes(BlockId, std::vector<std::span<uint8_t>>* out) { out->clear(); }
  // `b` was allocated; `owner` is the transfer that will write it remotely
  // (D's load), or zero for local use.
  virtual void OnAllocate(BlockId b, TransferId owner) = 0;
  // `b` returned to the free list (not when it stays in the prefix cache).
  virtual void OnFree(BlockId b) = 0;
  // The whole pool was reset or discarded: every block's content is gone.
  virtual void OnReset() = 0;
};

}  // namespace kvrelay::engine
