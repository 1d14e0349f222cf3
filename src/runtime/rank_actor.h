// rank_actor.h — RankActor: the thread that owns one rank's connector and
// its control-channel sockets.
//
// Theory of operation
// -------------------
// One RankConnector (send table on P, load table on D) per rank, driven by
// one thread that waits in zmq_poll on: its inbox (metadata from the
// engine actor, write completions from its writers, requests from other
// threads), the P rank's ZeroMQ ROUTER, and one DEALER per P rank this D
// rank pulls from. Every input becomes a connector call with `now`; after
// each round the actor drains the connector's actions — messages go out on
// the sockets, writes go to the WriterPool — and hands get_finished()
// reports to the engine actor.
//
// Connections: a D rank connects a DEALER to each P rank it needs
// (tcp://host:ctrl_port+rank, learned from kv_transfer_params) and sends a
// Handshake (engine id, incarnation, rank, tp, KV layout, transport and its
// registration). P answers with its own. The handshake doubles as the
// heartbeat: D resends it every `heartbeat`; a reply with a newer
// incarnation proves the old P process gone (SetPeer → its unanswered
// pulls fail at once); silence for `peer_down_after` marks the peer down,
// and the reply that ends the silence triggers Reconnected (unanswered
// pulls are resent with the budget they have left); silence for
// `peer_dead_after` declares it gone (PeerGone: its loads fail now, and
// recompute or fail by policy, instead of waiting out the timeout). A P
// whose local lane closed and whose process the kernel reports gone
// (SO_PEERCRED's pid absent or a zombie) is declared gone at once.
//
// Local lane (`local_lane`): P also listens on a Unix socket
// (runtime/local_lane.h) and a D rank on the same host (shm, or a P whose
// control host is local: runtime/local_host.h) that reaches it sends every frame
// for that P rank there instead of its DEALER, handshakes included; P
// answers an identity on its lane while it has one. The lane is opened
// only before a P incarnation is known (at the first handshake, or a
// restart), when nothing but hellos is in flight, so frames never pass
// each other between the two paths. A broken lane falls back to ZeroMQ.
//
// Read mode (`mode` kRead): the same actor drives a LeaseTable (P) and a
// ReadLoadTable (D) instead: D's heartbeats and notices go out on its
// DEALERs, P's grants and revokes on its ROUTER; D opens P's region for
// reading (net::Source) from the registration in P's handshake reply and
// runs StartRead jobs on the same worker pool; P grants the blocks of each
// lease for reading in its region's ReadGrantTable (tcp serves reads only
// inside it) and revokes them when the lease ends.
//
// Access control: D grants a load's destination blocks to its transfer in
// its region's GrantTable when it sends the pull and revokes them when the
// load ends or is released (tcp's receiver refuses anything else). P only
// writes blocks named in a pull it received from that D.
//
// Authentication (`auth_token` set): the handshake is a challenge-response
// over the token (core/handshake_auth.h, docs/wire.md). P registers a D
// rank, opens its memory and takes its pulls only after that D rank
// answered a fresh challenge of P's; D takes a P rank's handshake (and so
// its answers) only if it answers a fresh challenge of D's. Pulls from a D
// rank that has not proved itself are dropped and counted.
//
// Pull checks on P: a pull item naming destination blocks outside the
// region the D rank registered is answered kRejected at once and counted
// (`pulls_refused_dst`); the send table refuses pulls for a transfer bound
// to another D engine (SendTable::Claim).
//
// Bad input: every frame is decoded with WireLimits; a malformed frame, a
// pull from a connection that never handshook, or a handshake whose layout
// or transport differs is dropped, counted and logged once.
//
// Ownership: owned by Node. Threading: public methods are thread-safe; the
// connector, sockets and maps are touched only by the actor's thread.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "core/handshake_auth.h"
#include "core/rank_connector.h"
#include "core/wire.h"
#include "engine/model.h"
#include "net/transport.h"
#include "runtime/engine_actor.h"
#include "runtime/inbox.h"
#include "runtime/local_lane.h"
#include "runtime/writer_pool.h"

