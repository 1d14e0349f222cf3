#include "bench/raw_baseline.h"

#include <gtest/gtest.h>

#include "engine/model.h"
#include "net/write_plan.h"

namespace kvrelay::bench {
namespace {

// Ten transfers of `blocks` small-shape blocks walking a 64-block pool.
std::vector<RawTransfer> Transfers(uint32_t blocks, RawOptions* o) {
  engine::ModelShape shape;
  EXPECT_TRUE(engine::ModelShapeByName("small", &shape));
  const uint32_t pool = 64;
  o->src_pool_bytes = o->dst_pool_bytes = shape.BlockBytesPerRank(1) * pool;
  std::vector<RawTransfer> out;
  uint32_t cursor = 0;
  for (int i = 0; i < 10; ++i) {
    if (cursor + blocks > pool) cursor = 0;
    std::vector<BlockId> s, d;
    for (uint32_t b = 0; b < blocks; ++b) {
      s.push_back(BlockId{cursor + b, 1});
      d.push_back(BlockId{(cursor + b + 7) % pool, 1});
    }
    out.push_back(net::PlanWrite(shape, 1, 0, pool, 1, 0, pool, s, d));
    cursor += blocks;
  }
  return out;
}

void ExpectMoves(Result<std::vector<double>> (*fn)(const std::vector<RawTransfer>&,
                                                   const RawOptions&)) {
  for (uint32_t blocks : {1u, 5u}) {
    RawOptions o;
    const auto transfers = Transfers(blocks, &o);
    Result<std::vector<double>> r = fn(transfers, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), transfers.size());
    for (double s : *r) EXPECT_GT(s, 0);
  }
}

TEST(RawBaselineTest, ShmCopyMovesTheBytes) { ExpectMoves(&RawShmCopy); }
TEST(RawBaselineTest, TcpStreamMovesTheBytes) { ExpectMoves(&RawTcpStream); }
TEST(RawBaselineTest, UcxPutMovesTheBytes) { ExpectMoves(&RawUcxPut); }

// Striped as kvrelay's tcp: 4 streams, stripes of at least 4 KiB, so a
// 5-block transfer goes out in 4 stripes and a 1-block one in fewer; the
// helper's hash of the last transfer proves the stripes landed where they
// belong.
TEST(RawBaselineTest, TcpStreamStripedOverFourStreamsMovesTheBytes) {
  for (uint32_t blocks : {1u, 5u}) {
    RawOptions o;
    o.tcp_streams = 4;
    o.tcp_stripe_min_bytes = 4096;
    const auto transfers = Transfers(blocks, &o);
    Result<std::vector<double>> r = RawTcpStream(transfers, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), transfers.size());
  }
}

// idle_before: every transfer of both passes starts after that long
// asleep, outside its timing: the run lasts at least 2 × 10 × the idle time,
// and the bytes still land (the helper's hash).
TEST(RawBaselineTest, IdleBeforeSleepsBeforeEveryTransferOfBothPasses) {
  for (auto fn : {&RawShmCopy, &RawTcpStream, &RawUcxPut}) {
    RawOptions o;
    o.idle_before = std::chrono::milliseconds(5);
    const auto transfers = Transfers(1, &o);
    const auto t0 = std::chrono::steady_clock::now();
    Result<std::vector<double>> r = fn(transfers, o);
    const auto took = std::chrono::steady_clock::now() - t0;
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), transfers.size());
    EXPECT_GE(took, 2 * 10 * o.idle_before);
  }
}

TEST(RawBaselineTest, ZmqRoundTripsAreTimed) {
  Result<std::vector<double>> r = ZmqRoundTrips(20, 64);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 20u);
}

}  // namespace
}  // namespace kvrelay::bench
