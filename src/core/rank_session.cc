#include "core/rank_session.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "base/check.h"

namespace kvrelay {

namespace {

std::string KeyName(uint32_t engine, uint32_t rank) {
  return std::to_string(engine) + ":" + std::to_string(rank);
}

std::string Seconds(Duration d) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f s", d.seconds());
  return s;
}

std::vector<uint32_t> Indices(const std::vector<BlockId>& blocks) {
  std::vector<uint32_t> out;
  out.reserve(blocks.size());
  for (const BlockId& b : blocks) out.push_back(b.index);
  return out;
}

}  // namespace

const char* ProducerStateName(ProducerState s) {
  switch (s) {
    case ProducerState::kConnecting: return "connecting";
    case ProducerState::kUp: return "up";
    case ProducerState::kDown: return "down";
    case ProducerState::kGone: return "gone";
  }
  return "?";
}

namespace {
RankConnectorOptions WithTimings(RankConnectorOptions o, const TransferTimings& t) {
  o.ApplyTimings(t);
  return o;
}
}  // namespace

RankSession::RankSession(RankSessionOptions options)
    : options_(std::move(options)),
      conn_(WithTimings(options_.connector, options_.timings)),
      auth_(options_.auth_token) {
  KV_CHECK(!auth_.enabled() || options_.nonce != nullptr);
  KV_CHECK_GT(options_.timings.heartbeat.ns(), 0);
}

std::string RankSession::Name() const { return "rank " + std::to_string(options_.connector.rank); }

void RankSession::Log(std::string once_key, std::string text) {
  actions_.push_back(LogLine{std::move(once_key), std::move(text)});
}

std::optional<SessionAction> RankSession::PollAction() {
  if (actions_.empty()) return std::nullopt;
  SessionAction a = std::move(actions_.front());
  actions_.pop_front();
  return a;
}

// --- inputs ------------------------------------------------------------------

void RankSession::ApplyMetadata(const ConnectorMetadata& meta, Instant now) {
  for (const LoadOp& l : meta.loads) {
    // A LoadOp the connector refuses (its transfer is another request's
    // live load) must not touch that load's grant or timing: the first
    // request to name a transfer owns it until its own end is reported.
    transfer_of_request_.try_emplace(l.request, l.transfer);
    if (owner_of_transfer_.try_emplace(l.transfer, l.request).second) {
      load_started_[l.transfer] = now;
    }
  }
  conn_.ApplyMetadata(meta, now);
  Pump(now);
}

void RankSession::Connect(uint32_t engine, uint32_t rank, bool same_host, Instant now) {
  auto [it, inserted] = producers_.try_emplace({engine, rank});
  if (!inserted) return;
  ProducerPeer& p = it->second;
  p.engine = engine;
  p.rank = rank;
  p.same_host = same_host;
  p.last_heard = now;
  if (same_host) {
    p.lane = true;
    actions_.push_back(OpenLane{engine, rank});
  }
  SendHello(p);
  if (!heartbeat_started_) {
    heartbeat_started_ = true;
    next_heartbeat_ = now + options_.timings.heartbeat;
  }
}

bool RankSession::Decode(std::span<const uint8_t> frame, WireMessage* out) {
  ++stats_.frames_in;
  Result<WireMessage> decoded = DecodeWire(frame, options_.limits);
  if (!decoded.ok()) {
    ++stats_.malformed;
    if (std::optional<WireLimit> over = WireLimitOf(decoded.status())) {
      ++stats_.over_limit[static_cast<size_t>(*over)];
    }
    Log("malformed:" + std::string(StatusCodeName(decoded.status().code())),
        Name() + ": dropped a malformed control frame: " + decoded.status().ToString());
    return false;
  }
  *out = std::move(*decoded);
  return true;
}