namespace kvrelay::runtime {


struct RankActorOptions {
  uint32_t engine_id = 0;
  uint32_t incarnation = 1;
  uint32_t rank = 0;
  uint32_t tp = 1;
  ConnectorRole role = ConnectorRole::kBoth;
  engine::ModelShape shape;
  uint32_t num_blocks = 0;
  std::string listen_host = "127.0.0.1";
  uint16_t ctrl_port = 0;              // P: this rank binds ctrl_port + rank
  KvMode mode = KvMode::kPush;
  TransferTimings timings;     // every table's times derive from it
  uint32_t num_workers = 4;    // writes (reads, in read mode) in flight at once
  // P: a write of at most this many bytes runs on the rank's own thread
  // instead of a worker when it cannot block it: a copy between local
  // mappings (shm), or a tcp frame sent without waiting whose reply the
  // rank's loop polls (net::PendingWrite). Waking a worker and being woken
  // back costs two thread hand-offs, more than such a write
  // (docs/performance.md). 0: never.
  uint64_t inline_write_bytes = 1 << 20;
  WireLimits limits;
  Duration heartbeat = Duration::Seconds(1);
  Duration peer_down_after = Duration::Seconds(3);
  Duration peer_dead_after = Duration::Seconds(10);
  int socket_hwm = 100000;             // ZeroMQ high-water mark, each way
  // Control frames between the same host's ranks (any transport) go over a
  // Unix socket polled by the rank threads (two thread wake-ups a pull,
  // not six). false: ZeroMQ only.
  bool local_lane = true;
  int thread_nice = 0;                 // the actor thread's nice value; 0: inherited
  int thread_slice_us = 0;             // the actor thread's EEVDF slice; 0: inherited
  std::string auth_token;              // shared secret; empty: no authentication
};

// Counters, readable from any thread.
struct RankCounters {
  std::atomic<uint64_t> frames_in{0}, frames_out{0};
  std::atomic<uint64_t> malformed{0};          // undecodable frames
  // Of those, the ones refused for a WireLimits field (by WireLimit).
  std::array<std::atomic<uint64_t>, kWireLimitCount> over_limit{};
  std::atomic<uint64_t> unknown_sender{0};     // pull before handshake
  std::atomic<uint64_t> handshake_refused{0};  // layout/transport mismatch
  std::atomic<uint64_t> unroutable{0};         // answer for a gone D
  std::atomic<uint64_t> handshakes{0};
  std::atomic<uint64_t> peers_down{0}, peers_gone{0}, reconnects{0};
  std::atomic<uint64_t> writes_ok{0}, writes_failed{0}, bytes_written{0};
  std::atomic<uint64_t> writes_inline{0};  // of those, run on the rank's thread
  std::atomic<uint64_t> lane_frames_out{0};  // of frames_out, sent on a local lane
  std::atomic<uint64_t> lanes_opened{0}, lanes_broken{0};
  std::atomic<uint64_t> reads_ok{0}, reads_failed{0}, bytes_read{0};  // read mode, D
  std::atomic<uint64_t> pulls_sent{0}, answers_received{0};
  // Access control. auth_failed: handshakes refused because their MAC did
  // not check, their echo redeemed no challenge, or one side has a token
  // and the other not. Pull items refused on P: from a D rank that has not
  // proved the token (`unauthenticated`), or naming blocks outside D's
  // registered region (`dst_out_of_region`).
  std::atomic<uint64_t> auth_failed{0};
  std::atomic<uint64_t> pulls_refused_unauthenticated{0};
  std::atomic<uint64_t> pulls_refused_dst{0};
};

struct PeerView {
  uint32_t engine = 0, rank = 0;
  PeerId peer;
  std::string endpoint;
  std::string state;       // connecting | up | down | gone
  double silent_s = 0;
};

// A histogram sample the actor hands to the metrics layer.
struct LatencySink {
  // D: one answer to a pull of `blocks` destination blocks, `seconds` after
  // the pull was sent; `answered` is when it arrived (MonoNow).
  std::function<void(TransferId transfer, uint32_t rank, uint32_t blocks, double seconds,
                     TransferResult result, Instant answered)>
      pull_answer;
  std::function<void(double seconds, bool ok)> transfer;                   // D: load
  std::function<void(double seconds)> write;                               // P
  // P: TryPostMetadata (the server's fast abort) to applied on this rank's
  // thread: how long the input waited for the rank.
  std::function<void(double seconds)> posted_to_applied;
};

struct RankState {
  uint32_t rank = 0;
  Instant now;
  std::vector<SendView> sends;
  std::vector<LoadView> loads;
  std::vector<PeerView> peers;
  SendTableStats send_stats;
  LoadTableStats load_stats;
  // Read mode: P's leases and D's read-load counters.
  std::vector<LeaseView> leases;
  LeaseTableStats lease_stats;
  ReadLoadTableStats read_stats;
  KvMode mode = KvMode::kPush;
  RankConnectorStats connector_stats;
  uint32_t writes_in_flight = 0;
  size_t queued_for_sender = 0;
  size_t tombstones = 0;
};

class RankActor {
 public:
  RankActor(const RankActorOptions& options, void* zmq_context, net::Transport* transport,
            net::Region* region, EngineActor* engine, LatencySink sink = {});
  ~RankActor();
  RankActor(const RankActor&) = delete;
  RankActor& operator=(const RankActor&) = delete;

