// simulator.h — Simulator: one seeded run of a whole P/D cluster.
//
// Theory of operation
// -------------------
// FoundationDB and TigerBeetle prove their guarantees by running the real
// logic under a seeded scheduler with simulated time, network, memory and
// faults, checking invariants after every step, and replaying any failure
// from its seed. This is that, for KV hand-off. One thread; an event queue
// ordered by (time, sequence); time jumps to the next event.
//
// The world: 1–3 P and 1–3 D engines with 1, 2 or 4 ranks each (the real
// engine::Engine + one RankConnector per rank), clients that send P and D
// legs at once (so D's pull may beat P's prefill) and abort or disconnect at
// any moment, lifecycle operations (pause, sleep, cache resets, weight
// updates) at random moments, a router rule (a failed leg makes the other
// release at once), and:
//
//   SimNetwork  per-connection FIFO with delay and jitter; a connection drop
//               loses everything in flight on it (both directions);
//               partitions between engine pairs that heal; messages to a dead
//               incarnation vanish.
//   SimMemory   every block tagged with its owner (transfer, generation);
//               writes complete after random delays, sometimes fail
//               (sometimes after landing garbage), sometimes after the
//               transfer ended. A write into a block its transfer does not
//               own, or from a P block freed under it, is a violation at the
//               moment it lands.
//   Crashes     an engine dies and restarts with a new incarnation, at once
//               or after a downtime; its peers learn by handshake, by
//               silence, or by a same-host lane closing; stale frames of
//               the old incarnation keep arriving.
//
// Every rank runs the runtime's RankSession: handshakes (with a token in
// some runs), heartbeats and liveness, grants, lanes — over this network,
// as encoded wire frames, so the codec is in the loop.
//
// After every event the simulator checks the invariants of lifecycle.md
// (table structure, block conservation, exactly-once answers and
// completions, ownership of every written block, a write never starting
// after its deadline, content of every decoded block). When the fault phase
// ends everything heals, and the run must drain — every request ended,
// every table empty, every pool free — within a bound (liveness).
//
// Files: simulator.cc (the world and its loop), sim_clients.cc,
// sim_network.cc, sim_data_plane.cc, sim_lifecycle.cc, sim_checks.cc.
//
// Thread safety: none. Deterministic: the same seed gives the same trace.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/prng.h"
#include "core/rank_session.h"
#include "core/release_rule.h"
#include "sim/coverage.h"
#include "sim/event_queue.h"
#include "engine/engine.h"
#include "sim/sim_memory.h"
#include "sim/sim_params.h"

namespace kvrelay::sim {


// Takes a free slot of `slab` (reusing one from `free`, else appending).
template <typename T>
uint32_t TakeSlot(std::vector<T>& slab, std::vector<uint32_t>& free) {
  if (!free.empty()) {
    const uint32_t slot = free.back();
    free.pop_back();
    return slot;
  }
  slab.emplace_back();
  return static_cast<uint32_t>(slab.size() - 1);
}

struct SimResult {
  uint64_t seed = 0;
  bool ok = true;
  std::string failure;        // the first violation
  uint64_t events = 0;
  uint64_t trace_hash = 0;
  Instant end_time;
  uint32_t requests_ok = 0, requests_error = 0, requests_aborted = 0;
  uint32_t ops = 0, ops_failed = 0;
  // Scenario mode (a lifecycle-matrix case):
  Duration call_latency;        // the slowest planned call
  uint32_t probes_ok = 0;
  size_t blocks_left = 0;       // referenced blocks on all pools at the end
  Coverage coverage;
};

struct SimOptions {
  bool trace = false;   // print one line per event to stdout
};

// How a leg ended, as its client sees it.
enum class LegOutcome : uint8_t { kOk, kError, kAborted };

class Simulator {
 public:
  Simulator(const SimParams& params, const SimOptions& options);
  ~Simulator();
  SimResult Run();

 private:
  void ApplyToRanks(uint32_t engine, const ConnectorMetadata& meta);
  void ScheduleStep(uint32_t engine, Duration after = Duration::Zero());
  void DrainEngine(uint32_t engine);
  // An input (request, abort, operation) reached `engine`, maybe during a
  // step's compute: Control() now — as the runtime's engine actor does —
  // then drain its actions and make sure a step follows.
  void AfterInput(uint32_t engine);
  void LegEnded(uint32_t engine, uint32_t request, LegOutcome outcome);
  void CheckTokens(uint32_t request, bool p_leg);
  void Violation(const std::string& what);
  void Hit(Mark m, uint64_t n = 1) { result_.coverage.Hit(m, n); }
  void StartOp(uint32_t engine);
  void StartPlannedOp(uint32_t engine);
  void OnOpDone(uint32_t engine, const engine::OpDone& done);
  void EndOps();
  void RunQueue(Instant bound, uint64_t* hash);
  void SendProbes();