void RankSession::OnFrameFromConsumer(const std::string& identity,
                                      std::span<const uint8_t> frame, Instant now) {
  WireMessage m;
  if (!Decode(frame, &m)) return;
  if (auto* hs = std::get_if<HandshakeMsg>(&m)) {
    OnHello(identity, *hs, now);
    Pump(now);
    return;
  }
  if (std::holds_alternative<HeartbeatMsg>(m)) return;
  // From a D rank: only pulls and read-mode messages, only after a handshake.
  auto it = index_of_identity_.find(identity);
  if (it == index_of_identity_.end()) {
    if (auth_.enabled()) {
      // Not proved (or never handshook): no answer, nothing learned.
      if (auto* pull = std::get_if<PullMsg>(&m)) {
        stats_.pulls_refused_unauthenticated += pull->items.size();
      }
    }
    ++stats_.unknown_sender;
    Log("unknown_sender", "dropped a message from a D rank that never handshook");
    return;
  }
  const ConsumerPeer& d = consumers_.at(it->second);
  const uint64_t stale_before = conn_.stats().stale_incarnation;
  if (auto* pull = std::get_if<PullMsg>(&m); pull && pull->to_incarnation != options_.self.incarnation) {
    // Sent to this rank's previous life (D has failed it, or will when it
    // sees this one's reply): writing it could land in blocks D freed.
    ++stats_.pulls_misaddressed;
    Log("misaddressed", Name() + ": dropped a pull meant for incarnation " +
                            std::to_string(pull->to_incarnation) + " (this one is " +
                            std::to_string(options_.self.incarnation) + ")");
    return;
  }
  if (auto* pull = std::get_if<PullMsg>(&m)) {
    // Destination blocks must lie inside the pool this D rank registered:
    // such an item is refused now, before any table sees it.
    auto outside = [&d](const PullItem& item) {
      return std::any_of(item.dst.begin(), item.dst.end(),
                         [&d](const BlockId& b) { return b.index >= d.num_blocks; });
    };
    if (std::any_of(pull->items.begin(), pull->items.end(), outside)) {
      std::vector<PullItem> kept;
      for (PullItem& item : pull->items) {
        if (!outside(item)) {
          kept.push_back(std::move(item));
          continue;
        }
        ++stats_.pulls_refused_dst;
        Log("dst_out_of_region",
            Name() + ": refused a pull naming blocks outside the region D registered");
        actions_.push_back(FrameToConsumer{
            identity, EncodeWire(AnswerMsg{pull->pull_seq, item.transfer,
                                           TransferResult::kRejected})});
      }
      pull->items = std::move(kept);
      if (pull->items.empty()) return;
    }
    const size_t items = pull->items.size();
    conn_.OnMessage(d.peer, PeerMessage(std::move(*pull)), now);
    if (conn_.stats().stale_incarnation == stale_before) stats_.pull_items_taken += items;
  } else if (auto* lease = std::get_if<LeaseMsg>(&m)) {
    conn_.OnMessage(d.peer, PeerMessage(*lease), now);
  } else if (auto* notice = std::get_if<NoticeMsg>(&m)) {
    conn_.OnMessage(d.peer, PeerMessage(*notice), now);
  } else {
    ++stats_.malformed;  // an answer, grant or revoke sent to a P rank
  }
  Pump(now);
}

void RankSession::OnFrameFromProducer(uint32_t engine, uint32_t rank,
                                      std::span<const uint8_t> frame, Instant now) {
  WireMessage m;
  if (!Decode(frame, &m)) return;
  auto it = producers_.find({engine, rank});
  if (it == producers_.end()) {
    ++stats_.unknown_sender;  // a connection this rank never opened
    return;
  }
  ProducerPeer& p = it->second;
  if (auto* hs = std::get_if<HandshakeMsg>(&m)) {
    OnReply(p, *hs, now);
    Pump(now);
    return;
  }
  if (std::holds_alternative<HeartbeatMsg>(m)) return;
  if (!p.known) {
    ++stats_.unknown_sender;
    return;
  }
  if (auto* a = std::get_if<AnswerMsg>(&m)) {
    ++stats_.answers_received;
    auto sent = pull_sent_.find({a->transfer, a->pull_seq});
    if (sent != pull_sent_.end()) {
      if (!LoadTable::IsReleaseSeq(a->pull_seq)) {
        actions_.push_back(PullAnswered{a->transfer, sent->second.blocks,
                                        (now - sent->second.at).seconds(), a->result});
      }
      pull_sent_.erase(sent);
    }
    conn_.OnMessage(p.peer, PeerMessage(*a), now);
  } else if (auto* g = std::get_if<GrantMsg>(&m)) {
    if (auto sent = lease_sent_.find({g->transfer, p.peer.index}); sent != lease_sent_.end()) {
      if (!g->src.empty()) sent->second.blocks = static_cast<uint32_t>(g->src.size());
    }
    conn_.OnMessage(p.peer, PeerMessage(std::move(*g)), now);
  } else if (auto* r = std::get_if<RevokeMsg>(&m)) {
    conn_.OnMessage(p.peer, PeerMessage(*r), now);
  } else {
    ++stats_.malformed;  // a pull, lease or notice sent to a D rank
  }
  Pump(now);
}