  // Binds the ROUTER (producer ranks) and starts the thread.
  Status Start();
  void Stop();

  void PostMetadata(const ConnectorMetadata& meta);
  // As PostMetadata, but false (dropped) if the inbox is full or closed:
  // for inputs that another path also delivers (the server's fast abort).
  // The wait to its application goes to LatencySink::posted_to_applied.
  bool TryPostMetadata(const ConnectorMetadata& meta);
  // D: blocks until this rank has handshaken with every rank of producer
  // engine `engine` it pulls from (at host:port+rank), or `timeout`.
  Status EnsureProducers(uint32_t engine, const std::string& host, uint16_t port,
                         uint32_t p_tp, Duration timeout) EXCLUDES(known_mu_);
  std::optional<RankState> State();
  const RankCounters& counters() const { return counters_; }
  size_t inbox_size() const { return inbox_.size(); }

 private:
  struct Conn {  // D → one P rank
    uint32_t engine = 0, rank = 0;
    uint32_t port = 0;  // P rank's control port (ctrl_port + rank)
    std::string endpoint;
    void* sock = nullptr;
    bool same_host = false;           // shm, or P's control host is this one
    std::unique_ptr<LocalLane> lane;  // the same-host path, when open
    // P's process, if its lane was closed by P's end: checked each
    // heartbeat until the kernel reports it gone (or a handshake shows P
    // alive), since the socket closes before the process has exited.
    int closed_lane_pid = 0;
    bool known = false;
    PeerId peer;
    enum State : uint8_t { kConnecting, kUp, kDown, kGone } state = kConnecting;
    Instant last_heard;
    HandshakeNonce peer_nonce{};  // P's latest challenge, echoed in our next hello
    // Read mode: P's region, opened for reading from ours on its handshake.
    uint32_t tp = 1, num_blocks = 0;
    std::vector<uint8_t> registration;
    std::shared_ptr<net::Source> source;
  };
  struct DPeer {  // P: one D rank that handshook
    std::string identity;
    PeerId peer;
    uint32_t tp = 1, rank = 0, num_blocks = 0;
    std::vector<uint8_t> registration;
    std::shared_ptr<net::Target> target;
  };

