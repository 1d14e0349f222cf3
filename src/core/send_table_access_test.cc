// send_table_access_test.cc — access control in SendTable: a transfer is
// bound to one D engine (named by the claim, else the first to pull) and
// pulls or releases from any other engine are refused and counted;
// placeholders that expire unclaimed are counted as unknown transfers.
#include <gtest/gtest.h>

#include <vector>

#include "core/send_table.h"

namespace kvrelay {
namespace {

constexpr TransferId kT{0x1234, 0x5678};
const Instant kT0 = Instant::FromNanos(1'000'000'000);

PeerId Rank(uint32_t engine, uint32_t rank) {
  return PeerAddress{engine, rank, 1}.Id();
}

std::vector<AnswerPull> Answers(SendTable& t) {
  std::vector<AnswerPull> out;
  while (auto a = t.PollAction()) {
    if (auto* ans = std::get_if<AnswerPull>(&*a)) out.push_back(*ans);
  }
  return out;
}

std::vector<PullItem> Item(std::vector<BlockId> dst) { return {PullItem{kT, std::move(dst)}}; }

TEST(SendTableAccessTest, ClaimNamesTheEngineOthersAreRefused) {
  SendTable t(SendTableOptions{});
  ASSERT_TRUE(t.Claim(kT, 1, kT0, 0, /*consumer_engine=*/5).ok());
  t.Pull(Rank(6, 0), 2, Item({BlockId{1, 1}}), kT0);
  auto a = Answers(t);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].result, TransferResult::kRejected);
  EXPECT_EQ(t.stats().refused_wrong_engine, 1u);
  // A release from the wrong engine does not end the send either.
  t.Pull(Rank(6, 0), 3, Item({}), kT0);
  a = Answers(t);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].result, TransferResult::kRejected);
  EXPECT_EQ(t.StateOf(kT), SendState::kWaiting);
  // The named engine's pull is taken.
  t.Pull(Rank(5, 0), 2, Item({BlockId{1, 1}}), kT0);
  EXPECT_TRUE(Answers(t).empty());  // waits for the prefill
  EXPECT_EQ(t.live_pull_items(), 1u);
  t.CheckInvariants();
}

TEST(SendTableAccessTest, FirstPullBindsAnUnnamedTransferAllRanksOfThatEngineMayPull) {
  SendTable t(SendTableOptions{});
  ASSERT_TRUE(t.Claim(kT, 2, kT0).ok());
  t.Pull(Rank(3, 0), 2, Item({BlockId{1, 1}}), kT0);
  t.Pull(Rank(3, 1), 2, Item({BlockId{1, 1}}), kT0);  // another rank, same engine
  EXPECT_TRUE(Answers(t).empty());
  t.Pull(Rank(4, 0), 2, Item({BlockId{1, 1}}), kT0);  // another engine
  auto a = Answers(t);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].peer, Rank(4, 0));
  EXPECT_EQ(a[0].result, TransferResult::kRejected);
  EXPECT_EQ(t.stats().refused_wrong_engine, 1u);
  t.CheckInvariants();
}

TEST(SendTableAccessTest, PullsBeforeTheClaimFromAnotherEngineAreRefusedAtTheClaim) {
  SendTable t(SendTableOptions{});
  t.Pull(Rank(7, 0), 2, Item({BlockId{1, 1}}), kT0);  // placeholder, bound to 7
  EXPECT_TRUE(Answers(t).empty());
  ASSERT_TRUE(t.Claim(kT, 1, kT0, 0, /*consumer_engine=*/5).ok());
  auto a = Answers(t);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].result, TransferResult::kRejected);
  EXPECT_EQ(t.stats().refused_wrong_engine, 1u);
  t.Pull(Rank(5, 0), 2, Item({BlockId{1, 1}}), kT0);  // the named engine
  EXPECT_TRUE(Answers(t).empty());
  t.CheckInvariants();
}

TEST(SendTableAccessTest, UnclaimedPlaceholderExpiryIsCountedAsUnknownTransfer) {
  SendTableOptions o;
  o.abort_timeout = Duration::Seconds(1);
  SendTable t(o);
  t.Pull(Rank(2, 0), 2, Item({BlockId{1, 1}}), kT0);
  t.OnTimer(kT0 + Duration::Seconds(2));
  auto a = Answers(t);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].result, TransferResult::kExpired);
  EXPECT_EQ(t.stats().unknown_transfer_expired, 1u);
  t.CheckInvariants();
}

}  // namespace
}  // namespace kvrelay
