// rank_session.h — RankSession: one rank's control-channel protocol, pure.
//
// Why: the send, load and lease tables decide a transfer's life, but who a
// rank talks to decides whether their answers mean anything: which process
// of a peer is the live one (incarnations), when a silent peer is down and
// when it is gone (so its loads fail now rather than at a timeout), whether
// a handshake proves the shared token, which destination blocks a transfer
// may be written into (grants), and when a same-host lane may carry frames.
// Those rules go wrong in the field (restarts, reconnects, stale frames), so
// they live here, under the simulator, and the runtime's RankActor only
// moves bytes between sockets and this class.
//
// Theory of operation
// -------------------
// A session wraps the rank's RankConnector and a peer table:
//
//   D side: one Producer per P rank (engine, rank) it pulls from, with a
//     state  CONNECTING → UP ⇄ DOWN → GONE  (GONE → UP again on a reply of
//     the same incarnation, which proves the peer alive after all; a newer
//     incarnation replaces the peer whatever the state). Every heartbeat D
//     sends each producer a hello (a Handshake); P's reply is the liveness
//     proof. Silence is counted from the first hello after the last reply
//     (afresh after a gap of peer_down_after between two heartbeats: a
//     stalled or idle loop's own silence; timers late by less still count):
//     past peer_down_after the peer is DOWN, past peer_dead_after GONE (a
//     new load naming it fails until it answers again; its loads in flight
//     fail now where the transport refuses late writes, else they wait for
//     an answer or their give-up time: silence_fails_loads).
//     A reply with a newer incarnation proves the old process gone
//     (RankConnector::SetPeer fails its pulls); one with an older
//     incarnation is a stale frame and is dropped. The lane closing with the
//     process gone (OnLaneClosed) makes it GONE at once, its loads failed.
//   P side: one Consumer per D rank (peer index), registered by a hello
//     whose layout matches, whose incarnation is not older than the one
//     registered, and — with a token — that proved it (HandshakeAuth). Its
//     destination memory is opened by the driver (OpenTarget →
//     OnTargetOpened) before P replies. Pulls are taken only from a
//     registered identity and only for blocks inside its registered pool.
//
// Grants: on D, a pull's destination blocks are granted to its transfer
// when the pull goes out (GrantBlocks), and revoked when a release goes out
// for it, when its load ends, and when it is released (RevokeBlocks); a
// transport that checks grants (tcp) refuses any other write. On P in read
// mode, a granted lease's source blocks are granted for reading and revoked
// when the lease ends.
//
// Lanes (D): a lane to a same-host P rank is opened only while no
// incarnation of it is known — at Connect, or when a new incarnation
// replaces a known one — so frames on the lane and on ZeroMQ never pass
// each other. The driver picks the path of each frame.
//
// Effects go out as values (PollAction): frames, memory to open, grants,
// state changes and log lines. Frames come in as bytes and are decoded here
// with WireLimits; a frame that does not decode is counted and dropped.
//
// Invariants (CheckInvariants): a producer known has an incarnation and a
// producer GONE was known; a consumer's identity maps back to it; every
// granted transfer has a live load or an unanswered release; the
// connector's own invariants.
//
// Ownership and threading: one per rank, owned by its driver (RankActor, or
// the simulator) and called from one thread. Pure: no I/O, no clock (`now`
// comes in), no randomness but the nonce source the driver passes.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/handshake_auth.h"
#include "core/rank_connector.h"
#include "core/wire.h"