void RankSession::OnReconnected(uint32_t engine, uint32_t rank, Instant now) {
  auto it = producers_.find({engine, rank});
  if (it == producers_.end() || !it->second.known) return;
  if (it->second.state == ProducerState::kGone) {
    // A connection is no proof that this incarnation lives (a successor may
    // listen there): only its own reply brings it back.
    SendHello(it->second);
    Pump(now);
    return;
  }
  ++stats_.reconnects;
  conn_.Reconnected(it->second.peer, now);
  SendHello(it->second);
  Pump(now);
}

void RankSession::OnLaneClosed(uint32_t engine, uint32_t rank, bool process_gone, Instant now) {
  auto it = producers_.find({engine, rank});
  if (it == producers_.end()) return;
  it->second.lane = false;
  if (process_gone && it->second.known && !it->second.loads_failed) {
    ++stats_.peers_exited;
    DeclareGone(it->second, now, "exited (its local lane closed, its process is gone)",
                /*proven=*/true);
  }
  Pump(now);
}

void RankSession::OnTargetBroken(PeerId peer) {
  auto it = consumers_.find(peer.index);
  if (it != consumers_.end() && it->second.peer == peer) it->second.target_open = false;
}

void RankSession::OnSourceBroken(uint32_t engine, uint32_t rank) {
  auto it = producers_.find({engine, rank});
  if (it == producers_.end()) return;
  it->second.source_open = false;
  it->second.registration.clear();
}

void RankSession::OnWriteDone(WriteId write, bool ok, Instant now) {
  conn_.OnWriteDone(write, ok, now);
  Pump(now);
}

void RankSession::OnReadDone(ReadId read, bool ok, Instant now) {
  conn_.OnReadDone(read, ok, now);
  Pump(now);
}

void RankSession::OnTimer(Instant now) {
  if (auto d = conn_.NextDeadline(); d && *d <= now) conn_.OnTimer(now);
  if (heartbeat_started_ && now >= next_heartbeat_ &&
      (options_.idle_heartbeats || WantsHeartbeat())) {
    Heartbeat(now);
  }
  Pump(now);
}

bool RankSession::WantsHeartbeat() const {
  if (!heartbeat_started_) return false;
  if (const LoadTable* l = conn_.load_table(); l != nullptr && l->live_loads() != 0) return true;
  if (const ReadLoadTable* l = conn_.read_table(); l != nullptr && l->live_loads() != 0) {
    return true;
  }
  for (const auto& [key, p] : producers_) {
    if (p.state != ProducerState::kUp) return true;
  }
  return false;
}

std::optional<Instant> RankSession::NextDeadline() const {
  std::optional<Instant> d = conn_.NextDeadline();
  if (heartbeat_started_ && (options_.idle_heartbeats || WantsHeartbeat())) {
    d = d ? std::min(*d, next_heartbeat_) : next_heartbeat_;
  }
  return d;
}

// --- handshakes --------------------------------------------------------------

