#include "engine/byte_kv_memory.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/engine.h"

namespace kvrelay::engine {
namespace {

ModelShape Shape(const char* name) {
  ModelShape s;
  EXPECT_TRUE(ModelShapeByName(name, &s));
  return s;
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
  const uint64_t chunk = ByteKvMemory::ChunkBytes(s);
  for (uint32_t layer = 0; layer < s.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint64_t i = 0; i < chunk; i += 7) {
        uint8_t& byte = region[m.ChunkOffset(layer, kv, 1, 0) + i];
        byte ^= 0x40;
        EXPECT_NE(m.Read(BlockId{1, 1}, 0), good) << "layer " << layer << " kv " << kv
                                                  << " byte " << i;
        byte ^= 0x40;
      }
    }
  }
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
    ASSERT_TRUE(engine.AddRequest(RequestSpec{c, prompts[c], 6, {}}, Instant::Epoch()).ok());
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
