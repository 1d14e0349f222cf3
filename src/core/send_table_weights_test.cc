// A weights update between P's claim and its prefill: the KV handed over at
// Ready is not the KV the claim promised, so no D that admitted the prompt
// can use it. P ends the send at once (found by `kvrelay matrix` at full
// load, case update-weights-wait-both: P held 312 blocks for its expiry).
#include <gtest/gtest.h>

#include <vector>

#include "core/send_table.h"

namespace kvrelay {
namespace {

TEST(SendTableWeightsTest, ReadyUnderOtherWeightsEndsTheSendAndAnswersWaitingPulls) {
  SendTable table(SendTableOptions{});
  const TransferId t{1, 2};
  const PeerId d{8, 1};
  Instant now = Instant::FromNanos(1'000'000'000);
  ASSERT_TRUE(table.Claim(t, 1, now, /*prompt_hash=*/111).ok());
  PullItem item;
  item.transfer = t;
  item.dst = {BlockId{5, 1}, BlockId{6, 1}};
  item.prompt_hash = 111;   // D admitted the prompt under the old weights
  table.Pull(d, 2, std::vector<PullItem>{item}, now);
  EXPECT_FALSE(table.PollAction().has_value()) << "the pull waits for the prefill";

  Status s = table.Ready(t, {BlockId{1, 1}, BlockId{2, 1}}, now, /*prompt_hash=*/222);
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  // The waiting pull is answered now (rejected); no SendFinished: P keeps
  // the blocks it was refused and frees them itself.
  std::vector<SendAction> actions;
  while (auto a = table.PollAction()) actions.push_back(*a);
  ASSERT_EQ(actions.size(), 1u);
  const auto* ans = std::get_if<AnswerPull>(&actions[0]);
  ASSERT_NE(ans, nullptr);
  EXPECT_EQ(ans->result, TransferResult::kMismatch);
  EXPECT_EQ(table.live_sends(), 0u);
  EXPECT_TRUE(table.HasTombstone(t));
  // A later pull meets the tombstone at once, not a timeout.
  table.Pull(d, 4, std::vector<PullItem>{item}, now);
  auto later = table.PollAction();
  ASSERT_TRUE(later.has_value());
  ASSERT_NE(std::get_if<AnswerPull>(&*later), nullptr);
  EXPECT_EQ(std::get<AnswerPull>(*later).result, TransferResult::kMismatch);
  table.CheckInvariants();
}

TEST(SendTableWeightsTest, SameFingerprintAtReadyKeepsTheSend) {
  SendTable table(SendTableOptions{});
  const TransferId t{3, 4};
  Instant now = Instant::FromNanos(1'000'000'000);
  ASSERT_TRUE(table.Claim(t, 1, now, 111).ok());
  EXPECT_TRUE(table.Ready(t, {BlockId{1, 1}}, now, 111).ok());
  EXPECT_EQ(table.StateOf(t), SendState::kReady);
  table.CheckInvariants();
}

}  // namespace
}  // namespace kvrelay