bool RankSession::LayoutMatches(const HandshakeMsg& hs, std::string* why) const {
  const HandshakeMsg& s = options_.self;
  if (hs.transport != s.transport) {
    *why = "transport differs";
    return false;
  }
  if (hs.layers != s.layers || hs.kv_heads != s.kv_heads || hs.head_dim != s.head_dim ||
      hs.dtype_bytes != s.dtype_bytes || hs.block_tokens != s.block_tokens) {
    *why = "KV layout differs (model shape)";
    return false;
  }
  if (hs.tp == 0 || hs.tp > options_.max_tp || options_.max_tp % hs.tp != 0 ||
      hs.rank >= hs.tp || hs.rank >= kMaxRanksPerEngine || hs.num_blocks == 0 ||
      hs.engine_id >= (1u << 28)) {
    *why = "bad tp, rank, engine id or block count";
    return false;
  }
  return true;
}

void RankSession::SendHello(ProducerPeer& p) {
  HandshakeMsg hs = options_.self;
  if (auth_.enabled()) {
    hs.nonce = options_.nonce();
    challenges_.Issue(KeyName(p.engine, p.rank), hs.nonce);
    hs.echo = p.peer_nonce;
    auth_.Sign(HandshakeSide::kConsumerHello, &hs);
  }
  actions_.push_back(FrameToProducer{p.engine, p.rank, EncodeWire(hs)});
}

void RankSession::SendReply(const std::string& identity, const HandshakeMsg& hello) {
  HandshakeMsg hs = options_.self;
  if (auth_.enabled()) {
    hs.nonce = options_.nonce();
    challenges_.Issue(identity, hs.nonce);
    hs.echo = hello.nonce;
    auth_.Sign(HandshakeSide::kProducerReply, &hs);
  }
  actions_.push_back(FrameToConsumer{identity, EncodeWire(hs)});
}

// P: a D rank's hello (also its heartbeat).
void RankSession::OnHello(const std::string& identity, const HandshakeMsg& hs, Instant now) {
  bool proved = true;
  if (auth_.enabled()) {
    if (!auth_.MacValid(HandshakeSide::kConsumerHello, hs)) {
      ++stats_.auth_failed;
      Log("auth_hello:" + std::to_string(hs.engine_id),
          Name() + ": refused the handshake of D engine " + std::to_string(hs.engine_id) + ": " +
              (HandshakeAuth::Signed(hs) ? "its MAC does not check (another token?)"
                                         : "it carries no MAC (no --auth-token-file?)"));
      // Answer with our own signed challenge all the same, so D can tell
      // its operator why (it fails to verify us, or sees we require auth).
      SendReply(identity, hs);
      return;
    }
    // A MAC that checks proves the token only together with a fresh
    // challenge of ours: a replayed hello redeems nothing.
    proved = challenges_.Redeem(identity, hs.echo);
  }
  std::string why;
  if (!LayoutMatches(hs, &why) || hs.role == static_cast<uint8_t>(ConnectorRole::kProducer)) {
    ++stats_.handshake_refused;
    Log("hs_refused:" + why,
        Name() + ": refused a handshake: " + (why.empty() ? "peer is prefill-only" : why));
    return;
  }
  const PeerId peer = PeerAddress{hs.engine_id, hs.rank, hs.incarnation}.Id();
  auto it = consumers_.find(peer.index);
  if (it != consumers_.end() && it->second.peer.generation > peer.generation) {
    ++stats_.handshake_refused;  // an old incarnation, still talking
    ++stats_.stale_handshakes;
    return;
  }
  const bool registered = it != consumers_.end() && it->second.peer == peer &&
                          it->second.registration == hs.registration;
  if (!proved) {
    // The first hello of a D rank (or one that crossed our newest challenge
    // on the wire): challenge it. An identity already proved for this very
    // peer stays registered.
    auto known = index_of_identity_.find(identity);
    if (!(registered && known != index_of_identity_.end() && known->second == peer.index)) {
      SendReply(identity, hs);
      return;
    }
  }
  if (!registered || !it->second.target_open) {
    // Its memory must open before P takes its pulls: OnTargetOpened goes on.
    opening_[peer.index] = {identity, hs};
    actions_.push_back(OpenTarget{peer, hs.registration});
    return;
  }
  if (it->second.identity != identity) {
    index_of_identity_.erase(it->second.identity);
    it->second.identity = identity;
  }
  index_of_identity_[identity] = peer.index;
  SendReply(identity, hs);
  (void)now;
}

