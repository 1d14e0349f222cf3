// Resent pulls after a reconnect: P decides each (pull, transfer) once and
// repeats that answer; D resends only what is unanswered, with the budget
// left before it gives up.
#include <gtest/gtest.h>

#include <variant>
#include <vector>

#include "core/load_table.h"
#include "core/send_table.h"

namespace kvrelay {
namespace {

constexpr Duration kTimeout = Duration::Seconds(10);
constexpr Duration kGrace = Duration::Seconds(2);
const PeerId kD{7, 1};
const PeerId kP{3, 1};

struct Drained {
  std::vector<AnswerPull> answers;
  std::vector<StartWrite> writes;
  int finished = 0;
};

Drained Drain(SendTable& t) {
  Drained d;
  while (auto a = t.PollAction()) {
    if (auto* x = std::get_if<AnswerPull>(&*a)) d.answers.push_back(*x);
    if (auto* x = std::get_if<StartWrite>(&*a)) d.writes.push_back(*x);
    if (std::holds_alternative<SendFinished>(*a)) ++d.finished;
  }
  return d;
}

SendTable Table() {
  SendTableOptions o;
  o.abort_timeout = kTimeout;
  o.giveup_grace = kGrace;
  o.num_workers = 1;
  return SendTable(o);
}

TEST(ResendTest, ResentWhileLiveIsIgnoredThenAnsweredOnce) {
  SendTable t = Table();
  const TransferId tid{1, 1};
  Instant now = Instant::Epoch();
  ASSERT_TRUE(t.Claim(tid, 1, now).ok());
  std::vector<PullItem> pull = {PullItem{tid, {BlockId{4, 1}}, 0, 0}};
  t.Pull(kD, 2, pull, now);
  t.Pull(kD, 2, pull, now);  // the resend, while the first waits for the prefill
  EXPECT_EQ(t.live_pull_items(), 1u);
  EXPECT_EQ(t.stats().duplicate_items, 1u);
  ASSERT_TRUE(t.Ready(tid, {BlockId{9, 1}}, now).ok());
  Drained d = Drain(t);
  ASSERT_EQ(d.writes.size(), 1u);
  t.WriteDone(d.writes[0].write, true, now);
  d = Drain(t);
  ASSERT_EQ(d.answers.size(), 1u);
  EXPECT_EQ(d.answers[0].result, TransferResult::kOk);
  t.CheckInvariants();
}

TEST(ResendTest, ResentAfterTheAnswerGetsTheSameAnswerAndNoWrite) {
  SendTable t = Table();
  const TransferId tid{1, 2};
  Instant now = Instant::Epoch();
  ASSERT_TRUE(t.Claim(tid, 1, now).ok());
  ASSERT_TRUE(t.Ready(tid, {BlockId{9, 1}}, now).ok());
  std::vector<PullItem> pull = {PullItem{tid, {BlockId{4, 1}}, 0, 0}};
  t.Pull(kD, 2, pull, now);
  Drained d = Drain(t);
  t.WriteDone(d.writes.at(0).write, true, now);
  d = Drain(t);
  ASSERT_EQ(d.answers.size(), 1u);  // this answer is lost on the wire
  EXPECT_EQ(t.live_sends(), 0u);    // everyone pulled: dropped, no tombstone
  now = now + Duration::Seconds(5);
  t.Pull(kD, 2, pull, now);  // D resends after the reconnect
  d = Drain(t);
  ASSERT_EQ(d.answers.size(), 1u);
  EXPECT_EQ(d.answers[0].result, TransferResult::kOk);
  EXPECT_TRUE(d.writes.empty());
  EXPECT_EQ(t.live_sends(), 0u) << "a resend must not resurrect the transfer";
  EXPECT_EQ(t.stats().reanswered, 1u);
}

TEST(ResendTest, AnswerMemoryLastsAsLongAsDCouldResend) {
  SendTable t = Table();
  const TransferId tid{1, 3};
  Instant now = Instant::Epoch();
  t.Abort(tid, now);  // tombstone
  std::vector<PullItem> pull = {PullItem{tid, {BlockId{4, 1}}, 0, 0}};
  t.Pull(kD, 2, pull, now);
  EXPECT_EQ(Drain(t).answers.at(0).result, TransferResult::kAborted);
  t.Pull(kD, 2, pull, now + kTimeout + kGrace - Duration::Nanoseconds(1));
  EXPECT_EQ(Drain(t).answers.at(0).result, TransferResult::kAborted);
  EXPECT_EQ(t.stats().reanswered, 1u);
}

TEST(ResendTest, BudgetShortensTheDeadline) {
  SendTable t = Table();
  const TransferId tid{1, 4};
  const Instant now = Instant::Epoch();
  ASSERT_TRUE(t.Claim(tid, 1, now).ok());
  std::vector<PullItem> pull = {
      PullItem{tid, {BlockId{4, 1}}, 0, Duration::Seconds(3).ns()}};
  t.Pull(kD, 2, pull, now);
  EXPECT_EQ(t.NextDeadline(), now + Duration::Seconds(3));
  t.OnTimer(now + Duration::Seconds(3));
  Drained d = Drain(t);
  ASSERT_EQ(d.answers.size(), 1u);
  EXPECT_EQ(d.answers[0].result, TransferResult::kDeadline);
  // A budget larger than abort_timeout is capped at abort_timeout.
  const TransferId tid2{1, 5};
  ASSERT_TRUE(t.Claim(tid2, 1, now).ok());
  pull = {PullItem{tid2, {BlockId{4, 1}}, 0, Duration::Seconds(3600).ns()}};
  t.Pull(kD, 4, pull, now);
  EXPECT_EQ(t.NextDeadline(), now + kTimeout);
}

TEST(ResendTest, LoadTableResendsUnansweredWithTheBudgetLeft) {
  LoadTableOptions o;
  o.abort_timeout = kTimeout;
  o.giveup_grace = kGrace;
  LoadTable d(o);
  const Instant start = Instant::Epoch();
  const PeerId other{4, 1};
  std::vector<PeerId> producers = {kP, other};
  ASSERT_TRUE(d.Start(RequestId{1, 1}, TransferId{2, 2}, producers, {BlockId{5, 1}}, start, 77)
                  .ok());
  std::vector<SendPull> first;
  while (auto a = d.PollAction()) first.push_back(std::get<SendPull>(*a));
  ASSERT_EQ(first.size(), 2u);
  d.OnAnswer(other, first[1].pull_seq, TransferId{2, 2}, TransferResult::kOk, start);
  const Instant later = start + Duration::Seconds(4);
  d.ResendTo(kP, later);
  d.ResendTo(other, later);  // answered: nothing to resend
  std::vector<SendPull> again;
  while (auto a = d.PollAction()) again.push_back(std::get<SendPull>(*a));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].peer, kP);
  EXPECT_EQ(again[0].pull_seq, first[0].pull_seq) << "same sequence: P can recognize it";
  EXPECT_EQ(again[0].dst, first[0].dst);
  EXPECT_EQ(again[0].prompt_hash, 77u);
  EXPECT_EQ(again[0].budget_ns, (kTimeout - Duration::Seconds(4)).ns());
  // Past the point where P could still start a write, nothing is resent.
  d.ResendTo(kP, start + kTimeout);
  EXPECT_FALSE(d.PollAction().has_value());
  d.CheckInvariants();
}

}  // namespace
}  // namespace kvrelay
