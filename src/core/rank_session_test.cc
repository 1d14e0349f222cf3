// rank_session_test.cc — RankSession's peer protocol, driven end to end: a
// D-role session and a P-role session pass frames to each other (the test is
// the network and the driver: it answers OpenTarget and finishes writes).
#include "core/rank_session.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace kvrelay {
namespace {

constexpr uint32_t kPEngine = 5;
constexpr uint32_t kDEngine = 7;
constexpr uint32_t kDBlocks = 32;   // D's registered pool
const std::string kDIdentity = "7:0:1";
const PeerId kP1 = PeerAddress{kPEngine, 0, 1}.Id();
const PeerId kP2 = PeerAddress{kPEngine, 0, 2}.Id();
const PeerId kD1 = PeerAddress{kDEngine, 0, 1}.Id();
const TransferId kT{9, 1};
const RequestId kR{1, 1};

Instant At(int64_t ms) { return Instant::Epoch() + Duration::Milliseconds(ms); }

HandshakeMsg Self(uint32_t engine, uint32_t incarnation, ConnectorRole role,
                  uint32_t num_blocks) {
  HandshakeMsg hs;
  hs.engine_id = engine;
  hs.incarnation = incarnation;
  hs.role = static_cast<uint8_t>(role);
  hs.transport = 1;  // rank 0 of tp 1; the layout below is the same on both sides
  hs.layers = hs.kv_heads = hs.dtype_bytes = 2;
  hs.head_dim = 8;
  hs.block_tokens = 16;
  hs.num_blocks = num_blocks;
  hs.registration = {static_cast<uint8_t>(engine), static_cast<uint8_t>(incarnation)};
  return hs;
}

// Deterministic nonces: a counter (from `seed`) packed into the 16 bytes.
std::function<HandshakeNonce()> Counter(uint64_t seed) {
  return [n = seed]() mutable {
    HandshakeNonce out{};
    ++n;
    std::memcpy(out.data(), &n, sizeof n);
    return out;
  };
}

RankSessionOptions Options(ConnectorRole role, uint32_t engine, uint32_t incarnation,
                           std::string token = "") {
  RankSessionOptions o;
  o.connector.role = role;
  o.connector.rank = 0;
  o.connector.tp = 1;
  o.self = Self(engine, incarnation, role, role == ConnectorRole::kConsumer ? kDBlocks : 64);
  o.auth_token = std::move(token);
  o.nonce = Counter(uint64_t{engine} << 32);
  return o;
}
RankSessionOptions DOptions(std::string token = "") {
  return Options(ConnectorRole::kConsumer, kDEngine, 1, std::move(token));
}
RankSessionOptions POptions(uint32_t incarnation = 1, std::string token = "") {
  return Options(ConnectorRole::kProducer, kPEngine, incarnation, std::move(token));
}

// Removes every action of type T from `seen` and returns them, in order.
template <typename T>
std::vector<T> Take(std::vector<SessionAction>& seen) {
  std::vector<T> out;
  std::vector<SessionAction> rest;
  for (SessionAction& a : seen) {
    if (auto* t = std::get_if<T>(&a)) {
      out.push_back(std::move(*t));
    } else {
      rest.push_back(std::move(a));
    }
  }
  seen = std::move(rest);
  return out;
}

// D rank (engine 7, rank 0) and P rank (engine 5, rank 0) joined by the test.
struct Rig {
  std::unique_ptr<RankSession> d, p;
  std::vector<SessionAction> d_seen, p_seen;  // what was neither a frame nor OpenTarget

  explicit Rig(RankSessionOptions d_options = DOptions(),
               RankSessionOptions p_options = POptions())
      : d(std::make_unique<RankSession>(std::move(d_options))),
        p(std::make_unique<RankSession>(std::move(p_options))) {}

  void Check() const {
    d->CheckInvariants();
    p->CheckInvariants();
  }