void RankSession::OnTargetOpened(PeerId peer, bool ok, const std::string& why, Instant now) {
  auto pending = opening_.find(peer.index);
  if (pending == opening_.end()) return;
  auto [identity, hs] = std::move(pending->second);
  opening_.erase(pending);
  if (PeerAddress{hs.engine_id, hs.rank, hs.incarnation}.Id() != peer) return;
  if (!ok) {
    ++stats_.handshake_refused;
    Log("open:" + why, Name() + ": cannot open D's memory: " + why);
    return;
  }
  auto it = consumers_.find(peer.index);
  if (it != consumers_.end()) index_of_identity_.erase(it->second.identity);
  ConsumerPeer d;
  d.identity = identity;
  d.peer = peer;
  d.tp = hs.tp;
  d.rank = hs.rank;
  d.num_blocks = hs.num_blocks;
  d.registration = hs.registration;
  d.target_open = true;
  consumers_.insert_or_assign(peer.index, std::move(d));
  index_of_identity_[identity] = peer.index;
  ++stats_.handshakes;
  SendReply(identity, hs);
  Pump(now);
}

// D: P rank p's reply to a hello: the liveness proof and the incarnation.
void RankSession::OnReply(ProducerPeer& p, const HandshakeMsg& hs, Instant now) {
  const std::string key = KeyName(p.engine, p.rank);
  if (auth_.enabled()) {
    // P must sign its reply and echo a challenge of ours it has not
    // answered before; anything else is not this P, or a replay.
    const bool mac_ok = auth_.MacValid(HandshakeSide::kProducerReply, hs);
    if (!mac_ok || !challenges_.Redeem(key, hs.echo)) {
      ++stats_.auth_failed;
      Log("auth_reply:" + key,
          Name() + ": refused the handshake of P engine " + std::to_string(p.engine) +
              " rank " + std::to_string(p.rank) + ": " +
              (!HandshakeAuth::Signed(hs) ? "it carries no MAC (P has no --auth-token-file)"
               : !mac_ok                  ? "its MAC does not check (another token?)"
                                          : "it answers no challenge of ours (a replay?)"));
      return;
    }
  } else if (HandshakeAuth::Signed(hs)) {
    ++stats_.auth_failed;
    Log("auth_required:" + key, Name() + ": P engine " + std::to_string(p.engine) +
                                    " requires authentication: start this engine with "
                                    "--auth-token-file");
    return;
  }
  std::string why;
  if (!LayoutMatches(hs, &why) || hs.engine_id != p.engine || hs.rank != p.rank ||
      hs.role == static_cast<uint8_t>(ConnectorRole::kConsumer)) {
    ++stats_.handshake_refused;
    Log("hs_refused_p:" + key,
        Name() + ": refused the handshake of P engine " + std::to_string(p.engine) + " rank " +
            std::to_string(p.rank) + ": " + (why.empty() ? "engine id, rank or role differs" : why));
    return;
  }
  const PeerId peer = PeerAddress{hs.engine_id, hs.rank, hs.incarnation}.Id();
  if (p.known && peer.generation < p.peer.generation) {
    ++stats_.stale_handshakes;  // a frame of a process already replaced
    return;
  }
  const bool was_up = p.known && p.state == ProducerState::kUp && p.peer == peer;
  if (!p.known || peer.generation > p.peer.generation) {
    // An incarnation not known before: only hellos are in flight to it, so
    // its frames may move to a lane now without passing each other. (A lane
    // opened at Connect stays; a restarted P needs a new one.)
    if (p.same_host && (p.known || !p.lane)) {
      p.lane = true;
      actions_.push_back(OpenLane{p.engine, p.rank});
    }
    if (p.known) {
      Log("", Name() + ": P engine " + std::to_string(p.engine) + " rank " +
                  std::to_string(p.rank) + " restarted (incarnation " +
                  std::to_string(p.peer.generation) + " → " + std::to_string(peer.generation) +
                  ")");
    }
    conn_.SetPeer(p.engine, p.rank, peer, now);
    ++stats_.handshakes;
  } else if (p.state == ProducerState::kDown || p.state == ProducerState::kGone) {
    ++stats_.reconnects;
    conn_.Reconnected(peer, now);
  }
  if (options_.connector.mode == KvMode::kRead &&
      (!p.source_open || p.registration != hs.registration)) {
    // Read mode: open P's region for reading (again, if P restarted or the
    // last read found it broken).
    p.source_open = true;
    actions_.push_back(OpenSource{p.engine, p.rank, hs.registration});
  }
  p.registration = hs.registration;
  p.tp = hs.tp;
  p.num_blocks = hs.num_blocks;
  p.known = true;
  p.peer = peer;
  p.last_heard = now;
  p.silent_since.reset();
  if (!was_up) SetState(p, ProducerState::kUp, "answered");
  if (auth_.enabled()) {
    p.peer_nonce = hs.nonce;
    // P takes our pulls only once we answered its challenge: answer it now,
    // ahead of any pull on this connection, when the peer is new or came back.
    if (!was_up) SendHello(p);
  }
}

