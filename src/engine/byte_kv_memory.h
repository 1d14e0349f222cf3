// byte_kv_memory.h — ByteKvMemory: KV as real bytes, at real sizes.
//
// Why: the simulator stores one digest per (block, head group); a real
// engine moves bytes. This KvMemory lays an engine rank's KV out in a byte
// region the caller owns (heap in tests, a registered shared-memory segment
// in the runtime) and makes every byte carry the model's meaning:
//
//   layout, per layer (as vLLM lays KV out per layer):
//     [layer][K|V][block][group][token][head in group][head_dim] × dtype
//   one chunk = (layer, K|V, block, group): block_tokens × heads/G ×
//     head_dim × dtype_bytes bytes, contiguous — the unit a transfer moves.
//
// Write(block, group, digest) fills every chunk of that (block, group) with
// a PRNG stream keyed by (digest, layer, K|V), the digest itself in the
// first 8 bytes of each chunk. Read() takes the digest from the first chunk
// and checks every byte of every chunk against its stream; one wrong byte
// anywhere and Read returns a different value, so the model's next token
// changes. Reads and writes are real memory work at the preset's sizes.
//
// Holds the head groups [first_group, first_group + groups) — a tp rank's
// share; Read/Write of another group is a bug.
//
// Thread safety: none; the engine's thread (the region may be written by a
// transport between engine steps, never during).
#pragma once

#include <cstdint>
#include <span>

#include "engine/kv_memory.h"
#include "engine/model.h"

namespace kvrelay::engine {

class ByteKvMemory final : public KvMemory {
 public:
  // Bytes of region needed for `num_blocks` blocks of `groups` head groups.
  static uint64_t RegionBytes(const ModelShape& shape, uint32_t num_blocks, uint32_t groups);
  // Bytes of one chunk (layer, K|V, block, group).
  static uint64_t ChunkBytes(const ModelShape& shape);

  // REQUIRES: region.size() >= RegionBytes(shape, num_blocks, groups);
  // first_group + groups <= kHeadGroups; shape.kv_heads % kHeadGroups == 0.
  ByteKvMemory(const ModelShape& shape, uint32_t num_blocks, uint32_t first_group,
               uint32_t groups, std::span<uint8_t> region);

  void Write(BlockId b, uint32_t group, uint64_t digest) override;
  uint64_t Read(BlockId b, uint32_t group) const override;
  // REQUIRES: this memory holds every head group (first_group 0, all groups).
  void ReadBlocks(std::span<const BlockId> blocks, std::span<uint64_t> out) const override;
  // ReadBlocks for this memory's groups only: fills out[i * kHeadGroups + g]
  // for g in [first_group, first_group + groups), leaves the rest.
  void ReadOwnGroups(std::span<const BlockId> blocks, std::span<uint64_t> out) const;
  // Appends (not replaces) this memory's chunks of `b` to `out`: layer,
  // then K|V, then head group.
  void AppendBlockBytes(BlockId b, std::vector<std::span<uint8_t>>* out);
  void BlockBytes(BlockId b, std::vector<std::span<uint8_t>>* out) override {
    out->clear();
    AppendBlockBytes(b, out);
  }
  void OnAllocate(BlockId, TransferId) override {}
  void OnFree(BlockId) override {}
  void OnReset() override;

  // Byte offset of chunk (layer, kv, block, group) in the region.
  uint64_t ChunkOffset(uint32_t layer, uint32_t kv, uint32_t block, uint32_t group) const;

 private:
  const ModelShape shape_;
  const uint32_t num_blocks_;
  const uint32_t first_group_;
  const uint32_t groups_;
  const uint64_t chunk_bytes_;
  std::span<uint8_t> region_;
};

// Fills `out` with the KV stream of (digest, layer, kv); first 8 bytes are
// the digest (little-endian).
void FillKvChunk(uint64_t digest, uint32_t layer, uint32_t kv, std::span<uint8_t> out);
// True if `chunk` is exactly FillKvChunk's output for its leading digest.
bool ChunkMatches(uint32_t layer, uint32_t kv, std::span<const uint8_t> chunk);

}  // namespace kvrelay::engine
