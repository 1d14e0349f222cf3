#include "engine/byte_kv_memory.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/prng.h"

namespace kvrelay::engine {

namespace {
// A value no correct block reads as: Read() returns it, mixed with the
// claimed digest, for a block whose bytes do not match their stream.
constexpr uint64_t kCorrupt = 0xC0221D7EDB10C0ull;

uint64_t StreamKey(uint64_t digest, uint32_t layer, uint32_t kv) {
  return Mix64(digest ^ (uint64_t{layer} << 32) ^ (uint64_t{kv} << 16) ^ 0x4B56ull);
}
}  // namespace

uint64_t ByteKvMemory::ChunkBytes(const ModelShape& shape) {
  KV_CHECK_EQ(shape.kv_heads % kHeadGroups, 0u);
  return uint64_t{shape.block_tokens} * (shape.kv_heads / kHeadGroups) * shape.head_dim *
         shape.dtype_bytes;
}

uint64_t ByteKvMemory::RegionBytes(const ModelShape& shape, uint32_t num_blocks,
                                   uint32_t groups) {
  return uint64_t{shape.layers} * 2 * num_blocks * groups * ChunkBytes(shape);
}

ByteKvMemory::ByteKvMemory(const ModelShape& shape, uint32_t num_blocks, uint32_t first_group,
                           uint32_t groups, std::span<uint8_t> region)
    : shape_(shape),
      num_blocks_(num_blocks),
      first_group_(first_group),
      groups_(groups),
      chunk_bytes_(ChunkBytes(shape)),
      region_(region) {
  KV_CHECK_GE(chunk_bytes_, 8u);
  KV_CHECK_LE(first_group + groups, kHeadGroups);
  KV_CHECK_GE(region.size(), RegionBytes(shape, num_blocks, groups));
}

uint64_t ByteKvMemory::ChunkOffset(uint32_t layer, uint32_t kv, uint32_t block,
                                   uint32_t group) const {
  KV_CHECK_LT(layer, shape_.layers);
  KV_CHECK_LT(kv, 2u);
  KV_CHECK_LT(block, num_blocks_);
  KV_CHECK_GE(group, first_group_);
  KV_CHECK_LT(group - first_group_, groups_);
  const uint64_t index =
      ((uint64_t{layer} * 2 + kv) * num_blocks_ + block) * groups_ + (group - first_group_);
  return index * chunk_bytes_;
}

void FillKvChunk(uint64_t digest, uint32_t layer, uint32_t kv, std::span<uint8_t> out) {
  KV_CHECK_GE(out.size(), 8u);
  std::memcpy(out.data(), &digest, 8);
  Prng stream(StreamKey(digest, layer, kv));
  size_t i = 8;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = stream.Next64();
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    const uint64_t v = stream.Next64();
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

bool ChunkMatches(uint32_t layer, uint32_t kv, std::span<const uint8_t> chunk) {
  if (chunk.size() < 8) return false;
  uint64_t digest;
  std::memcpy(&digest, chunk.data(), 8);
  Prng stream(StreamKey(digest, layer, kv));
  size_t i = 8;
  for (; i + 8 <= chunk.size(); i += 8) {
    const uint64_t v = stream.Next64();
    if (std::memcmp(chunk.data() + i, &v, 8) != 0) return false;
  }
  if (i < chunk.size()) {
    const uint64_t v = stream.Next64();
    if (std::memcmp(chunk.data() + i, &v, chunk.size() - i) != 0) return false;
  }
  return true;
}

void ByteKvMemory::Write(BlockId b, uint32_t group, uint64_t digest) {
  for (uint32_t layer = 0; layer < shape_.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      FillKvChunk(digest, layer, kv,
                  region_.subspan(ChunkOffset(layer, kv, b.index, group), chunk_bytes_));
    }
  }
}

uint64_t ByteKvMemory::Read(BlockId b, uint32_t group) const {
  uint64_t digest;
  std::memcpy(&digest, region_.data() + ChunkOffset(0, 0, b.index, group), 8);
  for (uint32_t layer = 0; layer < shape_.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const auto chunk = region_.subspan(ChunkOffset(layer, kv, b.index, group), chunk_bytes_);
      uint64_t lead;
      std::memcpy(&lead, chunk.data(), 8);
      if (lead != digest || !ChunkMatches(layer, kv, chunk)) return Mix64(digest ^ kCorrupt);
    }
  }
  return digest;
}

void ByteKvMemory::OnReset() { std::fill(region_.begin(), region_.end(), uint8_t{0}); }

}  // namespace kvrelay::engine