  // Moves frames both ways until both sides are quiet; `connected` false
  // drops them instead (a silent network). OpenTarget is opened at once.
  void Run(Instant now, bool connected = true) {
    for (bool moved = true; moved;) {
      moved = false;
      while (auto a = d->PollAction()) {
        if (auto* f = std::get_if<FrameToProducer>(&*a)) {
          moved = true;
          EXPECT_EQ(f->engine, kPEngine);
          if (connected) p->OnFrameFromConsumer(kDIdentity, f->frame, now);
        } else {
          d_seen.push_back(std::move(*a));
        }
        Check();
      }
      while (auto a = p->PollAction()) {
        if (auto* f = std::get_if<FrameToConsumer>(&*a)) {
          moved = true;
          EXPECT_EQ(f->identity, kDIdentity);
          if (connected) d->OnFrameFromProducer(kPEngine, 0, f->frame, now);
        } else if (auto* open = std::get_if<OpenTarget>(&*a)) {
          moved = true;
          p->OnTargetOpened(open->peer, true, "", now);
        } else {
          p_seen.push_back(std::move(*a));
        }
        Check();
      }
    }
  }

  void Handshake(Instant now) {
    d->Connect(kPEngine, 0, /*same_host=*/false, now);
    Run(now);
    ASSERT_NE(d->Producer(kPEngine, 0), nullptr);
    ASSERT_EQ(d->Producer(kPEngine, 0)->state, ProducerState::kUp);
    d_seen.clear();
    p_seen.clear();
  }

  void Load(Instant now, std::vector<BlockId> dst, TransferId t = kT, RequestId r = kR) {
    ConnectorMetadata meta;
    meta.loads.push_back(LoadOp{r, t, kPEngine, 1, std::move(dst), 0});
    d->ApplyMetadata(meta, now);
    Check();
  }

  // P: the request was claimed and its prefill is ready in blocks 3, 4.
  void Serve(Instant now, TransferId t = kT) {
    ConnectorMetadata meta;
    meta.claims.push_back(ClaimOp{t, 1, 0, UINT32_MAX});
    meta.readies.push_back(ReadyOp{t, {BlockId{3, 1}, BlockId{4, 1}}, 0, kNoFirstToken});
    p->ApplyMetadata(meta, now);
    Check();
  }

  // P: every write it started lands (ok).
  void FinishWrites(Instant now) {
    for (const StartWrite& w : Take<StartWrite>(p_seen)) {
      p->OnWriteDone(w.write, true, now);
      Check();
    }
    Run(now);
  }

  std::vector<LoadDone> Finished(Instant now) {
    std::vector<LoadDone> out = d->GetFinished(now).finished_recving;
    Check();
    Run(now);
    return out;
  }
};

// Rule: a hello, the target opened, the reply: D knows P's incarnation and P knows D's.
TEST(RankSessionTest, HandshakeMakesProducerUpAndRegistersConsumer) {
  Rig r;
  r.d->Connect(kPEngine, 0, /*same_host=*/false, At(0));
  r.Run(At(0));
  std::vector<ProducerChanged> changed = Take<ProducerChanged>(r.d_seen);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].state, ProducerState::kUp);
  EXPECT_EQ(changed[0].peer, kP1);
  const ProducerPeer* p = r.d->Producer(kPEngine, 0);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->known);
  EXPECT_EQ(p->peer, kP1);
  EXPECT_EQ(p->num_blocks, 64u);
  EXPECT_EQ(r.d->ProducerOf(kP1), p);
  const ConsumerPeer* c = r.p->ConsumerOf(kD1);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->identity, kDIdentity);
  EXPECT_EQ(c->num_blocks, kDBlocks);
  EXPECT_TRUE(c->target_open);
  EXPECT_EQ(r.d->stats().handshakes, 1u);
  EXPECT_EQ(r.p->stats().handshakes, 1u);
}

