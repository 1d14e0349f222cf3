// tcp_pending_read_test.cc — a tcp read driven by its caller's loop
// (Source::StartRead, TcpPendingRead) against a real P region's server:
// when it is offered, that its bytes and outcome are those of Read (a
// refused head, a refused trailer), that its stream is kept only when in
// step, and that an abandoned or stalled one counts once, closes its
// stream and lands nothing afterwards.
#include "net/tcp_pending_read.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "net/tcp_pending_fixture.h"
#include "net/transport.h"
#include "os/clock.h"

namespace kvrelay::net {
namespace {

class TcpPendingReadTest : public TcpPendingFixture {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(TcpPendingFixture::SetUp());
    auto s = d_->OpenSource(p_region_->registration(), d_region_.get());
    ASSERT_TRUE(s.ok());
    source_ = std::move(s).value();
  }

  // Opens the pool's one stream with a blocking Read of block 0 → 0.
  void WarmUp() {
    p_region_->read_grants().Grant(kT, std::vector<uint32_t>{0});
    ASSERT_TRUE(source_->Read(kT, OneBlock(0, 0)).ok());
  }

  bool DstBlockZero(uint32_t block) {
    for (uint64_t plane = 0; plane < kLayout.planes; ++plane) {
      const auto first = d_region_->bytes().begin() +
                         static_cast<ptrdiff_t>((plane * kLayout.num_blocks + block) *
                                                kLayout.block_stride_bytes);
      if (!std::all_of(first, first + static_cast<ptrdiff_t>(kLayout.block_stride_bytes),
                       [](uint8_t b) { return b == 0; })) {
        return false;
      }
    }
    return true;
  }

  std::unique_ptr<Source> source_;
};

TEST_F(TcpPendingReadTest, OfferedOnlyWithAnIdleStreamAndNeverConnects) {
  EXPECT_EQ(source_->StartRead(kT, OneBlock(1, 1), Soon()), nullptr);  // nothing open yet
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  auto r = source_->StartRead(kT, OneBlock(1, 1), Soon());
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->wants_write()) << "the request goes first";
  // The one stream is now the pending read's: nothing idle for another.
  EXPECT_EQ(source_->StartRead(kT, OneBlock(2, 2), Soon()), nullptr);
}

TEST_F(TcpPendingReadTest, LandsTheBytesCountsOnceAndGivesTheStreamBack) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  const uint64_t ok0 = d_->stats().reads_ok, bytes0 = d_->stats().bytes_read;
  const uint64_t served0 = p_->stats().bytes_served;
  p_region_->read_grants().Grant(kT, std::vector<uint32_t>{3});
  const auto segs = OneBlock(3, 5);
  const Instant deadline = Soon();
  auto r = source_->StartRead(kT, segs, deadline);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->give_up_at(), deadline);  // before the 30 s stall bound
  const Status s = Drive(*r);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Landed(segs));
  EXPECT_EQ(d_->stats().reads_ok, ok0 + 1);
  EXPECT_EQ(d_->stats().bytes_read, bytes0 + 4 * kLayout.block_stride_bytes);
  EXPECT_EQ(p_->stats().bytes_served, served0 + 4 * kLayout.block_stride_bytes);
  EXPECT_NE(source_->StartRead(kT, OneBlock(3, 6), Soon()), nullptr) << "stream not kept";
}

// P's server refuses at the head (the block is not granted for read): no
// byte lands, the read fails kFailedPrecondition, the stream stays in step.
TEST_F(TcpPendingReadTest, AnUngrantedReadIsRefusedAndTheStreamStaysInStep) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  const uint64_t failed0 = d_->stats().reads_failed;
  auto r = source_->StartRead(kT, OneBlock(6, 6), Soon());  // block 6 not granted
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(Drive(*r).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d_->stats().reads_failed, failed0 + 1);
  EXPECT_TRUE(DstBlockZero(6));
  r.reset();
  p_region_->read_grants().Grant(kT, std::vector<uint32_t>{6});
  auto again = source_->StartRead(kT, OneBlock(6, 6), Soon());
  ASSERT_NE(again, nullptr) << "a refused request leaves the stream in step: it is kept";
  EXPECT_TRUE(Drive(*again).ok());
  EXPECT_TRUE(Landed(OneBlock(6, 6)));
}

// A P and a D with two blocks of 32 MiB each, P's a known pattern, and
// D's one stream to P open: 32 MiB is far more than both sockets' buffers
// hold while D reads nothing, so P's server is still sending a block when
// a test acts.
class TcpPendingBigReadTest : public TcpPendingFixture {
 protected:
  static constexpr uint64_t kBlock = 32 << 20;

