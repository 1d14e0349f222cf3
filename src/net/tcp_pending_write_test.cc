// tcp_pending_write_test.cc — a tcp write driven by its caller's loop
// (Target::StartWrite, TcpPendingWrite) against a real receiver: when it is
// offered, that its bytes and outcome are those of Write, that its stream is
// kept only when in step, and that an abandoned one counts once and closes
// its stream.
#include "net/tcp_pending_write.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "net/tcp_pending_fixture.h"
#include "net/transport.h"
#include "os/clock.h"

namespace kvrelay::net {
namespace {

class TcpPendingWriteTest : public TcpPendingFixture {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(TcpPendingFixture::SetUp());
    auto t = p_->Open(d_region_->registration(), p_region_.get());
    ASSERT_TRUE(t.ok());
    target_ = std::move(t).value();
  }

  // Opens the pool's one stream with a blocking Write of block 0 → 0.
  void WarmUp() {
    d_region_->grants().Grant(kT, std::vector<uint32_t>{0});
    ASSERT_TRUE(target_->Write(kT, OneBlock(0, 0)).ok());
  }

  std::unique_ptr<Target> target_;
};

TEST_F(TcpPendingWriteTest, OfferedOnlyWithAnIdleStreamAndNeverConnects) {
  EXPECT_EQ(target_->StartWrite(kT, OneBlock(1, 1), Soon()), nullptr);  // nothing open yet
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  auto w = target_->StartWrite(kT, OneBlock(1, 1), Soon());
  ASSERT_NE(w, nullptr);
  // The one stream is now the pending write's: nothing idle for another.
  EXPECT_EQ(target_->StartWrite(kT, OneBlock(2, 2), Soon()), nullptr);
}

TEST_F(TcpPendingWriteTest, LandsTheBytesCountsOnceAndGivesTheStreamBack) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  const uint64_t ok0 = p_->stats().writes_ok, bytes0 = p_->stats().bytes_written;
  d_region_->grants().Grant(kT, std::vector<uint32_t>{5});
  const auto segs = OneBlock(3, 5);
  const Instant deadline = Soon();
  auto w = target_->StartWrite(kT, segs, deadline);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->give_up_at(), deadline);  // before the 30 s stall bound
  const Status s = Drive(*w);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Landed(segs));
  EXPECT_EQ(p_->stats().writes_ok, ok0 + 1);
  EXPECT_EQ(p_->stats().bytes_written, bytes0 + 4 * kLayout.block_stride_bytes);
  EXPECT_NE(target_->StartWrite(kT, OneBlock(4, 5), Soon()), nullptr) << "stream not kept";
}

// Given up past its deadline, it ends kDeadlineExceeded, counted once, and
// its stream is closed.
TEST_F(TcpPendingWriteTest, GivenUpPastItsDeadlineItEndsDeadlineExceeded) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  const uint64_t failed0 = p_->stats().writes_failed;
  const Instant deadline = MonoNow() + Duration::Milliseconds(200);
  auto w = target_->StartWrite(kT, OneBlock(1, 1), deadline);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->give_up_at(), deadline);
  while (MonoNow() < deadline) poll(nullptr, 0, 5);
  EXPECT_EQ(w->GiveUp().code(), StatusCode::kDeadlineExceeded);
  w.reset();
  EXPECT_EQ(p_->stats().writes_failed, failed0 + 1);
  EXPECT_EQ(target_->StartWrite(kT, OneBlock(1, 1), Soon()), nullptr);  // closed, not kept
}

// With no deadline, the stall timeout (30 s after its last progress) bounds it.
TEST_F(TcpPendingWriteTest, WithoutADeadlineTheStallTimeoutBoundsIt) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  const Instant before = MonoNow();
  auto w = target_->StartWrite(kT, OneBlock(1, 1), Instant::Never());
  ASSERT_NE(w, nullptr);
  EXPECT_GE(w->give_up_at(), before + Duration::Seconds(30));
  EXPECT_LE(w->give_up_at(), MonoNow() + Duration::Seconds(30));
}

TEST_F(TcpPendingWriteTest, AnUngrantedWriteIsRefusedAndTheStreamStaysInStep) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  const uint64_t failed0 = p_->stats().writes_failed;
  auto w = target_->StartWrite(kT, OneBlock(3, 6), Soon());  // block 6 not granted
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(Drive(*w).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p_->stats().writes_failed, failed0 + 1);
  EXPECT_TRUE(std::all_of(d_region_->bytes().begin() + 6 * 4096,
                          d_region_->bytes().begin() + 7 * 4096, [](uint8_t b) { return b == 0; }));
  w.reset();
  d_region_->grants().Grant(kT, std::vector<uint32_t>{6});
  auto again = target_->StartWrite(kT, OneBlock(3, 6), Soon());
  ASSERT_NE(again, nullptr) << "a refused frame leaves the stream in step: it is kept";
  EXPECT_TRUE(Drive(*again).ok());
  EXPECT_TRUE(Landed(OneBlock(3, 6)));
}

TEST_F(TcpPendingWriteTest, EmptyOrLateWritesAreLeftToWrite) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  EXPECT_EQ(target_->StartWrite(kT, {}, Soon()), nullptr);
  EXPECT_EQ(target_->StartWrite(kT, OneBlock(1, 1), MonoNow() - Duration::Milliseconds(1)),
            nullptr);
  std::vector<Segment> outside = OneBlock(1, 1);
  outside[0].src_offset = kLayout.bytes();
  EXPECT_EQ(target_->StartWrite(kT, outside, Soon()), nullptr);
  EXPECT_NE(target_->StartWrite(kT, OneBlock(1, 1), Soon()), nullptr);  // the stream is still idle
}