// Rule: silence past peer_down_after is DOWN, past peer_dead_after GONE (loads
// fail now); a reply of the same incarnation brings it back as a reconnect.
TEST(RankSessionTest, SilentProducerGoesDownThenGoneAndSameIncarnationComesBack) {
  Rig r;
  r.Handshake(At(0));
  r.Load(At(0), {BlockId{10, 1}});
  r.Run(At(0), /*connected=*/false);  // the pull is lost with everything else
  auto state = [&] { return r.d->Producer(kPEngine, 0)->state; };
  // Heartbeats at 1 s, 2 s, ...: silent since the one at 1 s.
  for (int s = 1; s <= 4; ++s) {
    r.d->OnTimer(At(s * 1000));
    r.Run(At(s * 1000), false);
    EXPECT_EQ(state(), ProducerState::kUp) << s;
  }
  r.d->OnTimer(At(5000));  // silent 4 s > 3 s
  r.Run(At(5000), false);
  EXPECT_EQ(state(), ProducerState::kDown);
  for (int s = 6; s <= 11; ++s) {
    r.d->OnTimer(At(s * 1000));
    r.Run(At(s * 1000), false);
    EXPECT_EQ(state(), ProducerState::kDown) << s;
  }
  EXPECT_TRUE(r.Finished(At(11000)).empty());  // down is not dead
  r.d->OnTimer(At(12000));  // silent 11 s > 10 s
  r.Run(At(12000), false);
  EXPECT_EQ(state(), ProducerState::kGone);
  std::vector<LoadDone> done = r.Finished(At(12000));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(done[0].first_error, TransferResult::kUnreachable);

  r.d->OnTimer(At(13000));  // the network is back
  r.Run(At(13000));
  EXPECT_EQ(state(), ProducerState::kUp);
  EXPECT_EQ(r.d->Producer(kPEngine, 0)->peer, kP1);
  std::vector<ProducerChanged> changed = Take<ProducerChanged>(r.d_seen);
  ASSERT_EQ(changed.size(), 3u);
  EXPECT_EQ(changed[0].state, ProducerState::kDown);
  EXPECT_EQ(changed[1].state, ProducerState::kGone);
  EXPECT_EQ(changed[2].state, ProducerState::kUp);
  EXPECT_EQ(r.d->stats().peers_down, 1u);
  EXPECT_EQ(r.d->stats().peers_gone, 1u);
  EXPECT_EQ(r.d->stats().reconnects, 1u);
  EXPECT_EQ(r.d->stats().handshakes, 1u);
}

// Rule: heartbeats that run late still count silence (a busy loop must still
// find a dead peer: sim seed 6215902589, whose timers ran up to 12 ms late on
// a 7 ms heartbeat and never declared a crashed P gone); a gap of more than
// peer_down_after between two heartbeats is the loop's own silence (stalled
// or idle) and counting starts afresh.
TEST(RankSessionTest, LateHeartbeatsCountSilenceAndAStallStartsItAfresh) {
  Rig r;
  r.Handshake(At(0));
  r.Load(At(0), {BlockId{10, 1}});
  r.Run(At(0), /*connected=*/false);
  auto state = [&] { return r.d->Producer(kPEngine, 0)->state; };
  // Every tick 1.9 s late on a 1 s heartbeat: 2.9 s, 5.8 s, 8.7 s, ...
  // silent since 2.9 s, down past 3 s (8.7), gone past 10 s (14.5).
  int64_t ms = 0;
  for (int tick = 1; tick <= 4; ++tick) {
    ms += 2900;
    r.d->OnTimer(At(ms));
    r.Run(At(ms), false);
    EXPECT_EQ(state(), tick < 3 ? ProducerState::kUp : ProducerState::kDown) << ms;
  }
  EXPECT_TRUE(r.Finished(At(ms)).empty());
  ms += 2900;
  r.d->OnTimer(At(ms));
  r.Run(At(ms), false);
  EXPECT_EQ(state(), ProducerState::kGone);
  std::vector<LoadDone> done = r.Finished(At(ms));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].first_error, TransferResult::kUnreachable);

  // The network is back; then a hello goes unanswered and the loop stalls
  // for 20 s: on waking, that is no proof against the peer.
  ms += 1000;
  r.d->OnTimer(At(ms));
  r.Run(At(ms));
  ASSERT_EQ(state(), ProducerState::kUp);
  r.Load(At(ms), {BlockId{11, 1}}, TransferId{9, 2}, RequestId{2, 1});
  r.Run(At(ms), false);
  ms += 1000;
  r.d->OnTimer(At(ms));  // silent from here
  r.Run(At(ms), false);
  ms += 20000;
  r.d->OnTimer(At(ms));
  r.Run(At(ms), false);
  EXPECT_EQ(state(), ProducerState::kUp);
  EXPECT_TRUE(r.Finished(At(ms)).empty());
}

