// rank_actor_handshake.cc — RankActor's handshakes: who may talk to this
// rank, with what KV layout and transport, and what it learns from the peer
// (P's registration to write into, or D's region to read from).
//
// Why a file of its own: rank_actor.cc is the loop and the frames;
// rank_actor_jobs.cc moves bytes. A handshake is the one exchange that opens
// a data-plane target or source, checks the shared token (HandshakeAuth) and
// the layouts, and says why a peer was refused.
//
// Thread safety: the rank's thread only, as every RankActor handler.
#include <string>
#include <vector>

#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/os_random.h"
#include "runtime/rank_actor.h"

namespace kvrelay::runtime {

bool RankActor::LayoutMatches(const HandshakeMsg& hs, std::string* why) const {
  const engine::ModelShape& s = options_.shape;
  if (hs.transport != static_cast<uint8_t>(transport_->kind())) {
    *why = std::string("transport differs: peer uses ") +
           net::TransportName(static_cast<net::TransportKind>(hs.transport)) + ", this engine " +
           net::TransportName(transport_->kind());
    return false;
  }
  if (hs.layers != s.layers || hs.kv_heads != s.kv_heads || hs.head_dim != s.head_dim ||
      hs.dtype_bytes != s.dtype_bytes || hs.block_tokens != s.block_tokens) {
    *why = "KV layout differs (model shape)";
    return false;
  }
  if (hs.tp == 0 || hs.tp > engine::kHeadGroups || engine::kHeadGroups % hs.tp != 0 ||
      hs.rank >= hs.tp || hs.num_blocks == 0 || hs.engine_id >= (1u << 28)) {
    *why = "bad tp, rank, engine id or block count";
    return false;
  }
  return true;
}

HandshakeMsg RankActor::OwnHandshake() const {
  HandshakeMsg hs;
  hs.engine_id = options_.engine_id;
  hs.incarnation = options_.incarnation;
  hs.rank = options_.rank;
  hs.tp = options_.tp;
  hs.role = static_cast<uint8_t>(options_.role);
  hs.transport = static_cast<uint8_t>(transport_->kind());
  hs.layers = options_.shape.layers;
  hs.kv_heads = options_.shape.kv_heads;
  hs.head_dim = options_.shape.head_dim;
  hs.dtype_bytes = options_.shape.dtype_bytes;
  hs.block_tokens = options_.shape.block_tokens;
  hs.num_blocks = options_.num_blocks;
  hs.registration = region_->registration();
  return hs;
}

std::vector<uint8_t> RankActor::HelloFor(Conn& c) {
  HandshakeMsg hs = OwnHandshake();
  if (auth_.enabled()) {
    hs.nonce = NonceFromOs();
    challenges_.Issue(c.endpoint, hs.nonce);
    hs.echo = c.peer_nonce;
    auth_.Sign(HandshakeSide::kConsumerHello, &hs);
  }
  return EncodeWire(hs);
}

std::vector<uint8_t> RankActor::ReplyTo(const std::string& identity, const HandshakeMsg& hello) {
  HandshakeMsg hs = OwnHandshake();
  if (auth_.enabled()) {
    hs.nonce = NonceFromOs();
    challenges_.Issue(identity, hs.nonce);
    hs.echo = hello.nonce;
    auth_.Sign(HandshakeSide::kProducerReply, &hs);
  }
  return EncodeWire(hs);
}

void RankActor::OnHandshakeFromD(const std::string& identity, const HandshakeMsg& hs) {
  bool proved = true;
  if (auth_.enabled()) {
    if (!auth_.MacValid(HandshakeSide::kConsumerHello, hs)) {
      ++counters_.auth_failed;
      LogOnce("rank", "auth_hello:" + std::to_string(hs.engine_id),
              "rank " + std::to_string(options_.rank) + ": refused the handshake of D engine " +
                  std::to_string(hs.engine_id) + ": " +
                  (HandshakeAuth::Signed(hs) ? "its MAC does not check (another token?)"
                                             : "it carries no MAC (no --auth-token-file?)"));
      // Answer with our own signed challenge all the same, so D can tell
      // its operator why (it fails to verify us, or sees we require auth).
      SendToD(identity, ReplyTo(identity, hs));
      return;
    }
    // A MAC that checks proves the token only together with a fresh
    // challenge of ours: a replayed hello redeems nothing.
    proved = challenges_.Redeem(identity, hs.echo);
  }
  std::string why;
  if (!LayoutMatches(hs, &why) || hs.role == static_cast<uint8_t>(ConnectorRole::kProducer)) {
    ++counters_.handshake_refused;
    LogOnce("rank", "hs_refused:" + why,
            "rank " + std::to_string(options_.rank) + ": refused a handshake: " +
                (why.empty() ? "peer is prefill-only" : why));
    return;
  }
  const PeerId peer = PeerAddress{hs.engine_id, hs.rank, hs.incarnation}.Id();
  auto it = dpeers_.find(peer.index);
  if (it != dpeers_.end() && it->second.peer.generation > peer.generation) {
    ++counters_.handshake_refused;  // an old incarnation, still talking
    return;
  }
  if (!proved) {
    // The first hello of a D rank (or one that crossed our newest challenge
    // on the wire): challenge it. An identity already proved for this very
    // peer stays registered.
    auto known = index_of_identity_.find(identity);
    const bool registered = known != index_of_identity_.end() && it != dpeers_.end() &&
                            known->second == peer.index && it->second.peer == peer &&
                            it->second.registration == hs.registration;
    if (!registered) {
      SendToD(identity, ReplyTo(identity, hs));
      return;
    }
  }
  if (it == dpeers_.end() || it->second.peer != peer ||
      it->second.registration != hs.registration || it->second.target == nullptr) {
    Result<std::unique_ptr<net::Target>> target = transport_->Open(hs.registration, region_);
    if (!target.ok()) {
      ++counters_.handshake_refused;
      LogOnce("rank", "open:" + target.status().message(),
              "rank " + std::to_string(options_.rank) + ": cannot open D's memory: " +
                  target.status().ToString());
      return;
    }
    if (it != dpeers_.end()) index_of_identity_.erase(it->second.identity);
    DPeer d;
    d.peer = peer;
    d.tp = hs.tp;
    d.rank = hs.rank;
    d.num_blocks = hs.num_blocks;
    d.registration = hs.registration;
    d.target = std::shared_ptr<net::Target>(std::move(*target));
    it = dpeers_.insert_or_assign(peer.index, std::move(d)).first;
    ++counters_.handshakes;
  }
  if (it->second.identity != identity) {
    index_of_identity_.erase(it->second.identity);
    it->second.identity = identity;
  }
  index_of_identity_[identity] = peer.index;
  SendToD(identity, ReplyTo(identity, hs));
}

void RankActor::OnHandshakeFromP(Conn& c, const HandshakeMsg& hs) {
  if (auth_.enabled()) {
    // P must sign its reply and echo a challenge of ours it has not
    // answered before; anything else is not this P, or a replay.
    const bool mac_ok = auth_.MacValid(HandshakeSide::kProducerReply, hs);
    if (!mac_ok || !challenges_.Redeem(c.endpoint, hs.echo)) {
      ++counters_.auth_failed;
      LogOnce("rank", "auth_reply:" + c.endpoint,
              "rank " + std::to_string(options_.rank) + ": refused the handshake of " +
                  c.endpoint + ": " +
                  (!HandshakeAuth::Signed(hs) ? "it carries no MAC (P has no --auth-token-file)"
                   : !mac_ok                  ? "its MAC does not check (another token?)"
                                              : "it answers no challenge of ours (a replay?)"));
      return;
    }
  } else if (HandshakeAuth::Signed(hs)) {
    ++counters_.auth_failed;
    LogOnce("rank", "auth_required:" + c.endpoint,
            "rank " + std::to_string(options_.rank) + ": " + c.endpoint +
                " requires authentication: start this engine with --auth-token-file");
    return;
  }
  std::string why;
  if (!LayoutMatches(hs, &why) || hs.engine_id != c.engine || hs.rank != c.rank ||
      hs.role == static_cast<uint8_t>(ConnectorRole::kConsumer)) {
    ++counters_.handshake_refused;
    LogOnce("rank", "hs_refused_p:" + c.endpoint,
            "rank " + std::to_string(options_.rank) + ": refused the handshake of " +
                c.endpoint + ": " + (why.empty() ? "engine id, rank or role differs" : why));
    return;
  }
  const Instant now = MonoNow();
  const PeerId peer = PeerAddress{hs.engine_id, hs.rank, hs.incarnation}.Id();
  if (c.known && peer.generation < c.peer.generation) return;  // stale
  c.closed_lane_pid = 0;  // a P that answers is alive
  if (!c.known || peer.generation > c.peer.generation) {
    // A P incarnation we did not know: only hellos are in flight to it,
    // so its frames can move to a lane now without passing each other. (A
    // lane opened with the first hello stays; a restarted P needs a new one.)
    if (c.known || c.lane == nullptr) OpenLane(c);
    if (c.known) Log("rank", "P engine %u rank %u restarted (incarnation %u → %u)", c.engine,
                     c.rank, c.peer.generation, peer.generation);
    conn_.SetPeer(c.engine, c.rank, peer, now);
    ++counters_.handshakes;
  } else if (c.state == Conn::kDown || c.state == Conn::kGone) {
    ++counters_.reconnects;
    conn_.Reconnected(peer, now);
  }
  const bool was_up = c.known && c.state == Conn::kUp && c.peer == peer;
  if (options_.mode == KvMode::kRead &&
      (c.source == nullptr || c.registration != hs.registration)) {
    // Read mode: open P's region for reading (again, if P restarted or the
    // last read found it broken). Failing that, reads of this P fail.
    Result<std::unique_ptr<net::Source>> source = transport_->OpenSource(hs.registration, region_);
    if (source.ok()) {
      c.source = std::move(*source);
      c.registration = hs.registration;
    } else {
      c.source.reset();
      LogOnce("rank", "open_source:" + c.endpoint,
              "rank " + std::to_string(options_.rank) + ": cannot open " + c.endpoint +
                  "'s KV for reading: " + source.status().ToString());
    }
  }
  c.tp = hs.tp;
  c.num_blocks = hs.num_blocks;
  c.known = true;
  c.peer = peer;
  c.state = Conn::kUp;
  c.last_heard = now;
  if (auth_.enabled()) {
    c.peer_nonce = hs.nonce;
    // P takes our pulls only once we answered its challenge: answer it now,
    // ahead of any pull on this socket, when the peer is new or came back.
    if (!was_up) SendToP(c, HelloFor(c));
  }
  NotifyKnown();
}

}  // namespace kvrelay::runtime