namespace kvrelay {

struct RankSessionOptions {
  RankConnectorOptions connector;   // role, rank, tp, mode (times: `timings`)
  TransferTimings timings;          // the tables' times and the heartbeat's
  // This rank's own handshake: engine id, incarnation, rank, tp, role,
  // transport, KV layout, pool size and registration. Nonce, echo and MAC
  // are set per message. A peer's layout must equal it field for field.
  HandshakeMsg self;
  uint32_t max_tp = 4;              // a peer's tp divides this (head groups)
  WireLimits limits;
  std::string auth_token;           // empty: no authentication
  // Heartbeats run whether or not anything waits on a producer (the
  // runtime). false: NextDeadline() names the next heartbeat only while
  // WantsHeartbeat() (the simulator, whose run ends when its queue does).
  bool idle_heartbeats = true;
  // A P rank gone for its silence may be alive behind a partition, still
  // writing. true (tcp: the receiver refuses writes outside the grants, and
  // D revokes them first): its loads fail now. false (shm, ucx: a late write
  // would land): only new loads naming it fail; the loads in flight wait
  // for its answer or their give-up time. A P proven dead (its successor
  // answered, or its lane closed with its process gone) fails them now
  // either way.
  bool silence_fails_loads = true;
  // Fresh nonces for challenges (the runtime: getrandom; the simulator: its
  // seeded PRNG). Needed only with a token.
  std::function<HandshakeNonce()> nonce;
};

enum class ProducerState : uint8_t { kConnecting, kUp, kDown, kGone };
const char* ProducerStateName(ProducerState s);

// D: one P rank this rank pulls from.
struct ProducerPeer {
  uint32_t engine = 0, rank = 0;
  ProducerState state = ProducerState::kConnecting;
  bool known = false;                // an incarnation answered
  PeerId peer;                       // the incarnation known
  uint32_t tp = 1, num_blocks = 0;   // from its handshake
  std::vector<uint8_t> registration;
  bool source_open = false;          // read mode: its region is open for reading
  bool same_host = false;            // a lane may reach it
  bool lane = false;                 // a lane was opened and has not broken
  bool loads_failed = false;         // GONE, and its loads in flight were failed
  Instant last_heard;
  std::optional<Instant> silent_since;  // first hello after the last reply
  HandshakeNonce peer_nonce{};       // P's latest challenge, echoed next
};

// P: one D rank that handshook.
struct ConsumerPeer {
  std::string identity;              // the driver's name of its connection
  PeerId peer;
  uint32_t tp = 1, rank = 0, num_blocks = 0;
  std::vector<uint8_t> registration;
  bool target_open = false;          // its memory is open for writing
};

// --- actions ------------------------------------------------------------------

struct FrameToProducer {  // D → P rank (engine, rank)
  uint32_t engine = 0, rank = 0;
  std::vector<uint8_t> frame;
};
struct FrameToConsumer {  // P → the D rank behind `identity`
  std::string identity;
  std::vector<uint8_t> frame;
};
// P: open D's memory for writing; answer with OnTargetOpened before giving
// the session its next input: P registers D (and replies) only once it is
// open, so a pull of that D read meanwhile would find it unknown.
struct OpenTarget {
  PeerId peer;
  std::vector<uint8_t> registration;
};
// D, read mode: open P rank (engine, rank)'s region for reading; a failure
// (now or on a read) is told with OnSourceBroken.
struct OpenSource {
  uint32_t engine = 0, rank = 0;
  std::vector<uint8_t> registration;
};
// D: open a lane to P rank (engine, rank), replacing any old one; a failure
// is told with OnLaneClosed.
struct OpenLane {
  uint32_t engine = 0, rank = 0;
};
enum class GrantKind : uint8_t { kWrite, kRead };
struct GrantBlocks {
  GrantKind kind = GrantKind::kWrite;
  TransferId transfer;
  std::vector<uint32_t> blocks;
};
struct RevokeBlocks {
  GrantKind kind = GrantKind::kWrite;
  TransferId transfer;
  std::vector<uint32_t> blocks;
};
// D: P rank (engine, rank) changed state (up with `peer`, down, gone).
struct ProducerChanged {
  uint32_t engine = 0, rank = 0;
  PeerId peer;
  ProducerState state = ProducerState::kUp;
  std::string why;
};
// Observations for metrics (D): one answer to a pull of `blocks` blocks,
// `seconds` after it was sent (read mode: one producer's reads of `blocks`
// blocks landed or failed, `seconds` after the first lease request to it —
// the same request → KV-in-place span); a load's end, `seconds` after it
// started.
struct PullAnswered {
  TransferId transfer;
  uint32_t blocks = 0;
  double seconds = 0;
  TransferResult result = TransferResult::kOk;
};
struct LoadEnded {
  double seconds = 0;
  bool ok = false;
};
// Something an operator should read once per `once_key` (empty: always).
struct LogLine {
  std::string once_key;
  std::string text;
};

using SessionAction =
    std::variant<FrameToProducer, FrameToConsumer, StartWrite, StartRead, OpenTarget,
                 OpenSource, OpenLane, GrantBlocks, RevokeBlocks, ProducerChanged,
                 PullAnswered, LoadEnded, LogLine>;

struct RankSessionStats {
  uint64_t frames_in = 0;
  uint64_t malformed = 0;                // undecodable, or the wrong kind here
  uint64_t over_limit[kWireLimitCount] = {};
  uint64_t unknown_sender = 0;           // a frame before a handshake
  uint64_t handshake_refused = 0;        // layout, role, open failure, stale
  uint64_t stale_handshakes = 0;         // of those: an older incarnation
  uint64_t handshakes = 0;
  uint64_t peers_down = 0, peers_gone = 0, reconnects = 0;
  uint64_t peers_exited = 0;             // of peers_gone: its lane said it exited
  uint64_t pulls_sent = 0, answers_received = 0;
  uint64_t pull_items_taken = 0;         // P: pull items the tables got
  uint64_t pulls_misaddressed = 0;       // P: pulls meant for another incarnation
  uint64_t unroutable = 0;               // a message for a peer no longer known
  uint64_t auth_failed = 0;
  uint64_t pulls_refused_unauthenticated = 0;
  uint64_t pulls_refused_dst = 0;
  uint64_t grants = 0, revokes = 0;
};

class RankSession {
 public:
  explicit RankSession(RankSessionOptions options);
  RankSession(const RankSession&) = delete;
  RankSession& operator=(const RankSession&) = delete;

