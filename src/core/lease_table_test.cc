// Tests for LeaseTable: P's read-mode lease per transfer.
#include "core/lease_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvrelay {
namespace {

const TransferId kT{0x1234, 0x5678};
const TransferId kU{0x9999, 0x1111};
// D engine 1's ranks 0 and 1, and a rank of engine 2.
const PeerId kD0 = PeerAddress{1, 0, 1}.Id();
const PeerId kD1 = PeerAddress{1, 1, 1}.Id();
const PeerId kOther = PeerAddress{2, 0, 1}.Id();

Instant At(int64_t ms) { return Instant::Epoch() + Duration::Milliseconds(ms); }

std::vector<BlockId> Blocks(uint32_t n) {
  std::vector<BlockId> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(BlockId{i, 1});
  return out;
}

class LeaseTableTest : public ::testing::Test {
 protected:
  LeaseTableOptions Options() {
    LeaseTableOptions o;
    o.initial_lease = Duration::Seconds(30);
    o.extension = Duration::Seconds(20);
    o.tombstone_ttl = Duration::Seconds(100);
    return o;
  }
  std::vector<LeaseAction> Drain() {
    std::vector<LeaseAction> out;
    while (auto a = table.PollAction()) out.push_back(std::move(*a));
    table.CheckInvariants();
    return out;
  }
  // The one action drained, which must be a GrantLease.
  GrantLease OneGrant() {
    std::vector<LeaseAction> a = Drain();
    EXPECT_EQ(a.size(), 1u);
    if (a.size() != 1 || !std::holds_alternative<GrantLease>(a[0])) return GrantLease{};
    return std::get<GrantLease>(a[0]);
  }
  int Finished(const std::vector<LeaseAction>& actions, TransferResult* reason = nullptr) {
    int n = 0;
    for (const LeaseAction& a : actions) {
      if (const auto* f = std::get_if<SendFinished>(&a)) {
        ++n;
        if (reason) *reason = f->reason;
      }
    }
    return n;
  }
  std::vector<PeerId> Revoked(const std::vector<LeaseAction>& actions) {
    std::vector<PeerId> out;
    for (const LeaseAction& a : actions) {
      if (const auto* r = std::get_if<RevokeLease>(&a)) out.push_back(r->peer);
    }
    return out;
  }
  void Leased(uint32_t need = 1, int64_t at_ms = 0) {
    ASSERT_TRUE(table.Claim(kT, need, At(at_ms)).ok());
    ASSERT_TRUE(table.Ready(kT, Blocks(3), At(at_ms)).ok());
    Drain();
  }

