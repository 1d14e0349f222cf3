#include "net/write_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <numeric>
#include <vector>

#include "base/prng.h"
#include "engine/byte_kv_memory.h"

namespace kvrelay::net {
namespace {

using engine::ByteKvMemory;
using engine::kHeadGroups;
using engine::ModelShape;

ModelShape Shape(const char* name) {
  ModelShape s;
  EXPECT_TRUE(engine::ModelShapeByName(name, &s));
  return s;
}

// `n` distinct block indices below `num_blocks`, in random order.
std::vector<BlockId> RandomBlocks(Prng& prng, uint32_t num_blocks, uint32_t n) {
  std::vector<uint32_t> all(num_blocks);
  std::iota(all.begin(), all.end(), 0u);
  for (uint32_t i = 0; i < n; ++i) {
    std::swap(all[i], all[i + prng.Uniform(num_blocks - i)]);
  }
  std::vector<BlockId> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(BlockId{all[i], 1});
  // Some runs of consecutive blocks, as the allocator often hands out.
  if (prng.OneIn(2)) std::sort(out.begin(), out.end());
  return out;
}

void Apply(std::span<const Segment> plan, std::span<const uint8_t> src, std::span<uint8_t> dst) {
  for (const Segment& s : plan) {
    ASSERT_LE(s.src_offset + s.bytes, src.size());
    ASSERT_LE(s.dst_offset + s.bytes, dst.size());
    std::memcpy(dst.data() + s.dst_offset, src.data() + s.src_offset, s.bytes);
  }
}

TEST(WritePlanTest, LayoutAgreesWithByteKvMemory) {
  for (const char* name : {"tiny", "8b"}) {
    const ModelShape s = Shape(name);
    for (uint32_t tp : {1u, 2u, 4u}) {
      const uint32_t groups = kHeadGroups / tp;
      const RegionLayout layout = LayoutFor(s, tp, 5);
      EXPECT_EQ(layout.bytes(), ByteKvMemory::RegionBytes(s, 5, groups));
      EXPECT_EQ(layout.planes, uint64_t{s.layers} * 2);
      std::vector<uint8_t> region(layout.bytes());
      for (uint32_t rank = 0; rank < tp; ++rank) {
        const GroupRange g = GroupsOfRank(tp, rank);
        ByteKvMemory m(s, 5, g.first, g.count, region);
        for (uint32_t layer = 0; layer < s.layers; ++layer) {
          for (uint32_t kv = 0; kv < 2; ++kv) {
            for (uint32_t b = 0; b < 5; ++b) {
              const uint64_t plane = uint64_t{layer} * 2 + kv;
              const uint64_t block_start = (plane * 5 + b) * layout.block_stride_bytes;
              EXPECT_EQ(m.ChunkOffset(layer, kv, b, g.first), block_start);
              EXPECT_EQ(layout.BlockOf(m.ChunkOffset(layer, kv, b, g.end() - 1)), b);
            }
          }
        }
      }
    }
  }
}

// Every (p_tp, d_tp) and every pair of ranks that share groups: writing
// real KV through the plan gives D exactly P's digests for the shared
// groups and touches no other byte.
TEST(WritePlanTest, PlanMovesExactlyTheSharedGroups) {
  const uint64_t seed = 0x5EED0001;
  std::cout << "random block lists: seed " << seed << "\n";
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng prng(seed);
  const ModelShape s = Shape("tiny");
  const uint32_t p_blocks = 12;
  const uint32_t d_blocks = 16;
  for (uint32_t p_tp : {1u, 2u, 4u}) {
    for (uint32_t d_tp : {1u, 2u, 4u}) {
      for (uint32_t p_rank = 0; p_rank < p_tp; ++p_rank) {
        for (uint32_t d_rank = 0; d_rank < d_tp; ++d_rank) {
          const GroupRange pg = GroupsOfRank(p_tp, p_rank);
          const GroupRange dg = GroupsOfRank(d_tp, d_rank);
          const uint32_t first = std::max(pg.first, dg.first);
          const uint32_t end = std::min(pg.end(), dg.end());
          if (first >= end) continue;
          for (int trial = 0; trial < 8; ++trial) {
            SCOPED_TRACE(testing::Message() << "p_tp " << p_tp << " p_rank " << p_rank
                                            << " d_tp " << d_tp << " d_rank " << d_rank
                                            << " trial " << trial);
            const uint32_t n = static_cast<uint32_t>(prng.Range(1, p_blocks));
            const std::vector<BlockId> src = RandomBlocks(prng, p_blocks, n);
            const std::vector<BlockId> dst = RandomBlocks(prng, d_blocks, n);

            std::vector<uint8_t> p_region(LayoutFor(s, p_tp, p_blocks).bytes());
            std::vector<uint8_t> d_region(LayoutFor(s, d_tp, d_blocks).bytes());
            ByteKvMemory p_mem(s, p_blocks, pg.first, pg.count, p_region);
            ByteKvMemory d_mem(s, d_blocks, dg.first, dg.count, d_region);
            // P holds KV in every block (not only the ones sent).
            for (uint32_t b = 0; b < p_blocks; ++b) {
              for (uint32_t g = pg.first; g < pg.end(); ++g) {
                p_mem.Write(BlockId{b, 1}, g, Mix64(prng.Next64()));
              }
            }

            const std::vector<Segment> plan =
                PlanWrite(s, p_tp, p_rank, p_blocks, d_tp, d_rank, d_blocks, src, dst);
            Apply(plan, p_region, d_region);

            std::vector<bool> expected_touched(d_region.size(), false);
            for (size_t i = 0; i < n; ++i) {
              for (uint32_t g = first; g < end; ++g) {
                EXPECT_EQ(d_mem.Read(dst[i], g), p_mem.Read(src[i], g)) << "pair " << i;
                for (uint32_t layer = 0; layer < s.layers; ++layer) {
                  for (uint32_t kv = 0; kv < 2; ++kv) {
                    const uint64_t off = d_mem.ChunkOffset(layer, kv, dst[i].index, g);
                    std::fill_n(expected_touched.begin() + static_cast<ptrdiff_t>(off),
                                ByteKvMemory::ChunkBytes(s), true);
                  }
                }
              }
            }
            uint64_t stray = 0;
            for (size_t i = 0; i < d_region.size(); ++i) {
              if (!expected_touched[i] && d_region[i] != 0) ++stray;
            }
            EXPECT_EQ(stray, 0u);
            // Every segment stays inside its regions, and the plan's bytes
            // are exactly the shared chunks.
            uint64_t planned = 0;
            for (const Segment& seg : plan) planned += seg.bytes;
            EXPECT_EQ(planned, uint64_t{n} * (end - first) * s.layers * 2 *
                                   ByteKvMemory::ChunkBytes(s));
          }
        }
      }
    }
  }
}

TEST(WritePlanTest, AdjacentRunWithEqualTpIsOneSegmentPerPlane) {
  const ModelShape s = Shape("8b");
  const uint64_t planes = uint64_t{s.layers} * 2;
  for (uint32_t tp : {1u, 2u, 4u}) {
    for (uint32_t rank = 0; rank < tp; ++rank) {
      std::vector<BlockId> src, dst;
      for (uint32_t i = 0; i < 7; ++i) {
        src.push_back(BlockId{3 + i, 1});
        dst.push_back(BlockId{10 + i, 2});
      }
      const auto plan = PlanWrite(s, tp, rank, 20, tp, rank, 30, src, dst);
      ASSERT_EQ(plan.size(), planes) << "tp " << tp;
      const RegionLayout p = LayoutFor(s, tp, 20);
      const RegionLayout d = LayoutFor(s, tp, 30);
      for (uint64_t plane = 0; plane < planes; ++plane) {
        EXPECT_EQ(plan[plane], (Segment{(plane * 20 + 3) * p.block_stride_bytes,
                                        (plane * 30 + 10) * d.block_stride_bytes,
                                        7 * p.block_stride_bytes}));
      }
    }
  }
}

TEST(WritePlanTest, BrokenRunsSplitAndUnequalTpDoesNotCoalesce) {
  const ModelShape s = Shape("tiny");
  const uint64_t planes = uint64_t{s.layers} * 2;
  // src runs {0,1,2}, dst breaks after 1: two runs.
  const std::vector<BlockId> src = {{0, 1}, {1, 1}, {2, 1}};
  const std::vector<BlockId> dst = {{4, 1}, {5, 1}, {9, 1}};
  EXPECT_EQ(PlanWrite(s, 2, 1, 8, 2, 1, 16, src, dst).size(), 2 * planes);
  // p tp 1 → d tp 2: shared groups are half of P's block, no coalescing.
  const auto plan = PlanWrite(s, 1, 0, 8, 2, 1, 16, src, {{{4, 1}, {5, 1}, {6, 1}}});
  ASSERT_EQ(plan.size(), 3 * planes);
  const uint64_t chunk = ByteKvMemory::ChunkBytes(s);
  // Plane 0, first pair: P block 0 groups 2..3 → D block 4 (groups 2..3).
  EXPECT_EQ(plan[0], (Segment{2 * chunk, 4 * 2 * chunk, 2 * chunk}));
  // p tp 4 rank 3 → d tp 1: one chunk into D's group 3.
  const auto narrow = PlanWrite(s, 4, 3, 8, 1, 0, 16, std::span(src).first(1),
                                std::span(dst).first(1));
  ASSERT_EQ(narrow.size(), planes);
  EXPECT_EQ(narrow[0], (Segment{0, 4 * 4 * chunk + 3 * chunk, chunk}));
  EXPECT_TRUE(PlanWrite(s, 1, 0, 8, 1, 0, 8, {}, {}).empty());
}

TEST(WritePlanDeathTest, RanksThatShareNoGroupAreABug) {
  const ModelShape s = Shape("tiny");
  const std::vector<BlockId> one = {{0, 1}};
  EXPECT_DEATH(PlanWrite(s, 2, 0, 8, 2, 1, 8, one, one), "share no head group");
  EXPECT_DEATH(PlanWrite(s, 1, 0, 8, 1, 0, 8, one, {}), "CHECK failed");
  EXPECT_DEATH(PlanWrite(s, 1, 0, 8, 1, 0, 8, one, std::vector<BlockId>{{8, 1}}),
               "CHECK failed");
}

}  // namespace
}  // namespace kvrelay::net