  // --- inputs ---
  void ApplyMetadata(const ConnectorMetadata& meta, Instant now);
  // D: pull from P rank (engine, rank) from now on; the first call sends a
  // hello (and opens a lane first when `same_host`). Later calls: nothing.
  void Connect(uint32_t engine, uint32_t rank, bool same_host, Instant now);
  // A frame from P rank (engine, rank)'s connection (D) or from the D rank
  // behind `identity` (P).
  void OnFrameFromProducer(uint32_t engine, uint32_t rank, std::span<const uint8_t> frame,
                           Instant now);
  void OnFrameFromConsumer(const std::string& identity, std::span<const uint8_t> frame,
                           Instant now);
  // D: the connection to P rank (engine, rank) was re-established after
  // frames may have been lost: unanswered pulls go again.
  void OnReconnected(uint32_t engine, uint32_t rank, Instant now);
  // D: the lane to P rank (engine, rank) closed or could not open; frames
  // go over ZeroMQ. `process_gone`: its process is known to have exited (the
  // kernel reports it), so the peer is GONE now.
  void OnLaneClosed(uint32_t engine, uint32_t rank, bool process_gone, Instant now);
  // P: the OpenTarget for `peer` succeeded or failed.
  void OnTargetOpened(PeerId peer, bool ok, const std::string& why, Instant now);
  // P: writes to `peer` failed for want of a connection: reopen at its
  // next hello.
  void OnTargetBroken(PeerId peer);
  // D: reads of P rank (engine, rank) cannot go on: reopen at its next reply.
  void OnSourceBroken(uint32_t engine, uint32_t rank);
  void OnWriteDone(WriteId write, bool ok, Instant now);
  void OnReadDone(ReadId read, bool ok, Instant now);
  // Timers and heartbeats due at `now`.
  void OnTimer(Instant now);
  // The earliest of the tables' deadlines and the next heartbeat.
  std::optional<Instant> NextDeadline() const;
  // D: whether heartbeats matter now (a producer not up, or loads in
  // flight). A driver may skip ticks while not; the runtime does not.
  bool WantsHeartbeat() const;

