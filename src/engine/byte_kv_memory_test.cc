#include "engine/byte_kv_memory.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/prng.h"
#include "engine/engine.h"
#include "engine/ranked_kv_memory.h"

namespace kvrelay::engine {
namespace {

ModelShape Shape(const char* name) {
  ModelShape s;
  EXPECT_TRUE(ModelShapeByName(name, &s));
  return s;
}

// Flips every `stride`-th byte of (block, group)'s chunks, one at a time,
// calls check(where) with it flipped, and flips it back.
template <class F>
void ForEachFlippedByte(const ByteKvMemory& m, std::vector<uint8_t>& region, const ModelShape& s,
                        uint32_t block, uint32_t group, uint64_t stride, F check) {
  const uint64_t chunk = ByteKvMemory::ChunkBytes(s);
  for (uint32_t layer = 0; layer < s.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint64_t i = 0; i < chunk; i += stride) {
        uint8_t& byte = region[m.ChunkOffset(layer, kv, block, group) + i];
        byte ^= 0x40;
        check("layer " + std::to_string(layer) + " kv " + std::to_string(kv) + " byte " +
              std::to_string(i));
        byte ^= 0x40;
      }
    }
  }
}

TEST(ByteKvMemoryTest, SizesFollowTheShape) {
  const ModelShape s = Shape("8b");
  // 16 tokens × 2 heads per group × 128 × bf16.
  EXPECT_EQ(ByteKvMemory::ChunkBytes(s), 16u * 2 * 128 * 2);
  // A block of all groups across layers and K/V = the whole block's KV.
  EXPECT_EQ(ByteKvMemory::RegionBytes(s, 1, kHeadGroups), s.BlockBytesPerRank(1));
  EXPECT_EQ(ByteKvMemory::RegionBytes(s, 1, kHeadGroups / 2), s.BlockBytesPerRank(2));
}

TEST(ByteKvMemoryTest, WriteThenReadGivesTheDigestAndRealBytes) {
  const ModelShape s = Shape("tiny");
  std::vector<uint8_t> region(ByteKvMemory::RegionBytes(s, 8, kHeadGroups));
  ByteKvMemory m(s, 8, 0, kHeadGroups, region);
  m.Write(BlockId{3, 1}, 2, 0x1234567890ABCDEFull);
  EXPECT_EQ(m.Read(BlockId{3, 1}, 2), 0x1234567890ABCDEFull);
  // Every layer and K/V chunk holds the stream, not zeros.
  for (uint32_t layer = 0; layer < s.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const auto off = m.ChunkOffset(layer, kv, 3, 2);
      EXPECT_TRUE(ChunkMatches(layer, kv,
                               std::span<const uint8_t>(region).subspan(
                                   off, ByteKvMemory::ChunkBytes(s))));
    }
  }
}

TEST(ByteKvMemoryTest, OneWrongByteAnywhereChangesTheRead) {
  const ModelShape s = Shape("tiny");
  std::vector<uint8_t> region(ByteKvMemory::RegionBytes(s, 4, kHeadGroups));
  ByteKvMemory m(s, 4, 0, kHeadGroups, region);
  m.Write(BlockId{1, 1}, 0, 77);
  const uint64_t good = m.Read(BlockId{1, 1}, 0);
  ForEachFlippedByte(m, region, s, 1, 0, 7, [&](const std::string& where) {
    EXPECT_NE(m.Read(BlockId{1, 1}, 0), good) << where;
  });
  EXPECT_EQ(m.Read(BlockId{1, 1}, 0), good);
}

TEST(ByteKvMemoryTest, RankShareHoldsOnlyItsGroups) {
  const ModelShape s = Shape("tiny");
  std::vector<uint8_t> region(ByteKvMemory::RegionBytes(s, 2, 2));
  ByteKvMemory m(s, 2, 2, 2, region);  // groups 2 and 3: rank 1 of tp 2
  m.Write(BlockId{0, 1}, 3, 9);
  EXPECT_EQ(m.Read(BlockId{0, 1}, 3), 9u);
  EXPECT_DEATH(m.Write(BlockId{0, 1}, 1, 9), "CHECK failed");
}