  void Loop();
  void ApplyMetadata(const ConnectorMetadata& meta);  // actor thread
  void DrainRouter();
  void DrainDealer(Conn& c);
  void OnFrame(const std::string* identity, Conn* conn, const uint8_t* data, size_t size);
  void OnHandshakeFromD(const std::string& identity, const HandshakeMsg& hs);
  void OnHandshakeFromP(Conn& c, const HandshakeMsg& hs);
  bool LayoutMatches(const HandshakeMsg& hs, std::string* why) const;
  HandshakeMsg OwnHandshake() const;
  // D: a (signed) hello for `c`; P: a (signed) reply to `identity`'s hello.
  std::vector<uint8_t> HelloFor(Conn& c);
  std::vector<uint8_t> ReplyTo(const std::string& identity, const HandshakeMsg& hello);
  void Heartbeat(Instant now) EXCLUDES(known_mu_);
  using ConnKey = std::pair<uint32_t, uint32_t>;  // (P engine, P rank)
  void DeclareGone(const ConnKey& key, Conn& c, Instant now, const std::string& why)
      EXCLUDES(known_mu_);
  void CheckLanePeerGone(const ConnKey& key, Conn& c, Instant now) EXCLUDES(known_mu_);
  void Pump();
  void SendOut(OutMessage out);
  void StartWriteJob(StartWrite w);
  // The end of a write: counts it (any thread), then (actor thread) queues
  // its outcome for the table and drops a target that lost its peer.
  void CountWrite(const Status& s, uint64_t bytes, Instant started);
  void OnWriteJobDone(WriteId id, PeerId peer, bool ok, bool broken);
  // P: a small write the loop drives (net::PendingWrite): its first step
  // at the start, then one each time its socket is ready; at its
  // give_up_at() it is abandoned (kDeadlineExceeded at the pull's deadline,
  // kUnavailable when it stalled first, as a pool write's would).
  struct PolledWrite {
    std::shared_ptr<net::Target> target;  // declared first: outlives `write`
    std::unique_ptr<net::PendingWrite> write;
    WriteId id;
    PeerId peer;
    uint64_t bytes = 0;
    Instant started;
    bool over = false;
  };
  bool StartPolledWrite(const WriteJob& job, WriteId id, PeerId peer, Instant started);
  void ProgressPolledWrite(PolledWrite& w);
  void FinishPolledWrite(PolledWrite& w, const Status& s);
  // Abandons the writes past their give_up_at(); returns the earliest
  // give_up_at() of those still running (Never if none).
  Instant ExpirePolledWrites(Instant now);
  void StartReadJob(StartRead r);
  Conn& ConnFor(uint32_t engine, uint32_t rank, const std::string& host, uint16_t port);
  void NotifyKnown() EXCLUDES(known_mu_);
  bool SendFrame(void* sock, const std::string* identity, const std::vector<uint8_t>& frame);
  // A frame to a D rank (its lane if attached, else the ROUTER) and to a P
  // rank (the lane if open, else the DEALER).
  bool SendToD(const std::string& identity, const std::vector<uint8_t>& frame);
  bool SendToP(Conn& c, const std::vector<uint8_t>& frame);
  // true: sent; false: dropped (queue full); nullopt: the lane is broken.
  std::optional<bool> SendOnLane(LocalLane& lane, const std::vector<uint8_t>& frame);
  bool LaneEnabled() const;
  // D: may a P rank whose control endpoint is at `host` be on this host?
  bool SameHost(const std::string& host) const;
  std::string RoutingId() const;
  void ListenForLanes();                    // P, at Start
  void CloseUnattachedLanes(Instant now);   // P, each heartbeat
  // D: opens a lane to `c`'s P rank (quietly nothing if it has none).
  void OpenLane(Conn& c);
  void AcceptLanes();                 // P
  void ReadDLane(LocalLane& lane);    // P: frames from a D rank's lane
  void SweepLanes() EXCLUDES(known_mu_);  // drops broken lanes, both sides

  const RankActorOptions options_;
  void* const zmq_;
  net::Transport* const transport_;
  net::Region* const region_;
  EngineActor* const engine_;
  const LatencySink sink_;
  RankConnector conn_;
  Inbox inbox_;
  std::unique_ptr<WriterPool> writers_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  RankCounters counters_;
  const HandshakeAuth auth_{options_.auth_token};

  // Actor thread only.
  void* router_ = nullptr;
  std::unique_ptr<LaneListener> lane_listener_;             // P
  std::vector<std::unique_ptr<LocalLane>> d_lanes_;         // P: accepted, ≤ kMaxLanes
  std::unordered_map<std::string, LocalLane*> lane_of_identity_;  // P: attached lanes
  // D: lanes replaced while a poll round may still point at them; freed
  // by SweepLanes at the end of the round.
  std::vector<std::unique_ptr<LocalLane>> retired_lanes_;
  std::map<std::pair<uint32_t, uint32_t>, Conn> conns_;
  std::unordered_map<std::string, uint32_t> index_of_identity_;
  std::unordered_map<uint32_t, DPeer> dpeers_;   // by peer index
  std::unordered_map<TransferId, std::vector<uint32_t>> granted_;
  std::unordered_map<RequestId, TransferId> transfer_of_request_;
  std::unordered_map<TransferId, Instant> load_started_;
  struct PullSent {
    Instant at;
    uint32_t blocks = 0;
  };
  std::map<std::pair<TransferId, uint64_t>, PullSent> pull_sent_;  // (transfer, seq)
  std::vector<std::pair<WriteId, bool>> deferred_write_done_;
  // P: at most the send table's writes in flight (num_workers); ended ones
  // are dropped at the top of the next loop pass.
  std::vector<std::unique_ptr<PolledWrite>> polled_writes_;
  std::vector<std::pair<ReadId, bool>> deferred_read_done_;
  // P, read mode: the blocks each transfer's granted readers may read (tcp
  // serves reads only inside these; revoked when the lease ends).
  std::unordered_map<TransferId, std::vector<uint32_t>> read_granted_;
  Instant next_heartbeat_;
  ChallengeBook challenges_{4096, 4};  // keyed by D identity (P) / P endpoint (D)

  // EnsureProducers waiters.
  Mutex known_mu_;
  CondVar known_cv_;
  std::set<std::pair<uint32_t, uint32_t>> known_ GUARDED_BY(known_mu_);
};

}  // namespace kvrelay::runtime