// Rule: a newer incarnation proves the old process gone (its pulls fail); a
// reply of an older one afterwards is a stale frame and changes nothing.
TEST(RankSessionTest, NewerIncarnationReplacesProducerAndOlderOneIsStale) {
  Rig r;
  r.Handshake(At(0));
  r.Load(At(0), {BlockId{10, 1}});
  r.Run(At(0));  // P1 holds the pull (nothing claimed: no answer)
  ASSERT_EQ(r.d->write_grants().size(), 1u);
  EXPECT_TRUE(r.Finished(At(0)).empty());

  r.p = std::make_unique<RankSession>(POptions(/*incarnation=*/2));  // P restarted
  r.d->OnTimer(At(1000));
  r.Run(At(1000));
  const ProducerPeer* p = r.d->Producer(kPEngine, 0);
  EXPECT_EQ(p->peer, kP2);
  EXPECT_EQ(p->state, ProducerState::kUp);
  EXPECT_EQ(r.d->stats().handshakes, 2u);
  std::vector<ProducerChanged> changed = Take<ProducerChanged>(r.d_seen);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].peer, kP2);
  std::vector<LoadDone> done = r.Finished(At(1000));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(Take<RevokeBlocks>(r.d_seen).size(), 1u);
  EXPECT_TRUE(r.d->write_grants().empty());

  // A reply of incarnation 1, late on the wire.
  r.d->OnFrameFromProducer(kPEngine, 0, EncodeWire(POptions(1).self), At(1500));
  r.Check();
  EXPECT_EQ(r.d->stats().stale_handshakes, 1u);
  EXPECT_EQ(r.d->Producer(kPEngine, 0)->peer, kP2);
  EXPECT_EQ(r.d->Producer(kPEngine, 0)->state, ProducerState::kUp);
  r.Run(At(1500));
  EXPECT_TRUE(Take<ProducerChanged>(r.d_seen).empty());
}

// Rule: a pull's dst blocks are granted before the pull goes out and revoked
// when its load ends, so only that transfer may write into them.
TEST(RankSessionTest, PullGrantsDstBlocksAndLoadEndRevokesThem) {
  Rig r;
  r.Handshake(At(0));
  r.Serve(At(0));
  r.Load(At(0), {BlockId{10, 1}, BlockId{11, 1}});
  std::optional<SessionAction> a = r.d->PollAction();
  ASSERT_TRUE(a && std::holds_alternative<GrantBlocks>(*a));
  const GrantBlocks& grant = std::get<GrantBlocks>(*a);
  EXPECT_EQ(grant.kind, GrantKind::kWrite);
  EXPECT_EQ(grant.transfer, kT);
  EXPECT_EQ(grant.blocks, (std::vector<uint32_t>{10, 11}));
  std::optional<SessionAction> b = r.d->PollAction();
  ASSERT_TRUE(b && std::holds_alternative<FrameToProducer>(*b));
  Result<WireMessage> pull = DecodeWire(std::get<FrameToProducer>(*b).frame, WireLimits{});
  ASSERT_TRUE(pull.ok());
  ASSERT_TRUE(std::holds_alternative<PullMsg>(*pull));
  ASSERT_EQ(std::get<PullMsg>(*pull).items.size(), 1u);
  EXPECT_EQ(std::get<PullMsg>(*pull).items[0].dst.size(), 2u);
  EXPECT_EQ(r.d->write_grants().at(kT), (std::vector<uint32_t>{10, 11}));

  r.p->OnFrameFromConsumer(kDIdentity, std::get<FrameToProducer>(*b).frame, At(1));
  r.Run(At(1));
  std::vector<StartWrite> writes;
  for (const SessionAction& s : r.p_seen) {
    if (auto* w = std::get_if<StartWrite>(&s)) writes.push_back(*w);
  }
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].peer, kD1);
  EXPECT_EQ(writes[0].dst, (std::vector<BlockId>{BlockId{10, 1}, BlockId{11, 1}}));
  EXPECT_EQ(r.p->stats().pull_items_taken, 1u);
  r.FinishWrites(At(2));

  std::vector<PullAnswered> answered = Take<PullAnswered>(r.d_seen);
  ASSERT_EQ(answered.size(), 1u);
  EXPECT_EQ(answered[0].result, TransferResult::kOk);
  std::vector<LoadDone> done = r.Finished(At(3));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok);
  std::vector<RevokeBlocks> revoked = Take<RevokeBlocks>(r.d_seen);
  ASSERT_EQ(revoked.size(), 1u);
  EXPECT_EQ(revoked[0].transfer, kT);
  EXPECT_EQ(revoked[0].blocks, (std::vector<uint32_t>{10, 11}));
  std::vector<LoadEnded> ended = Take<LoadEnded>(r.d_seen);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_TRUE(ended[0].ok);
  EXPECT_TRUE(r.d->write_grants().empty());
  EXPECT_EQ(r.d->stats().grants, 1u);
  EXPECT_EQ(r.d->stats().revokes, 1u);
}