  void SetUp() override {  // instead of the fixture's
    ASSERT_NO_FATAL_FAILURE(MakePair(RegionLayout{1, 2, kBlock}));
    auto source = d_->OpenSource(p_region_->registration(), d_region_.get());
    ASSERT_TRUE(source.ok());
    source_ = std::move(source).value();
    p_region_->read_grants().Grant(kT, std::vector<uint32_t>{0, 1});
    ASSERT_TRUE(source_->Read(kT, std::vector<Segment>{{0, 0, 4096}}).ok());  // the stream
  }

  // Starts the read of block 1 and sends its request, then waits until P's
  // head is on the stream and says ok (peeked, not taken: D reads nothing,
  // so P's server is blocked mid-payload).
  void StartAndSeeTheHead() {
    r_ = source_->StartRead(kT, block1_, MonoNow() + Duration::Seconds(10));
    ASSERT_NE(r_, nullptr);
    ASSERT_FALSE(r_->Progress().has_value());  // the request; this step reads nothing
    ASSERT_FALSE(r_->wants_write());
    uint8_t head[tcp::kReplyBytes];
    for (int i = 0; i < 100; ++i) {
      pollfd pfd{r_->fd(), POLLIN, 0};
      poll(&pfd, 1, 100);
      if (recv(r_->fd(), head, sizeof head, MSG_PEEK | MSG_DONTWAIT) ==
          static_cast<ssize_t>(sizeof head)) {
        ASSERT_EQ(tcp::ParseReply(head, tcp::kReadHeadMagic, kT, "read").code(),
                  StatusCode::kOk);
        return;
      }
    }
    FAIL() << "no head from P's server in 10 s";
  }

  const std::vector<Segment> block1_{{kBlock, kBlock, kBlock}};
  std::unique_ptr<Source> source_;
  std::unique_ptr<PendingWrite> r_;
};

// Revoked while the payload was on its way (the head said ok): the
// server's trailer refuses, so the read fails although its bytes arrived,
// and the stream stays in step.
TEST_F(TcpPendingBigReadTest, RevokedWhileTheBytesWentOutTheTrailerFailsIt) {
  ASSERT_NO_FATAL_FAILURE(StartAndSeeTheHead());
  p_region_->read_grants().RevokeAll(kT);
  const uint64_t failed0 = d_->stats().reads_failed;
  const Status s = Drive(*r_);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(d_->stats().reads_failed, failed0 + 1);
  EXPECT_EQ(p_->stats().reads_refused, 1u);
  r_.reset();
  p_region_->read_grants().Grant(kT, std::vector<uint32_t>{1});
  auto again = source_->StartRead(kT, block1_, MonoNow() + Duration::Seconds(10));
  ASSERT_NE(again, nullptr) << "in step: kept";
  EXPECT_TRUE(Drive(*again).ok());
  EXPECT_EQ(std::memcmp(d_region_->bytes().data() + kBlock, p_region_->bytes().data() + kBlock,
                        kBlock),
            0);
}

// Given up while P's server is mid-payload: it fails, counted once, its
// stream is closed, and not one byte of the block lands in D's region.
TEST_F(TcpPendingBigReadTest, GivenUpWhileTheServerSendsNothingLands) {
  ASSERT_NO_FATAL_FAILURE(StartAndSeeTheHead());
  const uint64_t failed0 = d_->stats().reads_failed;
  EXPECT_FALSE(r_->GiveUp().ok());
  r_.reset();
  EXPECT_EQ(d_->stats().reads_failed, failed0 + 1);
  EXPECT_EQ(d_->stats().reads_ok, 1u);  // the warm-up only
  poll(nullptr, 0, 200);  // P's server finds the stream closed
  const std::span<uint8_t> block = d_region_->bytes().subspan(kBlock);
  EXPECT_TRUE(std::all_of(block.begin(), block.end(), [](uint8_t b) { return b == 0; }))
      << "bytes landed after the read was given up";
  EXPECT_EQ(source_->StartRead(kT, block1_, MonoNow() + Duration::Seconds(10)), nullptr)
      << "closed, not kept";
}

