#include "engine/byte_kv_memory.h"

#include <algorithm>
#include <cstring>
#include <vector>

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

// Word i (i >= 1) of a chunk's stream: a counter-based hash of (key, i),
// one 64x64->128 multiply folded (wyrand's mix). No word depends on the
// one before, so filling and checking pipeline several words at once and
// run near memory speed. (The sequential PRNG this replaced, one call per
// word, filled at 3.4 GB/s and checked at 2.9 GB/s: D's first step on a
// loaded 8K-token prompt then cost more than its transfer.)
namespace {
inline uint64_t StreamWord(uint64_t key, uint64_t i) {
  const uint64_t x = key + i * 0xa0761d6478bd642full;
  __extension__ const unsigned __int128 m =
      static_cast<unsigned __int128>(x) * (x ^ 0xe7037ed1a0b428dbull);
  return static_cast<uint64_t>(m >> 64) ^ static_cast<uint64_t>(m);
}
}  // namespace

void FillKvChunk(uint64_t digest, uint32_t layer, uint32_t kv, std::span<uint8_t> out) {
  KV_CHECK_GE(out.size(), 8u);
  std::memcpy(out.data(), &digest, 8);
  const uint64_t key = StreamKey(digest, layer, kv);
  const size_t words = out.size() / 8;
  uint8_t* p = out.data();
  for (size_t i = 1; i < words; ++i) {
    const uint64_t v = StreamWord(key, i);
    std::memcpy(p + i * 8, &v, 8);
  }
  if (const size_t tail = out.size() % 8; tail != 0) {
    const uint64_t v = StreamWord(key, words);
    std::memcpy(p + words * 8, &v, tail);
  }
}

bool ChunkMatches(uint32_t layer, uint32_t kv, std::span<const uint8_t> chunk) {
  if (chunk.size() < 8) return false;
  uint64_t digest;
  std::memcpy(&digest, chunk.data(), 8);
  const uint64_t key = StreamKey(digest, layer, kv);
  const size_t words = chunk.size() / 8;
  const uint8_t* p = chunk.data();
  // Differences accumulate without a branch per word; a wrong chunk is
  // rare and reading it to the end costs nothing extra.
  uint64_t diff = 0;
  for (size_t i = 1; i < words; ++i) {
    uint64_t v;
    std::memcpy(&v, p + i * 8, 8);
    diff |= v ^ StreamWord(key, i);
  }
  if (const size_t tail = chunk.size() % 8; tail != 0) {
    const uint64_t v = StreamWord(key, words);
    uint64_t got = 0, want = 0;
    std::memcpy(&got, p + words * 8, tail);
    std::memcpy(&want, &v, tail);
    diff |= got ^ want;
  }
  return diff == 0;
}

void ByteKvMemory::Write(BlockId b, uint32_t group, uint64_t digest) {
  for (uint32_t layer = 0; layer < shape_.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      FillKvChunk(digest, layer, kv,
                  region_.subspan(ChunkOffset(layer, kv, b.index, group), chunk_bytes_));
    }
  }
}

void ByteKvMemory::AppendBlockBytes(BlockId b, std::vector<std::span<uint8_t>>* out) {
  for (uint32_t layer = 0; layer < shape_.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t g = first_group_; g < first_group_ + groups_; ++g) {
        out->push_back(region_.subspan(ChunkOffset(layer, kv, b.index, g), chunk_bytes_));
      }
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

void ByteKvMemory::ReadBlocks(std::span<const BlockId> blocks, std::span<uint64_t> out) const {
  KV_CHECK(first_group_ == 0 && groups_ == kHeadGroups);
  ReadOwnGroups(blocks, out);
}

// Layer by layer, K then V, block by block: a block's groups are adjacent
// in the region, and so are adjacent blocks', so a sequence's chunks are
// read in runs instead of one 8 KiB chunk per layer stride (which halved
// the check's speed: docs/performance.md).
void ByteKvMemory::ReadOwnGroups(std::span<const BlockId> blocks,
                                 std::span<uint64_t> out) const {
  KV_CHECK_EQ(out.size(), blocks.size() * kHeadGroups);
  const uint32_t g0 = first_group_, g1 = first_group_ + groups_;
  // The digest each chunk must lead with: layer 0's K chunk's lead.
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (uint32_t g = g0; g < g1; ++g) {
      std::memcpy(&out[i * kHeadGroups + g],
                  region_.data() + ChunkOffset(0, 0, blocks[i].index, g), 8);
    }
  }
  std::vector<uint8_t> bad(blocks.size() * kHeadGroups, 0);
  for (uint32_t layer = 0; layer < shape_.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < blocks.size(); ++i) {
        for (uint32_t g = g0; g < g1; ++g) {
          const auto chunk =
              region_.subspan(ChunkOffset(layer, kv, blocks[i].index, g), chunk_bytes_);
          uint64_t lead;
          std::memcpy(&lead, chunk.data(), 8);
          const size_t k = i * kHeadGroups + g;
          if (lead != out[k] || !ChunkMatches(layer, kv, chunk)) bad[k] = 1;
        }
      }
    }
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (uint32_t g = g0; g < g1; ++g) {
      const size_t k = i * kHeadGroups + g;
      if (bad[k] != 0) out[k] = Mix64(out[k] ^ kCorrupt);
    }
  }
}

void ByteKvMemory::OnReset() { std::fill(region_.begin(), region_.end(), uint8_t{0}); }

}  // namespace kvrelay::engine