// Read mode: one producer's reads landing are observed as a PullAnswered
// (blocks from P's grant, seconds from the first lease request), as a push
// pull's answer is — the figure `bench transfer --kv-mode read` reads from
// /debug/pulls. A failed read is observed as failed.
TEST(RankSessionTest, ReadModeReportsEachProducersReadsLikeAPullAnswer) {
  for (const bool ok : {true, false}) {
    SCOPED_TRACE(ok ? "reads land" : "a read fails");
    RankSessionOptions d = DOptions(), p = POptions();
    d.connector.mode = p.connector.mode = KvMode::kRead;
    Rig r(std::move(d), std::move(p));
    r.Handshake(At(0));
    r.Serve(At(0));
    r.Load(At(10), {BlockId{10, 1}, BlockId{11, 1}});
    r.Run(At(12));
    std::vector<StartRead> reads = Take<StartRead>(r.d_seen);
    ASSERT_EQ(reads.size(), 1u);
    EXPECT_EQ(reads[0].src, (std::vector<BlockId>{BlockId{3, 1}, BlockId{4, 1}}));
    EXPECT_TRUE(Take<PullAnswered>(r.d_seen).empty());   // nothing landed yet
    r.d->OnReadDone(reads[0].read, ok, At(25));
    r.Run(At(25));
    std::vector<PullAnswered> answered = Take<PullAnswered>(r.d_seen);
    ASSERT_EQ(answered.size(), 1u);
    EXPECT_EQ(answered[0].transfer, kT);
    EXPECT_EQ(answered[0].blocks, 2u);
    EXPECT_DOUBLE_EQ(answered[0].seconds, 0.015);   // lease sent at 10 ms, done at 25 ms
    EXPECT_EQ(answered[0].result, ok ? TransferResult::kOk : TransferResult::kWriteFailed);
    r.Finished(At(26));
  }
}

// Rule: a lane closing with the process gone makes the producer GONE at once,
// failing its unanswered loads and any load started after.
TEST(RankSessionTest, LaneClosedWithProcessGoneFailsLoadsAtOnce) {
  Rig r;
  r.d->Connect(kPEngine, 0, /*same_host=*/true, At(0));
  r.Run(At(0));
  EXPECT_EQ(Take<OpenLane>(r.d_seen).size(), 1u);  // opened at Connect, not again
  EXPECT_TRUE(r.d->Producer(kPEngine, 0)->lane);
  r.Load(At(0), {BlockId{10, 1}});
  r.Run(At(0));
  EXPECT_TRUE(r.Finished(At(0)).empty());

  r.d->OnLaneClosed(kPEngine, 0, /*process_gone=*/true, At(100));
  r.Check();
  EXPECT_EQ(r.d->Producer(kPEngine, 0)->state, ProducerState::kGone);
  EXPECT_FALSE(r.d->Producer(kPEngine, 0)->lane);
  std::vector<LoadDone> done = r.Finished(At(100));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(done[0].first_error, TransferResult::kUnreachable);
  EXPECT_TRUE(r.d->write_grants().empty());

  r.Load(At(200), {BlockId{12, 1}}, TransferId{9, 2}, RequestId{2, 1});
  done = r.Finished(At(200));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(r.d->stats().pulls_sent, 1u);  // no pull went to the dead process
}