  struct Node {
    bool producer = true;
    uint32_t tp = 1;
    uint32_t incarnation = 1;
    std::unique_ptr<SimMemory> memory;
    std::unique_ptr<engine::Engine> engine;
    std::map<uint64_t, uint32_t> client_of;   // engine request id → client
    std::vector<std::unique_ptr<RankSession>> ranks;
    bool alive = true;   // false between a crash and its restart
    std::vector<std::optional<Instant>> timer_at;   // per rank
    bool step_scheduled = false;
  };
  struct Client {
    TransferId transfer;
    uint32_t p = 0, d = 0;
    std::vector<engine::Token> prompt;
    uint32_t max_tokens = 1;
    std::vector<engine::TokenOut> p_tokens, d_tokens;
    bool p_ended = false, d_ended = false;
    bool release_sent = false;  // the router's POST /kv_release went out
    RequestVerdict verdict = RequestVerdict::kOpen;   // the router's, first decisive leg end
    std::optional<LegOutcome> outcome;   // the D leg's, as the client sees it
    bool abort_sent = false;
    bool p_arrived = false, d_arrived = false;
    // The client gave up while its D leg waited for D's handshakes (the
    // runtime's server sees the disconnect and ends the wait).
    bool d_abort_while_waiting = false;
    bool p_admitted = false;   // P's engine accepted the leg (its transfer is the leg's)
    Instant p_last, d_last;   // last client→engine delivery, per leg (FIFO)
  };
  struct InFlightMessage {
    bool used = false;
    uint32_t from_engine = 0, from_rank = 0, from_incarnation = 0;
    uint32_t to_engine = 0, to_rank = 0, to_incarnation = 0;
    uint64_t conn_epoch = 0;
    bool to_producer = false;     // D → P (else P → D)
    std::vector<uint8_t> frame;   // one encoded wire frame
  };
  // KV moving between a P rank and a D rank: a write (push) or a read.
  struct Copy {
    bool used = false;
    uint32_t p_engine = 0, p_rank = 0, p_incarnation = 0;
    uint32_t d_engine = 0, d_rank = 0, d_incarnation = 0;
    bool fail = false, garbage = false;
  };
  struct Write : Copy {
    StartWrite w;
  };
  // Read mode: D rank (e, r) copies P's blocks into its own.
  struct Read : Copy {
    StartRead r;
  };
  // Sets up `c` between P rank (p, pr) and D rank (d, dr) of those
  // incarnations, draws whether it fails (and lands garbage), and returns
  // how long it takes.
  Duration StartCopy(Copy* c, PeerAddress p, PeerAddress d);

  void BuildNode(uint32_t e);
  // Events carry the incarnation they were meant for: one for a process
  // that died (or has not restarted yet) finds nobody.
  bool Live(uint32_t engine, uint64_t incarnation) const;
  // D engine `d`'s ranks start talking to every P rank (as the runtime's
  // EnsureProducers does at a request naming it).
  void ConnectAll(uint32_t d);
  // Every rank of D engine `d` that pulls from P engine `p` knows a live
  // incarnation of it (up or down, not gone): a leg may start.
  bool ProducersKnown(uint32_t d, uint32_t p) const;
  void Restart(uint32_t e);
  void Dispatch(const Event& ev);
  void DrainRank(uint32_t e, uint32_t r);
  void RunAction(uint32_t e, uint32_t r, SessionAction a);
  // A frame from rank (e, r) to rank (te, tr) of incarnation `to_inc`.
  void SendFrame(uint32_t e, uint32_t r, uint32_t te, uint32_t tr, uint32_t to_inc,
                 bool to_producer, std::vector<uint8_t> frame);
  // Answers P rank (e, r) sends are checked before they leave.
  bool CheckAnswer(uint32_t e, uint32_t r, PeerId to, const AnswerMsg& answer);
  // D rank (d, dr): no load waits on a P incarnation that died long enough
  // ago to have been found out (by its lane, its restart, or silence).
  void CheckDeadProducers(uint32_t d, uint32_t dr);
  std::string IdentityOf(uint32_t e, uint32_t r) const;
  bool SameHost(uint32_t d, uint32_t p) const;
  void Deliver(uint32_t slot);
  void BeginWrite(uint32_t e, uint32_t r, StartWrite w);
  void FinishWrite(uint32_t slot);
  void BeginRead(uint32_t e, uint32_t r, StartRead read);
  void FinishRead(uint32_t slot);
  // Copies the head groups P rank (p, pr) shares with D rank (d, dr) from
  // `src` to `dst` (or garbage), checking both sides' ownership as it lands.
  // False after reporting a violation.
  bool LandKv(uint32_t p, uint32_t pr, uint32_t d, uint32_t dr, TransferId t,
              const std::vector<BlockId>& src, const std::vector<BlockId>& dst, bool garbage,
              const char* what);
  void ClientArrive(uint32_t request);
  void ClientAbort(uint32_t request);
  void BlocksFreedCheck(uint32_t engine);
  void SendAbort(uint32_t request, uint32_t engine, Duration extra = Duration::Zero());
  // The P server's fast abort: an abort that reached P engine `engine`
  // while the request's P leg is open also ends its send at each rank
  // (runtime: EngineServer posts an AbortSendOp to every rank actor).
  // Each rank gets it now or after a random delay of its own, so it meets
  // the engine's own abort metadata in either order.
  void FastAbort(uint32_t request, uint32_t engine);
  void RankAbort(uint32_t request, uint32_t engine, uint32_t rank);
  // The router's release (router/relay_logic.h, "Release"): once a request
  // that did not end well has P's leg over, POST /kv_release reaches P's
  // server, which ends the send at every rank (an AbortSendOp each). Checks
  // that no rank still holds it WAITING or READY afterwards.
  void MaybeRelease(uint32_t request);
  void Release(uint32_t request, uint32_t engine);
  Duration NetDelay();
  void Crash(uint32_t e);
  void MaybeInjectFault();
  bool Partitioned(uint32_t a, uint32_t b) const;
  // The connection between D rank (d, dr) and P rank (p, pr) comes back
  // after `after`: D resends what it has not had answered.
  void ScheduleReconnect(uint32_t d, uint32_t dr, uint32_t p, uint32_t pr, Duration after);
  void ReconnectEngines(uint32_t p, uint32_t d);
  uint64_t ConnKey(uint32_t e1, uint32_t r1, uint32_t e2, uint32_t r2) const;
  void CheckAll();
  void CheckDrained();
  void CheckPromptDrain();
  void Trace(const Event& ev);
  void TraceAction(uint32_t e, const engine::EngineAction& a);
  bool faults_on() const { return !faults_over_; }

