// Tests for ReadLoadTable: D's read-mode loads (heartbeats, reads under the
// lease, revokes, releases).
#include "core/read_load_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvrelay {
namespace {

const TransferId kT{0xabc, 0xdef};
const RequestId kR{7, 1};
const PeerId kP0{0, 1};
const PeerId kP1{1, 1};

Instant At(int64_t ms) { return Instant::Epoch() + Duration::Milliseconds(ms); }

std::vector<BlockId> Blocks(uint32_t first, uint32_t n) {
  std::vector<BlockId> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(BlockId{first + i, 1});
  return out;
}

class ReadLoadTableTest : public ::testing::Test {
 protected:
  static ReadLoadTableOptions Options() {
    ReadLoadTableOptions o;
    o.heartbeat_interval = Duration::Seconds(5);
    o.read_margin = Duration::Seconds(1);
    o.giveup = Duration::Seconds(60);
    return o;
  }
  std::vector<ReadLoadAction> Drain() {
    std::vector<ReadLoadAction> out;
    while (auto a = table.PollAction()) out.push_back(std::move(*a));
    table.CheckInvariants();
    return out;
  }
  template <typename T>
  std::vector<T> Only(const std::vector<ReadLoadAction>& actions) {
    std::vector<T> out;
    for (const ReadLoadAction& a : actions) {
      if (const auto* x = std::get_if<T>(&a)) out.push_back(*x);
    }
    return out;
  }
  GrantLease Granted(const SendHeartbeat& hb, int64_t remaining_ms) {
    GrantLease g;
    g.peer = hb.peer;
    g.seq = hb.seq;
    g.transfer = hb.transfer;
    g.answer = LeaseAnswer::kGranted;
    g.remaining_ns = Duration::Milliseconds(remaining_ms).ns();
    g.src = Blocks(100, 2);
    return g;
  }
  // Starts a load from `producers`; returns the heartbeats it sent.
  std::vector<SendHeartbeat> Start(std::vector<PeerId> producers, int64_t at_ms = 0) {
    EXPECT_TRUE(table.Start(kR, kT, producers, Blocks(0, 2), At(at_ms)).ok());
    return Only<SendHeartbeat>(Drain());
  }

  ReadLoadTable table{Options()};
};

TEST_F(ReadLoadTableTest, GrantStartsAReadAndItsLandingEndsTheLoadOk) {
  std::vector<SendHeartbeat> hb = Start({kP0});
  ASSERT_EQ(hb.size(), 1u);
  table.OnGrant(kP0, Granted(hb[0], 20'000), At(3));
  std::vector<StartRead> reads = Only<StartRead>(Drain());
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].src, Blocks(100, 2));
  EXPECT_EQ(reads[0].dst, Blocks(0, 2));
  // Counted from when the heartbeat was sent (0), minus the margin.
  EXPECT_EQ(reads[0].deadline, At(20'000 - 1'000));
  table.OnReadDone(reads[0].read, true, At(10));
  std::vector<ReadLoadAction> a = Drain();
  std::vector<SendNotice> n = Only<SendNotice>(a);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].notice, ReadNotice::kDone);
  std::vector<LoadDone> done = Only<LoadDone>(a);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok);
  EXPECT_EQ(table.live_loads(), 0u);
  // The same read reported again is stale.
  table.OnReadDone(reads[0].read, true, At(11));
  EXPECT_TRUE(Drain().empty());
  EXPECT_EQ(table.stats().stale_read_done, 1u);
}

