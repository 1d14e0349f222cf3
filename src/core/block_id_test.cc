#include "core/block_id.h"

#include <gtest/gtest.h>

namespace kvrelay {
namespace {

TEST(PeerAddressTest, PacksAndUnpacksEveryRankOfAnEngine) {
  for (uint32_t engine : {0u, 1u, 5u, (1u << 28) - 1}) {
    for (uint32_t rank = 0; rank < kMaxRanksPerEngine; ++rank) {
      const PeerAddress a{engine, rank, 42};
      const PeerId id = a.Id();
      EXPECT_EQ(id.generation, 42u);
      EXPECT_EQ(PeerAddress::Of(id), a);
      EXPECT_EQ(PeerEngineOf(id), engine);
    }
  }
  // Two ranks of one engine differ; the same rank of two engines too.
  EXPECT_NE((PeerAddress{3, 0, 1}.Id().index), (PeerAddress{3, 1, 1}.Id().index));
  EXPECT_NE((PeerAddress{3, 0, 1}.Id().index), (PeerAddress{4, 0, 1}.Id().index));
}

}  // namespace
}  // namespace kvrelay