// --- liveness ----------------------------------------------------------------

void RankSession::SetState(ProducerPeer& p, ProducerState s, const std::string& why) {
  p.state = s;
  if (s != ProducerState::kGone) p.loads_failed = false;
  actions_.push_back(ProducerChanged{p.engine, p.rank, p.peer, s, why});
}

void RankSession::Heartbeat(Instant now) {
  // A loop that ran no heartbeat for as long as a peer is given to answer
  // (a driver that skips idle ticks, or a stalled process) sent no hellos:
  // that silence is ours, not the peers', and counting starts afresh. A
  // timer merely late (by less than that) still counts: resetting on every
  // late tick would let a busy loop never find a dead peer.
  const Instant last_heartbeat = next_heartbeat_ - options_.timings.heartbeat;
  const bool resumed = now - last_heartbeat > options_.timings.peer_down_after;
  next_heartbeat_ = now + options_.timings.heartbeat;
  for (auto& [key, p] : producers_) {
    if (resumed) p.silent_since.reset();
    SendHello(p);
    if (!p.known) continue;
    if (!p.silent_since) p.silent_since = now;
    const Duration silent = now - *p.silent_since;
    if (p.state == ProducerState::kUp && silent > options_.timings.peer_down_after) {
      ++stats_.peers_down;
      SetState(p, ProducerState::kDown, "silent for " + Seconds(silent));
    }
    if (p.state == ProducerState::kDown && silent > options_.timings.peer_dead_after) {
      DeclareGone(p, now, "silent for " + Seconds(silent), /*proven=*/false);
    }
  }
}

// The one place a P incarnation is declared gone: its loads fail now (and
// recompute or fail by policy), and a new load naming it fails until it
// answers again.
void RankSession::DeclareGone(ProducerPeer& p, Instant now, const std::string& why,
                              bool proven) {
  if (!p.known) return;
  const bool fail = proven || options_.silence_fails_loads;
  if (p.state != ProducerState::kGone) {
    ++stats_.peers_gone;
    SetState(p, ProducerState::kGone, why);
  } else if (!fail || p.loads_failed) {
    return;  // gone already; nothing new proven
  }
  // Gone by silence on a transport that cannot refuse late writes, then
  // proven dead: its loads in flight fail now.
  p.loads_failed = fail;
  conn_.PeerGone(p.peer, now, fail);
}

// --- actions -----------------------------------------------------------------

void RankSession::Pump(Instant now) {
  while (auto a = conn_.PollAction()) {
    if (auto* out = std::get_if<OutMessage>(&*a)) {
      SendOut(std::move(*out), now);
    } else if (auto* read = std::get_if<StartRead>(&*a)) {
      actions_.push_back(std::move(*read));
    } else {
      actions_.push_back(std::move(std::get<StartWrite>(*a)));
    }
  }
}