TEST_F(ReadLoadTableTest, AGrantTooCloseToItsEndIsNotReadAndTheNextHeartbeatAsksAgain) {
  std::vector<SendHeartbeat> hb = Start({kP0});
  table.OnGrant(kP0, Granted(hb[0], 500), At(1));  // < read_margin left
  EXPECT_TRUE(Only<StartRead>(Drain()).empty());
  EXPECT_EQ(table.stats().grants_too_late, 1u);
  table.OnTimer(At(5'000));
  std::vector<SendHeartbeat> again = Only<SendHeartbeat>(Drain());
  ASSERT_EQ(again.size(), 1u);
  table.OnGrant(kP0, Granted(again[0], 20'000), At(5'001));
  EXPECT_EQ(Only<StartRead>(Drain()).size(), 1u);
}

TEST_F(ReadLoadTableTest, PendingKeepsHeartbeatingAndEveryProducerMustFinish) {
  std::vector<SendHeartbeat> hb = Start({kP0, kP1});
  ASSERT_EQ(hb.size(), 2u);
  GrantLease pending = Granted(hb[1], 0);
  pending.answer = LeaseAnswer::kPending;
  table.OnGrant(kP1, pending, At(1));
  table.OnGrant(kP0, Granted(hb[0], 20'000), At(1));
  std::vector<StartRead> r0 = Only<StartRead>(Drain());
  ASSERT_EQ(r0.size(), 1u);
  table.OnReadDone(r0[0].read, true, At(2));
  EXPECT_TRUE(Only<LoadDone>(Drain()).empty());  // P1 has not answered
  table.OnTimer(At(5'000));
  std::vector<SendHeartbeat> more = Only<SendHeartbeat>(Drain());
  ASSERT_EQ(more.size(), 1u);  // only the unfinished producer
  EXPECT_EQ(more[0].peer, kP1);
  table.OnGrant(kP1, Granted(more[0], 20'000), At(5'001));
  std::vector<StartRead> r1 = Only<StartRead>(Drain());
  ASSERT_EQ(r1.size(), 1u);
  table.OnReadDone(r1[0].read, true, At(5'002));
  std::vector<LoadDone> done = Only<LoadDone>(Drain());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok);
}

TEST_F(ReadLoadTableTest, ARevokeDuringAReadIsAnsweredOnlyWhenTheReadLands) {
  std::vector<SendHeartbeat> hb = Start({kP0});
  table.OnGrant(kP0, Granted(hb[0], 20'000), At(1));
  std::vector<StartRead> reads = Only<StartRead>(Drain());
  table.OnRevoke(kP0, kT, TransferResult::kAborted, At(2));
  EXPECT_TRUE(Drain().empty());  // the read is still in flight
  // Heartbeats stop for a revoked producer.
  table.OnTimer(At(5'000));
  EXPECT_TRUE(Only<SendHeartbeat>(Drain()).empty());
  table.OnReadDone(reads[0].read, true, At(5'001));
  std::vector<ReadLoadAction> a = Drain();
  std::vector<SendNotice> n = Only<SendNotice>(a);
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].notice, ReadNotice::kRevoked);
  std::vector<LoadDone> done = Only<LoadDone>(a);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
}

TEST_F(ReadLoadTableTest, ARevokeBeforeAnyReadIsAnsweredAtOnce) {
  std::vector<SendHeartbeat> hb = Start({kP0});
  table.OnRevoke(kP0, kT, TransferResult::kAborted, At(1));
  std::vector<ReadLoadAction> a = Drain();
  ASSERT_EQ(Only<SendNotice>(a).size(), 1u);
  EXPECT_EQ(Only<SendNotice>(a)[0].notice, ReadNotice::kRevoked);
  ASSERT_EQ(Only<LoadDone>(a).size(), 1u);
  EXPECT_FALSE(Only<LoadDone>(a)[0].cut_short) << "an abort fails the load";
}

// A revoke for P's cache reset cuts the load short (it recomputes whatever
// the failure policy); one for an abort fails it.
TEST_F(ReadLoadTableTest, ARevokeForAResetCutsTheLoadShort) {
  Start({kP0});
  table.OnRevoke(kP0, kT, TransferResult::kReset, At(1));
  std::vector<ReadLoadAction> a = Drain();
  ASSERT_EQ(Only<SendNotice>(a).size(), 1u);
  std::vector<LoadDone> done = Only<LoadDone>(a);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_TRUE(done[0].cut_short);
}

TEST_F(ReadLoadTableTest, ReleaseWaitsForTheReadThenReleasesAndStopsHeartbeats) {
  std::vector<SendHeartbeat> hb = Start({kP0, kP1});
  table.OnGrant(kP0, Granted(hb[0], 20'000), At(1));
  std::vector<StartRead> reads = Only<StartRead>(Drain());
  EXPECT_TRUE(table.Release(kR, At(2)));
  std::vector<SendNotice> n = Only<SendNotice>(Drain());
  ASSERT_EQ(n.size(), 1u);  // P1 (asking) is released now
  EXPECT_EQ(n[0].peer, kP1);
  EXPECT_EQ(n[0].notice, ReadNotice::kRelease);
  table.OnReadDone(reads[0].read, true, At(3));
  std::vector<ReadLoadAction> a = Drain();
  ASSERT_EQ(Only<SendNotice>(a).size(), 1u);
  EXPECT_EQ(Only<SendNotice>(a)[0].notice, ReadNotice::kRelease);
  EXPECT_EQ(Only<LoadReleased>(a).size(), 1u);
  EXPECT_TRUE(Only<LoadDone>(a).empty());
  table.OnTimer(At(10'000));
  EXPECT_TRUE(Drain().empty());
}

TEST_F(ReadLoadTableTest, AbortAllCutsShort) {
  Start({kP0});
  table.AbortAll(At(1));
  std::vector<ReadLoadAction> a = Drain();
  ASSERT_EQ(Only<SendNotice>(a).size(), 1u);
  std::vector<LoadDone> done = Only<LoadDone>(a);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_TRUE(done[0].cut_short);
}

TEST_F(ReadLoadTableTest, EndedAnswerFailsTheProducerAndGiveUpReleasesTheSilentOnes) {
  std::vector<SendHeartbeat> hb = Start({kP0, kP1});
  GrantLease ended = Granted(hb[0], 0);
  ended.answer = LeaseAnswer::kEnded;
  ended.result = TransferResult::kExpired;
  table.OnGrant(kP0, ended, At(1));
  EXPECT_TRUE(Drain().empty());
  // P1 never answers: at give-up it is released (best effort) and the load fails.
  for (int64_t t = 5'000; t < 60'000; t += 5'000) {
    table.OnTimer(At(t));
    Drain();
  }
  table.OnTimer(At(60'000));
  std::vector<ReadLoadAction> a = Drain();
  std::vector<LoadDone> done = Only<LoadDone>(a);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(done[0].first_error, TransferResult::kExpired);
  EXPECT_EQ(table.stats().producers_given_up, 1u);
}

TEST_F(ReadLoadTableTest, GrantsForOldOrUnknownHeartbeatsAreNotUsed) {
  std::vector<SendHeartbeat> hb = Start({kP0});
  GrantLease g = Granted(hb[0], 20'000);
  g.seq = hb[0].seq + 100;  // never sent
  table.OnGrant(kP0, g, At(1));
  EXPECT_TRUE(Only<StartRead>(Drain()).empty());
  EXPECT_EQ(table.stats().grants_unmatched, 1u);
  GrantLease mismatch = Granted(hb[0], 20'000);
  table.OnGrant(kP1, mismatch, At(2));  // not a producer of this load
  EXPECT_EQ(table.stats().grants_unmatched, 2u);
}

TEST_F(ReadLoadTableTest, PeerGoneFailsWhatItHasNotGranted) {
  Start({kP0});
  table.PeerGone(kP0, At(1));
  std::vector<LoadDone> done = Only<LoadDone>(Drain());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].first_error, TransferResult::kUnreachable);
}

TEST_F(ReadLoadTableTest, SourceAndDestinationOfDifferentLengthFailWithoutReading) {
  std::vector<SendHeartbeat> hb = Start({kP0});
  GrantLease g = Granted(hb[0], 20'000);
  g.src = Blocks(100, 3);
  table.OnGrant(kP0, g, At(1));
  std::vector<ReadLoadAction> a = Drain();
  EXPECT_TRUE(Only<StartRead>(a).empty());
  ASSERT_EQ(Only<SendNotice>(a).size(), 1u);
  EXPECT_EQ(Only<SendNotice>(a)[0].notice, ReadNotice::kFailed);
  EXPECT_EQ(Only<LoadDone>(a).size(), 1u);
}

TEST_F(ReadLoadTableTest, AnUnstartedReleaseNeverReleasesALiveLoadsTransfer) {
  // A duplicate transfer_id: another request on this rank ends before it
  // allocated. Its release would tell P "no read in flight" for the live
  // load's transfer — a lie that lets P free blocks being read.
  std::vector<SendHeartbeat> hb = Start({kP0});
  table.OnGrant(kP0, Granted(hb[0], 20'000), At(1));
  ASSERT_EQ(Only<StartRead>(Drain()).size(), 1u);
  std::vector<PeerId> producers{kP0};
  table.ReleaseUnstarted(kT, producers);
  EXPECT_TRUE(Only<SendNotice>(Drain()).empty());
  EXPECT_EQ(table.stats().releases_skipped_live, 1u);
}

}  // namespace
}  // namespace kvrelay
