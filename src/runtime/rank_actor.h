// rank_actor.h — RankActor: the thread that runs one rank's RankSession
// over real sockets.
//
// Theory of operation
// -------------------
// The protocol — handshakes, incarnations, liveness, grants, when a lane
// may open, the send/load/lease tables — is the pure core's RankSession
// (core/rank_session.h), the same code the simulator runs. This actor only
// moves bytes: one thread waits in zmq_poll on its inbox (metadata from the
// engine actor, write completions, requests from other threads), the P
// rank's ZeroMQ ROUTER, one DEALER per P rank this D rank pulls from, the
// local lanes, and the small writes it drives itself. Every input becomes a
// session call with `now`; after each round the actor carries out the
// session's actions — frames to sockets, memory to open (transport
// targets, sources, lanes), grants into the region's grant tables, writes
// to the WriterPool — and hands get_finished() reports to the engine actor.
//
// Connections: a D rank connects a DEALER to each P rank it needs
// (tcp://host:ctrl_port+rank, learned from kv_transfer_params); the
// session's hellos and heartbeats go out on it. Local lane (`local_lane`):
// P also listens on a Unix socket (runtime/local_lane.h) and a D rank on
// the same host (shm, or a P whose control host is local) sends that P
// rank's frames there when the session opened a lane; a lane that breaks
// sends them back to ZeroMQ, and one whose P process the kernel reports gone
// (SO_PEERCRED's pid absent or a zombie) tells the session the peer exited.
//
// Data plane: P writes a pull's blocks through the transport target opened
// from D's handshake (a small write that cannot block runs on this thread:
// a local copy, or a tcp frame whose reply the loop polls); D in read mode
// reads through the source opened from P's reply. Block ids from a peer
// are checked against its pool before planning.
//
// Ownership: owned by Node. Threading: public methods are thread-safe; the
// session, sockets and maps are touched only by the actor's thread.
#pragma once

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
#include "core/rank_session.h"
#include "engine/model.h"
#include "net/transport.h"
#include "runtime/engine_actor.h"
#include "runtime/inbox.h"
#include "runtime/lane_hub.h"
#include "runtime/polled_writes.h"
#include "runtime/rank_options.h"
#include "runtime/rank_state.h"
#include "runtime/writer_pool.h"
#include "runtime/zmq_channel.h"

namespace kvrelay::runtime {

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
  struct Conn {  // D → one P rank: the sockets and memory behind a producer
    uint32_t engine = 0, rank = 0;
    uint32_t port = 0;  // P rank's control port (ctrl_port + rank)
    std::string endpoint;
    void* sock = nullptr;
    bool same_host = false;           // shm, or P's control host is this one
    std::unique_ptr<LocalLane> lane;  // the same-host path, when open
    // P's process, if its lane was closed by P's end: checked each
    // heartbeat until the kernel reports it gone (or P answers again),
    // since the socket closes before the process has exited.
    int closed_lane_pid = 0;
    std::shared_ptr<net::Source> source;  // read mode: P's region
  };
  struct DTarget {  // P: the memory of one D rank, opened at its handshake
    PeerId peer;
    std::shared_ptr<net::Target> target;
  };

  void Loop();
  void OnFrame(const std::string* identity, Conn* conn, const uint8_t* data, size_t size);
  void Chores(Instant now);  // each heartbeat: lanes that never attached, exited Ps
  void CheckLanePeerGone(Conn& c, Instant now);
  // Carries out the session's actions, then feeds back the outcomes of
  // jobs finished meanwhile, until both are empty (bounded).
  void Pump();
  void RunActions();
  void Run(SessionAction a);
  void StartWriteJob(StartWrite w);
  // The end of a write: counts it (any thread), then (actor thread) queues
  // its outcome for the session and drops a target that lost its peer.
  void CountWrite(const Status& s, uint64_t bytes, Instant started);
  void OnWriteJobDone(WriteId id, PeerId peer, bool ok, bool broken);
  void CountRead(const Status& s, uint64_t bytes);
  // `key`: the source's (P engine, P rank); `source`: the one the read used.
  void OnReadJobDone(ReadId id, std::pair<uint32_t, uint32_t> key,
                     const std::weak_ptr<net::Source>& source, bool ok, bool broken);
  void StartReadJob(StartRead r);
  // A job copying P rank `p`'s blocks `src` into D rank `d`'s `dst`, planned
  // as P writes them (a read runs the same plan); nullopt, counted and
  // logged, if the peer's block ids do not fit its pool.
  struct RankGeometry {
    uint32_t tp = 1, rank = 0, blocks = 0;
  };
  std::optional<WriteJob> PlanJob(const RankGeometry& p, const RankGeometry& d,
                                  const std::vector<BlockId>& src,
                                  const std::vector<BlockId>& dst, bool read);
  Conn& ConnFor(uint32_t engine, uint32_t rank, const std::string& host, uint16_t port);
  bool SendFrame(void* sock, const std::string* identity, const std::vector<uint8_t>& frame);
  ZmqSocketLimits ZmqLimits() const;
  // A frame to a D rank (its lane if attached, else the ROUTER) and to a P
  // rank (the lane if open, else the DEALER).
  bool SendToD(const std::string& identity, const std::vector<uint8_t>& frame);
  bool SendToP(Conn& c, const std::vector<uint8_t>& frame);
  // true: sent; false: dropped (queue full); nullopt: the lane is broken.
  std::optional<bool> SendOnLane(LocalLane& lane, const std::vector<uint8_t>& frame);
  // D: may a P rank whose control endpoint is at `host` be on this host?
  bool SameHost(const std::string& host) const;
  std::string RoutingId() const;
  // D: opens a lane to `c`'s P rank, replacing any old one (false: none).
  bool ConnectLane(Conn& c);
  void SweepLanes();                  // drops broken lanes, both sides

  const RankActorOptions options_;
  void* const zmq_;
  net::Transport* const transport_;
  net::Region* const region_;
  EngineActor* const engine_;
  const LatencySink sink_;
  RankSession session_;
  Inbox inbox_;
  std::unique_ptr<WriterPool> writers_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  RankCounters counters_;

  // Actor thread only.
  void* router_ = nullptr;
  // D: lanes replaced while a poll round may still point at them; freed
  // by SweepLanes at the end of the round.
  std::vector<std::unique_ptr<LocalLane>> retired_lanes_;
  std::map<std::pair<uint32_t, uint32_t>, Conn> conns_;
  std::unordered_map<uint32_t, DTarget> targets_;  // P: by peer index
  std::vector<std::pair<WriteId, bool>> deferred_write_done_;
  // Small writes (P) and reads (D) the loop drives; each holds an idle
  // stream of its peer's pool, so ≤ --tcp-streams per peer rank.
  PolledWrites polled_;
  std::vector<std::pair<ReadId, bool>> deferred_read_done_;
  Instant next_chores_;
  uint64_t send_failures_ = 0;     // frames no socket took (counted as unroutable)
  uint64_t driver_malformed_ = 0;  // frames or block ids refused here, not by the session
  LaneHub lanes_;                  // P: the lanes of this host's D ranks

  // EnsureProducers waiters.
  Mutex known_mu_;
  CondVar known_cv_;
  std::set<std::pair<uint32_t, uint32_t>> known_ GUARDED_BY(known_mu_);
};

}  // namespace kvrelay::runtime
