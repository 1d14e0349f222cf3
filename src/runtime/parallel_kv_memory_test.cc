// parallel_kv_memory_test.cc — ParallelKvMemory gives exactly what the
// memory it wraps gives, for reads cut across threads and for reads too
// small to cut, with intact and with corrupted bytes.
#include "runtime/parallel_kv_memory.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/prng.h"
#include "engine/ranked_kv_memory.h"

namespace kvrelay::runtime {
namespace {

class ParallelKvMemoryTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kBlocks = 200;
  static constexpr uint32_t kTp = 2;

  void SetUp() override {
    ASSERT_TRUE(engine::ModelShapeByName("tiny", &shape_));
    const uint64_t bytes = shape_.BlockBytesPerRank(kTp) * kBlocks;
    std::vector<std::span<uint8_t>> spans;
    for (uint32_t r = 0; r < kTp; ++r) {
      regions_.emplace_back(bytes);
      spans.emplace_back(regions_.back());
    }
    inner_ = std::make_unique<engine::RankedKvMemory>(shape_, kBlocks, spans);
    for (uint32_t b = 0; b < kBlocks; ++b) {
      for (uint32_t g = 0; g < engine::kHeadGroups; ++g) {
        inner_->Write(BlockId{b, 1}, g, prng_.Next64());
      }
    }
  }

  // `count` distinct blocks in a shuffled order, as a request's blocks can be.
  std::vector<BlockId> Blocks(uint32_t count) {
    std::vector<BlockId> all;
    for (uint32_t b = 0; b < kBlocks; ++b) all.push_back(BlockId{b, 1});
    for (size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[prng_.Uniform(i)]);
    all.resize(count);
    return all;
  }

  // ReadBlocks through `m`, and through the wrapped memory, must agree.
  void ExpectSameAsInner(const engine::KvMemory& m, const std::vector<BlockId>& blocks) {
    std::vector<uint64_t> got(blocks.size() * engine::kHeadGroups);
    std::vector<uint64_t> want(got.size());
    m.ReadBlocks(blocks, got);
    inner_->ReadBlocks(blocks, want);
    EXPECT_EQ(got, want);
    for (size_t i = 0; i < blocks.size(); ++i) {
      for (uint32_t g = 0; g < engine::kHeadGroups; ++g) {
        ASSERT_EQ(got[i * engine::kHeadGroups + g], inner_->Read(blocks[i], g)) << i << " " << g;
      }
    }
  }

  const uint64_t seed_ = 17;
  Prng prng_{seed_};
  engine::ModelShape shape_;
  std::vector<std::vector<uint8_t>> regions_;
  std::unique_ptr<engine::RankedKvMemory> inner_;
};

TEST_F(ParallelKvMemoryTest, LongReadsAreCutAndAgree) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (uint32_t threads : {2u, 3u, 4u}) {
    SCOPED_TRACE(threads);
    ParallelKvMemory m(inner_.get(), threads);
    for (uint32_t n : {threads * 16, 97u, kBlocks}) ExpectSameAsInner(m, Blocks(n));
  }
}

TEST_F(ParallelKvMemoryTest, ShortReadsAndOneThreadAgree) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ParallelKvMemory two(inner_.get(), 2);
  for (uint32_t n : {0u, 1u, 31u}) ExpectSameAsInner(two, Blocks(n));
  ParallelKvMemory one(inner_.get(), 1);
  ExpectSameAsInner(one, Blocks(kBlocks));
}

// Wrong bytes anywhere change the wrapped memory's result; the cut read
// must report them in the same places.
TEST_F(ParallelKvMemoryTest, CorruptedBytesShowTheSame) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (int i = 0; i < 20; ++i) {
    auto& region = regions_[prng_.Uniform(kTp)];
    region[prng_.Uniform(region.size())] ^= 0x5a;
  }
  ParallelKvMemory m(inner_.get(), 3);
  ExpectSameAsInner(m, Blocks(kBlocks));
}

TEST_F(ParallelKvMemoryTest, WritesAndEventsReachTheWrappedMemory) {
  ParallelKvMemory m(inner_.get(), 2);
  m.Write(BlockId{5, 1}, 2, 12345);
  EXPECT_EQ(inner_->Read(BlockId{5, 1}, 2), 12345u);
  EXPECT_EQ(m.Read(BlockId{5, 1}, 2), 12345u);
}

}  // namespace
}  // namespace kvrelay::runtime