  LeaseTable table{Options()};
};

TEST_F(LeaseTableTest, AHeartbeatDuringThePrefillIsGrantedTheMomentItEnds) {
  ASSERT_TRUE(table.Claim(kT, 1, At(0)).ok());
  table.Heartbeat(kD0, 1, kT, 0, At(1));
  table.Heartbeat(kD0, 2, kT, 0, At(5));  // replaces the first
  EXPECT_TRUE(Drain().empty());           // waits: not a heartbeat interval
  ASSERT_TRUE(table.Ready(kT, Blocks(3), At(10)).ok());
  EXPECT_EQ(table.StateOf(kT), LeaseState::kLeased);
  GrantLease g = OneGrant();
  EXPECT_EQ(g.answer, LeaseAnswer::kGranted);
  EXPECT_EQ(g.seq, 2u);
  EXPECT_EQ(g.src, Blocks(3));
  // The initial lease (30 s from ready) is longer than an extension.
  EXPECT_EQ(g.remaining_ns, Duration::Seconds(30).ns());
}

TEST_F(LeaseTableTest, AHeartbeatBeforeTheClaimLeavesAPlaceholderThatTheClaimAdopts) {
  table.Heartbeat(kD0, 1, kT, 0, At(0));
  EXPECT_TRUE(Drain().empty());
  EXPECT_EQ(table.stats().placeholders, 1u);
  EXPECT_FALSE(table.Ready(kT, Blocks(1), At(1)).ok());  // never claimed
  ASSERT_TRUE(table.Claim(kT, 1, At(2)).ok());
  EXPECT_FALSE(table.Claim(kT, 1, At(2)).ok());          // now it is
  ASSERT_TRUE(table.Ready(kT, Blocks(1), At(3)).ok());
  EXPECT_EQ(OneGrant().answer, LeaseAnswer::kGranted);
}

TEST_F(LeaseTableTest, AnUnclaimedPlaceholderGoesAwayAfterTheInitialLease) {
  table.Heartbeat(kD0, 1, kU, 0, At(0));
  Drain();
  table.OnTimer(At(30'000));
  GrantLease g = OneGrant();
  EXPECT_EQ(g.answer, LeaseAnswer::kPending);
  EXPECT_EQ(table.live_leases(), 0u);
  EXPECT_FALSE(table.HasTombstone(kU));  // the claim may still come
  EXPECT_TRUE(table.Claim(kU, 1, At(30'001)).ok());
}

TEST_F(LeaseTableTest, AClaimNamingAnotherEngineRefusesItsPlaceholdersWaiters) {
  table.Heartbeat(kOther, 1, kT, 0, At(0));
  Drain();
  ASSERT_TRUE(table.Claim(kT, 1, At(1), 0, /*consumer_engine=*/1).ok());
  GrantLease g = OneGrant();
  EXPECT_EQ(g.answer, LeaseAnswer::kEnded);
  EXPECT_EQ(g.result, TransferResult::kRejected);
  table.Heartbeat(kD0, 2, kT, 0, At(2));  // engine 1 waits as usual
  EXPECT_TRUE(Drain().empty());
}

TEST_F(LeaseTableTest, AnAbortDuringThePrefillAnswersTheWaitingHeartbeatAtOnce) {
  ASSERT_TRUE(table.Claim(kT, 1, At(0)).ok());
  table.Heartbeat(kD0, 1, kT, 0, At(1));
  table.Abort(kT, At(2));
  GrantLease g = OneGrant();
  EXPECT_EQ(g.answer, LeaseAnswer::kEnded);
  EXPECT_EQ(g.result, TransferResult::kAborted);
}

TEST_F(LeaseTableTest, DoneFromEveryReaderFreesOnceWithoutWaiting) {
  Leased(/*need=*/2);
  table.Heartbeat(kD0, 1, kT, 0, At(1));
  table.Heartbeat(kD1, 2, kT, 0, At(1));
  Drain();
  table.Notice(kD0, kT, ReadNotice::kDone, At(5));
  EXPECT_EQ(Finished(Drain()), 0);
  table.Notice(kD1, kT, ReadNotice::kDone, At(6));
  TransferResult reason = TransferResult::kAborted;
  EXPECT_EQ(Finished(Drain(), &reason), 1);
  EXPECT_EQ(reason, TransferResult::kOk);
  // A repeated or late notice changes nothing and is counted.
  table.Notice(kD1, kT, ReadNotice::kDone, At(7));
  EXPECT_EQ(Finished(Drain()), 0);
  EXPECT_EQ(table.stats().notices_after_end, 1u);
}

TEST_F(LeaseTableTest, ExpiryFreesOnceAndLateDoneIsDroppedAndCounted) {
  Leased();
  table.Heartbeat(kD0, 1, kT, 0, At(1));
  Drain();
  ASSERT_EQ(table.NextDeadline(), At(0) + Duration::Seconds(30));
  table.OnTimer(At(29'999));
  EXPECT_EQ(Finished(Drain()), 0);
  table.OnTimer(At(30'000));
  TransferResult reason = TransferResult::kOk;
  EXPECT_EQ(Finished(Drain(), &reason), 1);
  EXPECT_EQ(reason, TransferResult::kExpired);
  table.Notice(kD0, kT, ReadNotice::kDone, At(30'001));
  EXPECT_EQ(Finished(Drain()), 0);
  EXPECT_EQ(table.stats().notices_after_end, 1u);
  // A heartbeat after the end says so: D must not read.
  table.Heartbeat(kD0, 2, kT, 0, At(30'002));
  GrantLease g = OneGrant();
  EXPECT_EQ(g.answer, LeaseAnswer::kEnded);
  EXPECT_EQ(g.result, TransferResult::kExpired);
}

TEST_F(LeaseTableTest, HeartbeatsExtendAndTheReaperFollowsTheCurrentExpiry) {
  // Two leases; the first one is extended past the second: the reaper must
  // reap the second at its time and not stop behind the first.
  ASSERT_TRUE(table.Claim(kT, 1, At(0)).ok());
  ASSERT_TRUE(table.Ready(kT, Blocks(1), At(0)).ok());
  ASSERT_TRUE(table.Claim(kU, 1, At(1000)).ok());
  ASSERT_TRUE(table.Ready(kU, Blocks(1), At(1000)).ok());
  table.Heartbeat(kD0, 1, kT, 0, At(25'000));  // kT now until 45 s
  Drain();
  table.OnTimer(At(31'000));                   // kU (until 31 s) is due
  std::vector<LeaseAction> a = Drain();
  ASSERT_EQ(Finished(a), 1);
  EXPECT_EQ(std::get<SendFinished>(a[0]).transfer, kU);
  EXPECT_EQ(table.StateOf(kT), LeaseState::kLeased);
  table.OnTimer(At(44'999));
  EXPECT_EQ(Finished(Drain()), 0);
  table.OnTimer(At(45'000));
  EXPECT_EQ(Finished(Drain()), 1);
}

TEST_F(LeaseTableTest, AbortWithNoReaderGrantedFreesAtOnce) {
  Leased();
  table.Abort(kT, At(5));
  TransferResult reason = TransferResult::kOk;
  EXPECT_EQ(Finished(Drain(), &reason), 1);
  EXPECT_EQ(reason, TransferResult::kAborted);
}

TEST_F(LeaseTableTest, AbortWithAReaderRevokesAndFreesOnItsAnswerNotBefore) {
  Leased(/*need=*/2);
  table.Heartbeat(kD0, 1, kT, 0, At(1));
  table.Heartbeat(kD1, 2, kT, 0, At(1));
  Drain();
  table.Notice(kD1, kT, ReadNotice::kDone, At(2));  // kD1 is finished
  Drain();
  table.Abort(kT, At(3));
  std::vector<LeaseAction> a = Drain();
  EXPECT_EQ(Finished(a), 0);  // kD0 may be reading
  EXPECT_EQ(Revoked(a), std::vector<PeerId>{kD0});
  EXPECT_EQ(table.StateOf(kT), LeaseState::kRevoking);
  // No extension while revoking; heartbeats are told it ended.
  table.Heartbeat(kD0, 3, kT, 0, At(4));
  EXPECT_EQ(OneGrant().answer, LeaseAnswer::kEnded);
  table.Notice(kD0, kT, ReadNotice::kRevoked, At(5));
  TransferResult reason = TransferResult::kOk;
  EXPECT_EQ(Finished(Drain(), &reason), 1);
  EXPECT_EQ(reason, TransferResult::kAborted);
}

// A cache reset on P (ReleaseHeld) gives back only leases whose prefill is
// done, revoking their readers with the reason kReset; the lease of a
// request P has not finished goes on and is granted when it is.
TEST_F(LeaseTableTest, ReleaseHeldEndsOnlyLeasedLeasesAndRevokesWithReset) {
  Leased();
  table.Heartbeat(kD0, 1, kT, 0, At(1));
  EXPECT_EQ(OneGrant().answer, LeaseAnswer::kGranted);
  ASSERT_TRUE(table.Claim(kU, 1, At(1)).ok());
  table.Heartbeat(kD0, 2, kU, 0, At(1));  // waits for the prefill
  EXPECT_TRUE(Drain().empty());
  table.ReleaseHeld(At(2));
  std::vector<LeaseAction> a = Drain();
  ASSERT_EQ(a.size(), 1u);
  const auto* revoke = std::get_if<RevokeLease>(&a[0]);
  ASSERT_NE(revoke, nullptr);
  EXPECT_EQ(revoke->transfer, kT);
  EXPECT_EQ(revoke->reason, TransferResult::kReset);
  EXPECT_EQ(table.StateOf(kU), LeaseState::kWaiting);
  table.Notice(kD0, kT, ReadNotice::kRevoked, At(3));
  TransferResult reason = TransferResult::kOk;
  EXPECT_EQ(Finished(Drain(), &reason), 1);
  EXPECT_EQ(reason, TransferResult::kReset);
  ASSERT_TRUE(table.Ready(kU, Blocks(2), At(4)).ok());
  EXPECT_EQ(OneGrant().answer, LeaseAnswer::kGranted);
}

TEST_F(LeaseTableTest, AnUnansweredRevokeWaitsOutTheLeaseAndNoLonger) {
  Leased();
  table.Heartbeat(kD0, 1, kT, 0, At(10'000));  // until 30 s (initial is later)
  Drain();
  table.ReleaseHeld(At(11'000));
  EXPECT_EQ(Revoked(Drain()).size(), 1u);
  table.OnTimer(At(29'999));
  EXPECT_EQ(Finished(Drain()), 0);
  table.OnTimer(At(30'000));
  EXPECT_EQ(Finished(Drain()), 1);
  EXPECT_EQ(table.stats().expired_revoking, 1u);
}

TEST_F(LeaseTableTest, ReleaseBeforeAnyGrantFreesAtOnceAndOneBeforeClaimLeavesATombstone) {
  Leased();
  table.Notice(kD0, kT, ReadNotice::kRelease, At(1));
  TransferResult reason = TransferResult::kOk;
  EXPECT_EQ(Finished(Drain(), &reason), 1);
  EXPECT_EQ(reason, TransferResult::kReleased);
  table.Notice(kD0, kU, ReadNotice::kRelease, At(2));
  EXPECT_FALSE(table.Claim(kU, 1, At(3)).ok());
}

TEST_F(LeaseTableTest, AFailedReadOfOneRankRevokesTheOthers) {
  Leased(/*need=*/2);
  table.Heartbeat(kD0, 1, kT, 0, At(1));
  table.Heartbeat(kD1, 2, kT, 0, At(1));
  Drain();
  table.Notice(kD0, kT, ReadNotice::kFailed, At(2));
  std::vector<LeaseAction> a = Drain();
  EXPECT_EQ(Finished(a), 0);
  EXPECT_EQ(Revoked(a), std::vector<PeerId>{kD1});
  table.Notice(kD1, kT, ReadNotice::kDone, At(3));  // it had finished reading
  TransferResult reason = TransferResult::kOk;
  EXPECT_EQ(Finished(Drain(), &reason), 1);
  EXPECT_EQ(reason, TransferResult::kWriteFailed);
}

TEST_F(LeaseTableTest, AccessIsBoundToOneDEngineAndToNeedReaders) {
  Leased(/*need=*/1);
  table.Heartbeat(kD0, 1, kT, 0, At(1));
  EXPECT_EQ(OneGrant().answer, LeaseAnswer::kGranted);
  table.Heartbeat(kOther, 1, kT, 0, At(2));
  GrantLease g = OneGrant();
  EXPECT_EQ(g.answer, LeaseAnswer::kEnded);
  EXPECT_EQ(g.result, TransferResult::kRejected);
  EXPECT_TRUE(g.src.empty());
  table.Heartbeat(kD1, 1, kT, 0, At(3));  // a second rank where one is needed
  EXPECT_EQ(OneGrant().result, TransferResult::kRejected);
  EXPECT_EQ(table.stats().surplus_readers, 1u);
  // The other engine's release is refused too: the lease is untouched.
  table.Notice(kOther, kT, ReadNotice::kRelease, At(4));
  EXPECT_EQ(Finished(Drain()), 0);
  EXPECT_EQ(table.StateOf(kT), LeaseState::kLeased);
}

// A heartbeat with another fingerprint comes from the lease's only consumer,
// which recomputes on the answer: the lease ends now, not at expiry.
TEST_F(LeaseTableTest, PromptMismatchEndsTheLease) {
  ASSERT_TRUE(table.Claim(kT, 1, At(0), /*prompt_hash=*/77).ok());
  ASSERT_TRUE(table.Ready(kT, Blocks(1), At(0)).ok());
  Drain();
  table.Heartbeat(kD0, 1, kT, 78, At(1));
  std::vector<LeaseAction> a = Drain();
  TransferResult reason = TransferResult::kOk;
  EXPECT_EQ(Finished(a, &reason), 1);
  EXPECT_EQ(reason, TransferResult::kMismatch);
  table.Heartbeat(kD0, 2, kT, 77, At(2));
  GrantLease g = OneGrant();
  EXPECT_EQ(g.answer, LeaseAnswer::kEnded);
  EXPECT_EQ(g.result, TransferResult::kMismatch);
}

TEST_F(LeaseTableTest, TombstonesAgeOutAndAbortBeforeClaimFailsTheClaim) {
  table.Abort(kU, At(0));
  EXPECT_FALSE(table.Claim(kU, 1, At(1)).ok());
  EXPECT_TRUE(table.HasTombstone(kU));
  table.OnTimer(At(100'000));
  EXPECT_FALSE(table.HasTombstone(kU));
  EXPECT_TRUE(table.Claim(kU, 1, At(100'001)).ok());
}

}  // namespace
}  // namespace kvrelay