// Given up past its deadline (before its first step), it ends
// kDeadlineExceeded, counted once, and its stream is closed.
TEST_F(TcpPendingReadTest, GivenUpPastItsDeadlineItEndsDeadlineExceeded) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  const uint64_t failed0 = d_->stats().reads_failed;
  const Instant deadline = MonoNow() + Duration::Milliseconds(200);
  auto r = source_->StartRead(kT, OneBlock(1, 1), deadline);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->give_up_at(), deadline);
  while (MonoNow() < deadline) poll(nullptr, 0, 5);
  EXPECT_EQ(r->GiveUp().code(), StatusCode::kDeadlineExceeded);
  r.reset();
  EXPECT_EQ(d_->stats().reads_failed, failed0 + 1);
  EXPECT_EQ(source_->StartRead(kT, OneBlock(1, 1), Soon()), nullptr);  // closed, not kept
}

TEST_F(TcpPendingReadTest, WithoutADeadlineTheStallTimeoutBoundsIt) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  const Instant before = MonoNow();
  auto r = source_->StartRead(kT, OneBlock(1, 1), Instant::Never());
  ASSERT_NE(r, nullptr);
  EXPECT_GE(r->give_up_at(), before + Duration::Seconds(30));
  EXPECT_LE(r->give_up_at(), MonoNow() + Duration::Seconds(30));
}

TEST_F(TcpPendingReadTest, EmptyLateOrOutsideReadsAreLeftToRead) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  EXPECT_EQ(source_->StartRead(kT, {}, Soon()), nullptr);
  EXPECT_EQ(source_->StartRead(kT, OneBlock(1, 1), MonoNow() - Duration::Milliseconds(1)),
            nullptr);
  std::vector<Segment> outside = OneBlock(1, 1);
  outside[0].dst_offset = kLayout.bytes();  // the local (destination) side
  EXPECT_EQ(source_->StartRead(kT, outside, Soon()), nullptr);
  EXPECT_NE(source_->StartRead(kT, OneBlock(1, 1), Soon()), nullptr);  // still idle
}

// A read Read would stripe over several streams is left to Read.
TEST_F(TcpPendingReadTest, AReadThatWouldBeStripedIsLeftToRead) {
  TransportOptions options;
  options.tcp_streams = 2;
  options.tcp_stripe_min_bytes = 16 * 1024;
  auto d2 = MakeTcpTransport(options);
  ASSERT_TRUE(d2.ok());
  auto region = d2.value()->CreateRegion("d2", kLayout);
  ASSERT_TRUE(region.ok());
  auto source = d2.value()->OpenSource(p_region_->registration(), region.value().get());
  ASSERT_TRUE(source.ok());
  p_region_->read_grants().Grant(kT, std::vector<uint32_t>{0});
  ASSERT_TRUE(source.value()->Read(kT, OneBlock(0, 0)).ok());  // one stream open, idle
  std::vector<Segment> two_blocks = OneBlock(1, 1);
  for (const Segment& s : OneBlock(2, 2)) two_blocks.push_back(s);  // 32 KiB ≥ 2 × 16 KiB
  EXPECT_EQ(source.value()->StartRead(kT, two_blocks, Soon()), nullptr);
  EXPECT_NE(source.value()->StartRead(kT, OneBlock(1, 1), Soon()), nullptr);
}

// (Before its first step: once sent, the answer may already be in by the
// next step on this loopback.)
TEST_F(TcpPendingReadTest, AbandonedOrDroppedBeforeItEndsCountsOnceAndClosesTheStream) {
  for (const bool abandon : {true, false}) {
    SCOPED_TRACE(abandon ? "Abandon" : "destroyed");
    ASSERT_NO_FATAL_FAILURE(WarmUp());
    const uint64_t failed0 = d_->stats().reads_failed, ok0 = d_->stats().reads_ok;
    p_region_->read_grants().Grant(kT, std::vector<uint32_t>{1});
    auto r = source_->StartRead(kT, OneBlock(1, 1), Soon());
    ASSERT_NE(r, nullptr);
    if (abandon) {
      EXPECT_EQ(r->Abandon(CancelledError("stop")).code(), StatusCode::kCancelled);
    }
    r.reset();
    EXPECT_EQ(d_->stats().reads_failed, failed0 + 1);
    EXPECT_EQ(d_->stats().reads_ok, ok0);
    EXPECT_EQ(source_->StartRead(kT, OneBlock(1, 1), Soon()), nullptr);  // closed, not kept
  }
}

TEST_F(TcpPendingReadTest, APeerThatGoesAwayEndsItUnavailable) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  auto r = source_->StartRead(kT, OneBlock(1, 1), Soon());
  ASSERT_NE(r, nullptr);
  p_region_.reset();  // P's server closes its connections
  EXPECT_EQ(Drive(*r).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvrelay::net