// A write Write would stripe over several streams is left to Write.
TEST_F(TcpPendingWriteTest, AWriteThatWouldBeStripedIsLeftToWrite) {
  TransportOptions options;
  options.tcp_streams = 2;
  options.tcp_stripe_min_bytes = 16 * 1024;
  auto p2 = MakeTcpTransport(options);
  ASSERT_TRUE(p2.ok());
  auto region = p2.value()->CreateRegion("p2", kLayout);
  ASSERT_TRUE(region.ok());
  auto target = p2.value()->Open(d_region_->registration(), region.value().get());
  ASSERT_TRUE(target.ok());
  d_region_->grants().Grant(kT, std::vector<uint32_t>{0});
  ASSERT_TRUE(target.value()->Write(kT, OneBlock(0, 0)).ok());  // one stream open, idle
  std::vector<Segment> two_blocks = OneBlock(1, 1);
  for (const Segment& s : OneBlock(2, 2)) two_blocks.push_back(s);  // 32 KiB ≥ 2 × 16 KiB
  EXPECT_EQ(target.value()->StartWrite(kT, two_blocks, Soon()), nullptr);
  EXPECT_NE(target.value()->StartWrite(kT, OneBlock(1, 1), Soon()), nullptr);
}

// (Before its first step: once sent, the reply may already be in by the
// next step on this loopback, so "before its reply" is not exact there.)
TEST_F(TcpPendingWriteTest, AbandonedOrDroppedBeforeItEndsCountsOnceAndClosesTheStream) {
  for (const bool abandon : {true, false}) {
    SCOPED_TRACE(abandon ? "Abandon" : "destroyed");
    ASSERT_NO_FATAL_FAILURE(WarmUp());
    const uint64_t failed0 = p_->stats().writes_failed, ok0 = p_->stats().writes_ok;
    d_region_->grants().Grant(kT, std::vector<uint32_t>{1});
    auto w = target_->StartWrite(kT, OneBlock(1, 1), Soon());
    ASSERT_NE(w, nullptr);
    if (abandon) {
      EXPECT_EQ(w->Abandon(DeadlineExceededError("late")).code(), StatusCode::kDeadlineExceeded);
    }
    w.reset();
    EXPECT_EQ(p_->stats().writes_failed, failed0 + 1);
    EXPECT_EQ(p_->stats().writes_ok, ok0);
    // A stream a write ended on without a reply is taken as out of step
    // (half a frame, or a reply, may be on it): closed, not kept.
    EXPECT_EQ(target_->StartWrite(kT, OneBlock(1, 1), Soon()), nullptr);
  }
}

// A frame larger than the socket can hold goes out in steps: the write
// waits for room (wants_write) between them and lands whole.
TEST_F(TcpPendingWriteTest, AFrameLargerThanTheSocketGoesOutInSteps) {
  const RegionLayout big{1, 48, 1 << 20};  // 48 blocks of 1 MiB
  TransportOptions options;
  options.tcp_streams = 1;
  auto p = MakeTcpTransport(options);
  auto d = MakeTcpTransport(options);
  ASSERT_TRUE(p.ok() && d.ok());
  auto pr = p.value()->CreateRegion("pbig", big);
  auto dr = d.value()->CreateRegion("dbig", big);
  ASSERT_TRUE(pr.ok() && dr.ok());
  std::span<uint8_t> src = pr.value()->bytes();
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + i / 999);
  auto target = p.value()->Open(dr.value()->registration(), pr.value().get());
  ASSERT_TRUE(target.ok());
  std::vector<uint32_t> all;
  for (uint32_t b = 0; b < big.num_blocks; ++b) all.push_back(b);
  dr.value()->grants().Grant(kT, all);
  const std::vector<Segment> first{{0, 0, 1 << 20}};
  ASSERT_TRUE(target.value()->Write(kT, first).ok());  // opens the stream
  const std::vector<Segment> rest{{1 << 20, 1 << 20, 47ull << 20}};  // 47 MiB, one segment
  auto w = target.value()->StartWrite(kT, rest, Soon());
  ASSERT_NE(w, nullptr);
  int steps_waiting_for_room = 0;
  std::optional<Status> outcome;
  for (int i = 0; i < 100'000 && !outcome; ++i) {
    outcome = w->Progress();
    if (outcome) break;
    steps_waiting_for_room += w->wants_write() ? 1 : 0;
    pollfd pfd{w->fd(), static_cast<short>(w->wants_write() ? POLLOUT : POLLIN), 0};
    poll(&pfd, 1, 1000);
  }
  ASSERT_TRUE(outcome.has_value());
  EXPECT_TRUE(outcome->ok()) << outcome->ToString();
  EXPECT_GE(steps_waiting_for_room, 1) << "47 MiB went out without the socket filling once";
  EXPECT_EQ(std::memcmp(dr.value()->bytes().data(), src.data(), src.size()), 0);
}

TEST_F(TcpPendingWriteTest, APeerThatGoesAwayEndsItUnavailable) {
  ASSERT_NO_FATAL_FAILURE(WarmUp());
  auto w = target_->StartWrite(kT, OneBlock(1, 1), Soon());
  ASSERT_NE(w, nullptr);
  d_region_.reset();  // D's receiver closes its connections
  EXPECT_EQ(Drive(*w).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvrelay::net