void RankSession::Revoke(TransferId t) {
  auto g = granted_.find(t);
  if (g == granted_.end()) return;
  ++stats_.revokes;
  actions_.push_back(RevokeBlocks{GrantKind::kWrite, t, std::move(g->second)});
  granted_.erase(g);
}

void RankSession::SendOut(OutMessage out, Instant now) {
  const PeerAddress to = PeerAddress::Of(out.to);
  if (std::holds_alternative<PullMsg>(out.msg) || std::holds_alternative<LeaseMsg>(out.msg) ||
      std::holds_alternative<NoticeMsg>(out.msg)) {
    // D → P.
    auto it = producers_.find({to.engine, to.rank});
    if (it == producers_.end() || !it->second.known || it->second.peer != out.to) {
      ++stats_.unroutable;  // that P incarnation is gone; the tables know
      return;
    }
    if (auto* pull = std::get_if<PullMsg>(&out.msg)) {
      pull->to_incarnation = out.to.generation;
      for (const PullItem& item : pull->items) {
        if (item.dst.empty()) {  // a release: P will not write it any more
          Revoke(item.transfer);
          continue;
        }
        std::vector<uint32_t> blocks = Indices(item.dst);
        ++stats_.grants;
        actions_.push_back(GrantBlocks{GrantKind::kWrite, item.transfer, blocks});
        granted_[item.transfer] = std::move(blocks);
        pull_sent_.try_emplace({item.transfer, pull->pull_seq},
                               PullSent{now, static_cast<uint32_t>(item.dst.size())});
        ++stats_.pulls_sent;
      }
    }
    WireMessage msg;
    if (auto* pull = std::get_if<PullMsg>(&out.msg)) {
      msg = std::move(*pull);
    } else if (auto* lease = std::get_if<LeaseMsg>(&out.msg)) {
      lease_sent_.try_emplace({lease->transfer, out.to.index}, PullSent{now, 0});
      msg = *lease;
    } else {
      const NoticeMsg& notice = std::get<NoticeMsg>(out.msg);
      auto sent = lease_sent_.find({notice.transfer, out.to.index});
      if (sent != lease_sent_.end()) {
        if (notice.notice != ReadNotice::kRelease) {
          actions_.push_back(PullAnswered{
              notice.transfer, sent->second.blocks, (now - sent->second.at).seconds(),
              notice.notice == ReadNotice::kDone ? TransferResult::kOk
                                                 : TransferResult::kWriteFailed});
        }
        lease_sent_.erase(sent);
      }
      msg = notice;
    }
    actions_.push_back(FrameToProducer{to.engine, to.rank, EncodeWire(msg)});
    return;
  }
  // P → D: an answer, a grant or a revoke.
  auto it = consumers_.find(out.to.index);
  if (it == consumers_.end() || it->second.peer != out.to) {
    ++stats_.unroutable;
    return;
  }
  WireMessage msg;
  if (auto* g = std::get_if<GrantMsg>(&out.msg)) {
    if (g->answer == LeaseAnswer::kGranted && read_granted_.count(g->transfer) == 0) {
      std::vector<uint32_t> blocks = Indices(g->src);
      ++stats_.grants;
      actions_.push_back(GrantBlocks{GrantKind::kRead, g->transfer, blocks});
      read_granted_.emplace(g->transfer, std::move(blocks));
    }
    msg = std::move(*g);
  } else if (auto* r = std::get_if<RevokeMsg>(&out.msg)) {
    msg = *r;
  } else {
    msg = std::get<AnswerMsg>(out.msg);
  }
  actions_.push_back(FrameToConsumer{it->second.identity, EncodeWire(msg)});
}

