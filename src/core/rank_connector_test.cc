// rank_connector_test.cc — RankConnector's peer bookkeeping on D: a load
// that needs a producer declared gone fails at once, whether it started
// before the death was known (PeerGone fails its pulls) or after (a request
// admitted just before: ProducersFor finds the producer gone); a handshake
// or a new incarnation brings the producer back.
#include "core/rank_connector.h"

#include <gtest/gtest.h>

#include <variant>
#include <vector>

namespace kvrelay {
namespace {

constexpr uint32_t kPEngine = 5;
const PeerId kP = PeerAddress{kPEngine, 0, 1}.Id();       // P engine 5, rank 0, incarnation 1
const PeerId kPNext = PeerAddress{kPEngine, 0, 2}.Id();   // its next incarnation

RankConnector Consumer() {
  RankConnectorOptions o;
  o.role = ConnectorRole::kConsumer;
  o.rank = 0;
  o.tp = 1;
  return RankConnector(o);
}

ConnectorMetadata LoadMeta(uint32_t id) {
  ConnectorMetadata meta;
  LoadOp op;
  op.request = RequestId{id, 1};
  op.transfer = TransferId{9, id};
  op.producer_engine = kPEngine;
  op.producer_tp = 1;
  op.dst = {BlockId{id, 1}};
  meta.loads.push_back(op);
  return meta;
}

int PullsTo(RankConnector& c, PeerId peer) {
  int n = 0;
  while (auto a = c.PollAction()) {
    if (auto* m = std::get_if<OutMessage>(&*a)) {
      if (m->to == peer && std::holds_alternative<PullMsg>(m->msg)) ++n;
    }
  }
  return n;
}

// The load's end as the engine sees it: failed (unreachable) or not yet.
std::vector<LoadDone> Finished(RankConnector& c) { return c.GetFinished().finished_recving; }

TEST(RankConnectorTest, ALoadThatNeedsAGoneProducerFailsAtOnce) {
  RankConnector c = Consumer();
  const Instant t0 = Instant::Epoch();
  c.SetPeer(kPEngine, 0, kP, t0);
  c.ApplyMetadata(LoadMeta(1), t0);
  EXPECT_EQ(PullsTo(c, kP), 1);
  EXPECT_TRUE(Finished(c).empty());

  // P dies: the load in flight fails now...
  c.PeerGone(kP, t0 + Duration::Milliseconds(1));
  std::vector<LoadDone> done = Finished(c);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(done[0].first_error, TransferResult::kUnreachable);

  // ...and so does one the engine admitted just before it knew: no pull
  // goes to the dead process, nothing waits for the give-up time.
  c.ApplyMetadata(LoadMeta(2), t0 + Duration::Milliseconds(2));
  EXPECT_EQ(PullsTo(c, kP), 0);
  done = Finished(c);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].request, (RequestId{2, 1}));
  EXPECT_EQ(done[0].first_error, TransferResult::kUnreachable);
  EXPECT_EQ(c.load_table()->live_loads(), 0u);
  c.CheckInvariants();
}

TEST(RankConnectorTest, AGoneProducerThatAnswersOrRestartsServesAgain) {
  RankConnector c = Consumer();
  const Instant t0 = Instant::Epoch();
  c.SetPeer(kPEngine, 0, kP, t0);
  c.PeerGone(kP, t0);
  // Silence, not death: the same incarnation handshakes again.
  c.Reconnected(kP, t0 + Duration::Seconds(1));
  c.ApplyMetadata(LoadMeta(1), t0 + Duration::Seconds(1));
  EXPECT_EQ(PullsTo(c, kP), 1);
  EXPECT_TRUE(Finished(c).empty());
  c.CheckInvariants();

  // Death, then a new incarnation: loads go to it.
  c.PeerGone(kP, t0 + Duration::Seconds(2));
  ASSERT_EQ(Finished(c).size(), 1u);  // load 1 failed with its producer
  c.SetPeer(kPEngine, 0, kPNext, t0 + Duration::Seconds(3));
  c.ApplyMetadata(LoadMeta(2), t0 + Duration::Seconds(3));
  EXPECT_EQ(PullsTo(c, kPNext), 1);
  EXPECT_TRUE(Finished(c).empty());
  c.CheckInvariants();
}

}  // namespace
}  // namespace kvrelay