// Rule: an undecodable frame or one of the wrong kind is counted and dropped;
// a pull from an identity that never handshook reaches no table.
TEST(RankSessionTest, MalformedFramesAndUnknownSendersAreCountedAndDropped) {
  Rig r;
  r.Handshake(At(0));
  const std::vector<uint8_t> garbage = {1, 2, 3, 4, 5};
  r.p->OnFrameFromConsumer(kDIdentity, garbage, At(1));
  r.d->OnFrameFromProducer(kPEngine, 0, garbage, At(1));
  r.Check();
  EXPECT_EQ(r.p->stats().malformed, 1u);
  EXPECT_EQ(r.d->stats().malformed, 1u);
  // An answer sent to P, a pull sent to D: the wrong kind for the side.
  r.p->OnFrameFromConsumer(kDIdentity, EncodeWire(AnswerMsg{2, kT}), At(2));
  r.d->OnFrameFromProducer(kPEngine, 0, EncodeWire(PullMsg{2, {}}), At(2));
  r.Check();
  EXPECT_EQ(r.p->stats().malformed, 2u);
  EXPECT_EQ(r.d->stats().malformed, 2u);

  PullMsg pull{2, {PullItem{kT, {BlockId{1, 1}}}}};
  r.p->OnFrameFromConsumer("9:0:1", EncodeWire(pull), At(3));
  r.Check();
  EXPECT_EQ(r.p->stats().unknown_sender, 1u);
  EXPECT_EQ(r.p->stats().pull_items_taken, 0u);
  EXPECT_EQ(r.p->connector().send_table()->live_sends(), 0u);
  r.Run(At(3));
  for (const auto* seen : {&r.d_seen, &r.p_seen}) {
    for (const SessionAction& a : *seen) EXPECT_TRUE(std::holds_alternative<LogLine>(a));
  }
  EXPECT_EQ(r.d->Producer(kPEngine, 0)->state, ProducerState::kUp);
  EXPECT_NE(r.p->ConsumerOf(kD1), nullptr);
}

// Rule: with a token both sides prove it by challenge and response; a D with
// another token never gets its producer up nor its memory opened.
TEST(RankSessionTest, AuthTokenIsProvedBothWaysAndAWrongTokenIsRefused) {
  {
    Rig r(DOptions("secret"), POptions(1, "secret"));
    r.d->Connect(kPEngine, 0, false, At(0));
    r.Run(At(0));
    EXPECT_EQ(r.d->Producer(kPEngine, 0)->state, ProducerState::kUp);
    EXPECT_NE(r.p->ConsumerOf(kD1), nullptr);
    for (int s = 1; s <= 3; ++s) {  // heartbeats keep proving it
      r.d->OnTimer(At(s * 1000));
      r.Run(At(s * 1000));
    }
    EXPECT_EQ(r.d->stats().auth_failed, 0u);
    EXPECT_EQ(r.p->stats().auth_failed, 0u);
    EXPECT_EQ(r.p->stats().handshakes, 1u);
    r.Serve(At(4000));
    r.Load(At(4000), {BlockId{10, 1}});
    r.Run(At(4000));
    r.FinishWrites(At(4000));
    std::vector<LoadDone> done = r.Finished(At(4000));
    ASSERT_EQ(done.size(), 1u);
    EXPECT_TRUE(done[0].ok);
  }
  {
    Rig r(DOptions("other"), POptions(1, "secret"));
    r.d->Connect(kPEngine, 0, false, At(0));
    r.Run(At(0));
    r.d->OnTimer(At(1000));
    r.Run(At(1000));
    EXPECT_GE(r.p->stats().auth_failed, 1u);
    EXPECT_GE(r.d->stats().auth_failed, 1u);
    EXPECT_FALSE(r.d->Producer(kPEngine, 0)->known);
    EXPECT_EQ(r.d->Producer(kPEngine, 0)->state, ProducerState::kConnecting);
    EXPECT_TRUE(Take<ProducerChanged>(r.d_seen).empty());
    EXPECT_EQ(r.p->ConsumerOf(kD1), nullptr);
  }
}