// ReadBlocks walks the region layer by layer; it must give exactly what
// Read gives per block and group, a wrong byte anywhere included.
TEST(ByteKvMemoryTest, ReadBlocksEqualsReadAndCatchesEveryWrongByte) {
  const ModelShape s = Shape("tiny");
  std::vector<uint8_t> region(ByteKvMemory::RegionBytes(s, 8, kHeadGroups));
  ByteKvMemory m(s, 8, 0, kHeadGroups, region);
  const std::vector<BlockId> blocks = {{5, 1}, {2, 1}, {3, 1}, {7, 2}};
  for (const BlockId& b : blocks) {
    for (uint32_t g = 0; g < kHeadGroups; ++g) m.Write(b, g, Mix64(b.index * 10 + g));
  }
  const auto read_each = [&] {
    std::vector<uint64_t> v;
    for (const BlockId& b : blocks) {
      for (uint32_t g = 0; g < kHeadGroups; ++g) v.push_back(m.Read(b, g));
    }
    return v;
  };
  std::vector<uint64_t> out(blocks.size() * kHeadGroups);
  m.ReadBlocks(blocks, out);
  const std::vector<uint64_t> good = read_each();
  EXPECT_EQ(out, good);
  ForEachFlippedByte(m, region, s, 3, 2, 5, [&](const std::string& where) {
    m.ReadBlocks(blocks, out);
    EXPECT_EQ(out, read_each()) << where;
    EXPECT_NE(out[2 * kHeadGroups + 2], good[2 * kHeadGroups + 2]) << where;
  });
  m.ReadBlocks(blocks, out);
  EXPECT_EQ(out, good);
}

TEST(ByteKvMemoryTest, RankedReadBlocksGathersEveryRanksGroups) {
  const ModelShape s = Shape("tiny");
  const uint32_t n = 6;
  std::vector<std::vector<uint8_t>> bytes(2, std::vector<uint8_t>(ByteKvMemory::RegionBytes(
                                                 s, n, kHeadGroups / 2)));
  std::vector<std::span<uint8_t>> regions = {bytes[0], bytes[1]};
  RankedKvMemory m(s, n, regions);
  const std::vector<BlockId> blocks = {{4, 1}, {0, 3}};
  for (const BlockId& b : blocks) {
    for (uint32_t g = 0; g < kHeadGroups; ++g) m.Write(b, g, 1000 + b.index * 4 + g);
  }
  std::vector<uint64_t> out(blocks.size() * kHeadGroups, 0);
  m.ReadBlocks(blocks, out);
  EXPECT_EQ(out, (std::vector<uint64_t>{1016, 1017, 1018, 1019, 1000, 1001, 1002, 1003}));
  bytes[1][10] ^= 1;  // rank 1 (groups 2, 3), layer 0 K of block 0
  m.ReadBlocks(blocks, out);
  EXPECT_NE(out[6], 1002u);
  EXPECT_EQ(out[6], m.Read(blocks[1], 2));
  EXPECT_EQ(out[4], 1000u);
}

// The engine on real bytes: outputs equal the model's reference.
TEST(ByteKvMemoryTest, EngineOnRealBytesMatchesReference) {
  const ModelShape s = Shape("tiny");
  EngineOptions o;
  o.role = Role::kPlain;
  o.shape = s;
  o.num_blocks = 32;
  std::vector<uint8_t> region(ByteKvMemory::RegionBytes(s, o.num_blocks, kHeadGroups));
  ByteKvMemory memory(s, o.num_blocks, 0, kHeadGroups, region);
  Engine engine(o, &memory);
  std::vector<std::vector<Token>> prompts = {{1, 2, 3}, {5, 6, 7, 8, 9, 10, 11}, {42}};
  for (uint64_t c = 0; c < prompts.size(); ++c) {
    ASSERT_TRUE(engine.AddRequest(RequestSpec{c, prompts[c], 6, {}, {}}, Instant::Epoch()).ok());
  }
  std::vector<std::vector<Token>> out(prompts.size());
  for (int step = 0; step < 200 && !engine.Idle(); ++step) {
    engine.Step({}, Instant::Epoch());
    while (auto a = engine.PollAction()) {
      if (auto* t = std::get_if<TokenOut>(&*a)) out[t->client].push_back(t->token);
    }
  }
  ASSERT_TRUE(engine.Idle());
  for (size_t c = 0; c < prompts.size(); ++c) {
    EXPECT_EQ(out[c], Reference(prompts[c], o.weights_version, 6, s)) << "request " << c;
  }
}

}  // namespace
}  // namespace kvrelay::engine