RankReport RankSession::GetFinished(Instant now) {
  RankReport r = conn_.GetFinished();
  auto forget_pulls = [&](TransferId t) {
    pull_sent_.erase(pull_sent_.lower_bound({t, 0}), pull_sent_.upper_bound({t, UINT64_MAX}));
    lease_sent_.erase(lease_sent_.lower_bound({t, 0}), lease_sent_.upper_bound({t, UINT32_MAX}));
  };
  // The end of `request`'s load of `transfer`: its grant goes, unless the
  // transfer is another request's (a refused duplicate).
  auto ended = [&](RequestId request, TransferId t, std::optional<bool> ok) {
    auto named = transfer_of_request_.find(request);
    if (named != transfer_of_request_.end() && named->second == t) {
      transfer_of_request_.erase(named);
    }
    auto owner = owner_of_transfer_.find(t);
    if (owner == owner_of_transfer_.end() || owner->second != request) return;
    owner_of_transfer_.erase(owner);
    Revoke(t);
    forget_pulls(t);
    auto started = load_started_.find(t);
    if (started != load_started_.end()) {
      if (ok) actions_.push_back(LoadEnded{(now - started->second).seconds(), *ok});
      load_started_.erase(started);
    }
  };
  for (const LoadDone& d : r.finished_recving) ended(d.request, d.transfer, d.ok);
  for (const TransferId& t : r.finished_sending) {
    // Read mode: the lease ended; no more reads of it.
    auto g = read_granted_.find(t);
    if (g != read_granted_.end()) {
      ++stats_.revokes;
      actions_.push_back(RevokeBlocks{GrantKind::kRead, t, std::move(g->second)});
      read_granted_.erase(g);
    }
  }
  for (const RequestId& id : r.released) {
    auto it = transfer_of_request_.find(id);
    if (it != transfer_of_request_.end()) ended(id, it->second, std::nullopt);
  }
  return r;
}

// --- views -------------------------------------------------------------------

const ProducerPeer* RankSession::Producer(uint32_t engine, uint32_t rank) const {
  auto it = producers_.find({engine, rank});
  return it == producers_.end() ? nullptr : &it->second;
}

bool RankSession::CanLoadFrom(uint32_t engine, uint32_t rank) const {
  const ProducerPeer* p = Producer(engine, rank);
  return p != nullptr && p->known && p->state != ProducerState::kGone;
}

const ProducerPeer* RankSession::ProducerOf(PeerId peer) const {
  const PeerAddress at = PeerAddress::Of(peer);
  const ProducerPeer* p = Producer(at.engine, at.rank);
  return p != nullptr && p->known && p->peer == peer ? p : nullptr;
}

const ConsumerPeer* RankSession::ConsumerOf(PeerId peer) const {
  auto it = consumers_.find(peer.index);
  return it != consumers_.end() && it->second.peer == peer ? &it->second : nullptr;
}

void RankSession::CheckInvariants() const {
  conn_.CheckInvariants();
  for (const auto& [key, p] : producers_) {
    KV_CHECK(key == std::make_pair(p.engine, p.rank));
    // Only a known incarnation can be up, down or gone.
    KV_CHECK(p.known || p.state == ProducerState::kConnecting);
    if (p.known) {
      KV_CHECK(PeerAddress::Of(p.peer).engine == p.engine);
      KV_CHECK(PeerAddress::Of(p.peer).rank == p.rank);
    }
    KV_CHECK(!p.lane || p.same_host);
    KV_CHECK(!p.loads_failed || p.state == ProducerState::kGone);
  }
  for (const auto& [identity, index] : index_of_identity_) {
    auto it = consumers_.find(index);
    KV_CHECK(it != consumers_.end());
    KV_CHECK(it->second.identity == identity);
    KV_CHECK(it->second.peer.index == index);
  }
  // A grant and a load start exist only for a transfer some request owns
  // (its end not yet reported); an owner names its transfer.
  KV_CHECK_LE(granted_.size(), owner_of_transfer_.size());
  KV_CHECK_LE(load_started_.size(), owner_of_transfer_.size());
  for (const auto& [t, request] : owner_of_transfer_) {
    auto it = transfer_of_request_.find(request);
    KV_CHECK(it != transfer_of_request_.end() && it->second == t);
  }
}

}  // namespace kvrelay