// Rule: P refuses (kRejected) a pull naming a dst block outside the pool the
// D rank registered, before any table sees it.
TEST(RankSessionTest, PullOutsideRegisteredDstPoolIsRejected) {
  Rig r;
  r.Handshake(At(0));
  r.Serve(At(0));
  r.Load(At(0), {BlockId{kDBlocks, 1}});  // one past D's last block
  r.Run(At(0));
  EXPECT_EQ(r.p->stats().pulls_refused_dst, 1u);
  EXPECT_EQ(r.p->stats().pull_items_taken, 0u);
  EXPECT_TRUE(Take<StartWrite>(r.p_seen).empty());
  std::vector<PullAnswered> answered = Take<PullAnswered>(r.d_seen);
  ASSERT_EQ(answered.size(), 1u);
  EXPECT_EQ(answered[0].result, TransferResult::kRejected);
  std::vector<LoadDone> done = r.Finished(At(1));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok);
  EXPECT_EQ(done[0].first_error, TransferResult::kRejected);
}

// Rule: without idle heartbeats, the heartbeat is a deadline only while a
// producer is not up or a load is in flight (the simulator's run can end).
TEST(RankSessionTest, HeartbeatDeadlineOnlyWhileSomethingWaits) {
  RankSessionOptions d = DOptions();
  d.idle_heartbeats = false;
  Rig r(std::move(d));
  EXPECT_FALSE(r.d->WantsHeartbeat());
  EXPECT_FALSE(r.d->NextDeadline().has_value());
  r.d->Connect(kPEngine, 0, false, At(0));
  EXPECT_TRUE(r.d->WantsHeartbeat());  // connecting
  EXPECT_EQ(r.d->NextDeadline(), At(1000));
  r.Run(At(0));
  EXPECT_FALSE(r.d->WantsHeartbeat());  // up and idle
  EXPECT_FALSE(r.d->NextDeadline().has_value());

  r.Serve(At(0));
  r.Load(At(0), {BlockId{10, 1}});
  EXPECT_TRUE(r.d->WantsHeartbeat());
  EXPECT_EQ(r.d->NextDeadline(), At(1000));
  r.Run(At(0));
  r.FinishWrites(At(0));
  ASSERT_EQ(r.Finished(At(0)).size(), 1u);
  EXPECT_FALSE(r.d->WantsHeartbeat());
  EXPECT_FALSE(r.d->NextDeadline().has_value());
}

// Rule: a LoadOp refused because its transfer_id is already loading (a
// collision) must leave the live load alone: its grant and its LoadEnded.
TEST(RankSessionTest, RefusedDuplicateTransferLeavesTheLiveLoadAlone) {
  Rig r;
  r.Handshake(At(0));
  r.Serve(At(0));
  r.Load(At(0), {BlockId{10, 1}});
  r.Run(At(0));  // P started writing block 10 of D
  ASSERT_EQ(r.d->write_grants().count(kT), 1u);
  r.Load(At(1), {BlockId{11, 1}}, kT, RequestId{2, 1});  // same transfer, another request
  std::vector<LoadDone> done = r.Finished(At(1));
  ASSERT_EQ(done.size(), 1u);  // the second one fails at once...
  EXPECT_EQ(done[0].request, (RequestId{2, 1}));
  EXPECT_FALSE(done[0].ok);
  // ...and the first still owns block 10: P may still write it.
  EXPECT_TRUE(Take<RevokeBlocks>(r.d_seen).empty());
  EXPECT_EQ(r.d->write_grants().count(kT), 1u);
  Take<LoadEnded>(r.d_seen);  // the refused one's
  r.FinishWrites(At(2));
  done = r.Finished(At(2));
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].request, kR);
  EXPECT_TRUE(done[0].ok);
  EXPECT_EQ(Take<RevokeBlocks>(r.d_seen).size(), 1u);  // revoked when it ends
  EXPECT_EQ(Take<LoadEnded>(r.d_seen).size(), 1u);     // and observed
}

}  // namespace
}  // namespace kvrelay