  const SimParams params_;
  const SimOptions options_;
  Prng prng_;
  EventQueue queue_;
  Instant now_;
  std::vector<Node> nodes_;     // P engines first, then D engines
  std::vector<Client> clients_;
  std::vector<InFlightMessage> messages_;
  std::vector<uint32_t> free_messages_;
  std::vector<Write> writes_;
  std::vector<uint32_t> free_writes_;
  std::vector<Read> reads_;
  std::vector<uint32_t> free_reads_;
  std::unordered_map<uint64_t, uint64_t> conn_epoch_;
  std::unordered_map<uint64_t, Instant> conn_last_delivery_;
  std::set<uint64_t> reconnect_pending_;  // one reconnect per connection at a time
  std::map<std::pair<uint32_t, uint32_t>, Instant> partitions_;
  // Lanes open, (D engine, D rank, P engine, P rank) → the P incarnation
  // that accepted it: a lane is one process's socket, and only that
  // process's death closes it.
  using LinkKey = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;
  std::map<LinkKey, uint32_t> lanes_;
  // The newest P incarnation each D rank's session has known, per link: it
  // must never go back (a stale frame accepted).
  std::map<LinkKey, uint32_t> newest_known_;
  // Dead P incarnations: when they died, and which D ranks had a lane.
  struct Death {
    Instant at;
    std::set<std::pair<uint32_t, uint32_t>> lanes;  // (D engine, D rank)
  };
  std::map<std::pair<uint32_t, uint32_t>, Death> deaths_;  // (engine, incarnation)
  Prng nonce_prng_{0};
  // Exactly-once answers: every pull item a P rank accepted, by key.
  struct PullRecord {
    uint32_t p_engine = 0, p_incarnation = 0;
    uint32_t d_engine = 0, d_incarnation = 0;   // who sent it
    uint32_t answers = 0;
    uint32_t deliveries = 0;   // a resent pull is delivered again
    TransferResult first_result = TransferResult::kOk;
    Instant received;
  };
  std::unordered_map<uint64_t, PullRecord> pull_answers_;
  bool faults_over_ = false;
  engine::ModelShape shape_;
  uint64_t next_weights_ = 2;
  struct PlannedOp {
    Instant started;
    bool leaves_paused = false;
    bool done = false;
  };
  std::map<std::pair<uint32_t, uint64_t>, PlannedOp> planned_;
  // Random lifecycle calls in flight: (engine, incarnation, op id) → start.
  struct RandomOp {
    Instant started;
    bool needs_end = false;  // a resume / wake_up is owed once it returned
  };
  std::map<std::tuple<uint32_t, uint32_t, uint64_t>, RandomOp> random_ops_;
  uint32_t first_probe_ = UINT32_MAX;
  bool drain_check_armed_ = false;
  static constexpr Duration kPromptDrain = Duration::Seconds(10);
  SimResult result_;
};

// Runs one seed; never throws. A KV_CHECK failure aborts the process.
SimResult RunSeed(uint64_t seed, const SimOptions& options);

}  // namespace kvrelay::sim