  // --- outputs ---
  std::optional<SessionAction> PollAction();
  bool HasReport() const { return conn_.HasReport(); }
  // get_finished(): what ended since the last call. Revokes the grants of
  // the loads it ends (as actions, before the engine frees any block).
  RankReport GetFinished(Instant now);

  // --- views ---
  const RankConnector& connector() const { return conn_; }
  const RankSessionStats& stats() const { return stats_; }
  const ProducerPeer* Producer(uint32_t engine, uint32_t rank) const;
  const ProducerPeer* ProducerOf(PeerId peer) const;  // the live incarnation only
  // D: a new load may name P rank (engine, rank): an incarnation of it
  // answered and it is not gone (the runtime's EnsureProducers waits for
  // this, through ProducerChanged; the simulator asks it directly).
  bool CanLoadFrom(uint32_t engine, uint32_t rank) const;
  const ConsumerPeer* ConsumerOf(PeerId peer) const;  // the registered one only
  const std::map<std::pair<uint32_t, uint32_t>, ProducerPeer>& producers() const {
    return producers_;
  }
  // D: the blocks granted to each transfer.
  const std::unordered_map<TransferId, std::vector<uint32_t>>& write_grants() const {
    return granted_;
  }
  const std::unordered_map<TransferId, std::vector<uint32_t>>& read_grants() const {
    return read_granted_;
  }
  void CheckInvariants() const;

 private:
  using Key = std::pair<uint32_t, uint32_t>;  // (engine, rank)
  bool Decode(std::span<const uint8_t> frame, WireMessage* out);
  void OnHello(const std::string& identity, const HandshakeMsg& hs, Instant now);
  void OnReply(ProducerPeer& p, const HandshakeMsg& hs, Instant now);
  bool LayoutMatches(const HandshakeMsg& hs, std::string* why) const;
  void SendHello(ProducerPeer& p);
  void SendReply(const std::string& identity, const HandshakeMsg& hello);
  void Heartbeat(Instant now);
  // The one place a P incarnation is declared gone; `proven`: its process
  // is known to have exited (not just silent).
  void DeclareGone(ProducerPeer& p, Instant now, const std::string& why, bool proven);
  void SetState(ProducerPeer& p, ProducerState s, const std::string& why);
  void Pump(Instant now);  // the connector's actions into ours
  void SendOut(OutMessage out, Instant now);
  void Revoke(TransferId t);
  void Log(std::string once_key, std::string text);
  std::string Name() const;  // "rank N"

  const RankSessionOptions options_;
  RankConnector conn_;
  const HandshakeAuth auth_;
  ChallengeBook challenges_{4096, 4};  // keyed by D identity (P) / "engine:rank" (D)
  std::deque<SessionAction> actions_;
  RankSessionStats stats_;
  Instant next_heartbeat_;
  bool heartbeat_started_ = false;

  std::map<Key, ProducerPeer> producers_;                 // D
  std::unordered_map<uint32_t, ConsumerPeer> consumers_;  // P, by peer index
  std::unordered_map<std::string, uint32_t> index_of_identity_;
  // P: a hello waiting for its target to open, by peer index.
  std::unordered_map<uint32_t, std::pair<std::string, HandshakeMsg>> opening_;
  // D: grants, pulls in flight (for latency) and load starts.
  std::unordered_map<TransferId, std::vector<uint32_t>> granted_;
  std::unordered_map<TransferId, std::vector<uint32_t>> read_granted_;  // P, read mode
  std::unordered_map<RequestId, TransferId> transfer_of_request_;
  std::unordered_map<TransferId, RequestId> owner_of_transfer_;  // its first live request
  std::unordered_map<TransferId, Instant> load_started_;
  struct PullSent {
    Instant at;
    uint32_t blocks = 0;
  };
  std::map<std::pair<TransferId, uint64_t>, PullSent> pull_sent_;
  // Read mode: the first lease request of a transfer to a P rank (by peer
  // index); `blocks` from its grant. Ends at D's done or failed notice.
  std::map<std::pair<TransferId, uint32_t>, PullSent> lease_sent_;
};

}  // namespace kvrelay
