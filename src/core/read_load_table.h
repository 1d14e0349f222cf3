// read_load_table.h — ReadLoadTable: D's side of every KV hand-off in read
// mode, for one D rank.
//
// Why
// ---
// In read mode D copies the KV out of P's memory itself (shm: from P's
// mapping; ucx: get; tcp: a read served by P). P can neither see nor stop
// such a read, so the safety of P's blocks rests on D: D must never start a
// read that could still run when P's lease has run out and P may have
// reused the blocks. And P's promptness rests on D too: D must say when it
// is done, answer P's revokes once its reads have landed, and stop
// heartbeating when the request ends, or P holds the KV for nothing.
//
//   * Heartbeats. A load sends a heartbeat to every producer rank at once
//     and then every `heartbeat_interval` while any producer is unfinished.
//     The first granted answer carries P's blocks and how much of the lease
//     was left at P; D counts that from when it *sent* the heartbeat — an
//     instant no later than P's own — so `lease_view` is a lower bound of
//     P's expiry. Each later grant moves it on.
//   * Reads. A read starts only if it can end `read_margin` before
//     lease_view (StartRead's deadline: the reader must not start after
//     it). A grant too close to its end is not used; the next heartbeat
//     extends the lease and asks again.
//   * Ending. A producer finishes when its read lands (D tells P: done, or
//     failed), when P answers "ended" before any read, on a revoke with no
//     read in flight, at give-up, or when P is known dead. A revoke or a
//     release that meets a read in flight waits for it to land, and only
//     then answers P — that answer is what lets P free early.
//   * The load ends when every producer finished: LoadDone (ok only if every
//     producer's read landed whole), or LoadReleased when the request went
//     away meanwhile; `cut_short` for abort_transfers(). Exactly once.
//   * Nothing writes into D's blocks but D's own reads, so D's blocks are
//     free to reuse as soon as those have landed: no give-up grace.
//
// Producer states: ASKING (heartbeats out, no read yet) → READING (a read in
// flight) → FINISHED. All transitions are in Finish(), FinishIfComplete()
// and the few inputs below.
//
// Ownership and threading: owned by one D rank's connector actor; called
// from its thread only. Pure: no I/O, no clock. O(1) per input plus timers
// (O(log n)) in the number of live loads, except AbortAll and PeerGone.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "base/flat_map.h"
#include "base/status.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "base/typed_id.h"
#include "core/block_id.h"
#include "core/lease_table.h"
#include "core/load_table.h"
#include "core/request_id.h"
#include "core/timer_heap.h"
#include "core/transfer_result.h"

namespace kvrelay {

struct ReadLoadTableOptions {
  Duration heartbeat_interval = Duration::Seconds(5);
  // A read is started only if it can finish this long before the lease
  // view; the reader also refuses to start after StartRead::deadline. At
  // least the longest a read can take.
  Duration read_margin = Duration::Seconds(5);
  // D gives up on a producer that has not granted this long after the load
  // started (P's prefill may take long; P's answer "pending" keeps coming).
  Duration giveup = Duration::Seconds(540);
  uint32_t max_loads = 1u << 20;
  uint32_t max_producers = 64;
  uint32_t max_outstanding_heartbeats = 16;   // per producer
};

using ReadId = TypedId<struct ReadTag>;

// Send heartbeat `seq` for `transfer` to P rank `peer`.
struct SendHeartbeat {
  PeerId peer;
  uint64_t seq = 0;
  TransferId transfer;
  uint64_t prompt_hash = 0;
};

// Tell P rank `peer` about `transfer` (done, failed, release, revoked).
struct SendNotice {
  PeerId peer;
  TransferId transfer;
  ReadNotice notice = ReadNotice::kDone;
};

// Copy P's `src` blocks (same count, in order) into this rank's `dst`
// blocks, then report ReadDone(read, ok). The reader must not start after
// `deadline`; if it would, it reports ReadDone(read, false) unread.
struct StartRead {
  ReadId read;
  PeerId peer;
  TransferId transfer;
  std::vector<BlockId> src;
  std::vector<BlockId> dst;
  Instant deadline;
};

using ReadLoadAction = std::variant<SendHeartbeat, SendNotice, StartRead, LoadDone, LoadReleased>;

struct ReadLoadTableStats {
  uint64_t loads_started = 0;
  uint64_t loads_ok = 0;
  uint64_t loads_failed = 0;
  uint64_t loads_released = 0;
  uint64_t loads_cut_short = 0;   // incl. loads a producer's reset ended
  uint64_t heartbeats_sent = 0;
  uint64_t grants = 0;
  uint64_t grants_too_late = 0;     // lease view too short to read safely
  uint64_t grants_unmatched = 0;    // no live load/producer, or unknown seq
  uint64_t pending_answers = 0;
  uint64_t ended_answers = 0;
  uint64_t reads_started = 0;
  uint64_t reads_ok = 0;
  uint64_t reads_failed = 0;
  uint64_t revokes = 0;
  uint64_t revokes_waited = 0;      // a read was in flight: answered on landing
  uint64_t releases_sent = 0;
  uint64_t releases_skipped_live = 0;  // unstarted release of a live load's id
  uint64_t producers_given_up = 0;
  uint64_t producers_lost = 0;
  uint64_t stale_read_done = 0;
};

class ReadLoadTable {
 public:
  explicit ReadLoadTable(const ReadLoadTableOptions& options);
  ReadLoadTable(const ReadLoadTable&) = delete;
  ReadLoadTable& operator=(const ReadLoadTable&) = delete;

  // As LoadTable::Start: heartbeats go to every producer now.
  Status Start(RequestId request, TransferId transfer, std::span<const PeerId> producers,
               std::vector<BlockId> dst, Instant now, uint64_t prompt_hash = 0);
  // The request went away. True if a load was live (its blocks stay held
  // until LoadReleased: a read may be landing in them).
  bool Release(RequestId request, Instant now);
  // The request ended before D allocated blocks: tell its producers.
  // (`prompt_hash` is accepted for LoadTable's signature; notices carry none.)
  void ReleaseUnstarted(TransferId transfer, std::span<const PeerId> producers,
                        uint64_t prompt_hash = 0);
  void AbortAll(Instant now);

  void OnGrant(PeerId peer, const GrantLease& grant, Instant now);
  // `reason`: why P ends the lease; kReset (P's cache reset) cuts the load
  // short — it recomputes whatever the failure policy.
  void OnRevoke(PeerId peer, TransferId transfer, TransferResult reason, Instant now);
  void OnReadDone(ReadId read, bool ok, Instant now);
  // Reconnected: heartbeat that peer's unfinished producers now.
  void ResendTo(PeerId peer, Instant now);
  // That incarnation is dead: its producers fail (a read in flight from it
  // still lands or fails first).
  void PeerGone(PeerId peer, Instant now);

  void OnTimer(Instant now);
  std::optional<Instant> NextDeadline() const;
  std::optional<ReadLoadAction> PollAction();

  bool IsLoading(RequestId request) const { return by_request_.count(request) != 0; }
  size_t live_loads() const { return by_transfer_.size(); }
  uint32_t reads_in_flight() const { return reads_in_flight_; }
  std::vector<LoadView> Loads() const;
  const ReadLoadTableStats& stats() const { return stats_; }
  void CheckInvariants() const;

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  enum class PState : uint8_t { kAsking, kReading, kFinished };
  struct Sent {
    uint64_t seq;
    Instant at;
  };
  struct Producer {
    PeerId peer;
    PState state = PState::kAsking;
    TransferResult result = TransferResult::kOk;
    bool stop = false;          // revoked / P ended / gone while reading
    Instant lease_view;         // lower bound of P's expiry (granted only)
    std::deque<Sent> outstanding;
  };
  struct Load {
    bool used = false;
    uint32_t generation = 0;
    RequestId request;
    TransferId transfer;
    std::vector<Producer> producers;
    std::vector<BlockId> dst;
    uint64_t prompt_hash = 0;
    bool failed = false;
    TransferResult first_error = TransferResult::kOk;
    bool released = false;
    bool cut_short = false;
    Instant started;
    Instant giveup;
    Instant next_heartbeat;
    uint32_t next_free = kNil;
  };

  // --- the transitions ---
  void FinishProducer(uint32_t slot, Producer& p, TransferResult result);
  void FinishIfComplete(uint32_t slot);
  void StopProducer(uint32_t slot, Producer& p, TransferResult result,
                    std::optional<ReadNotice> notice);

  // --- helpers ---
  void Heartbeat(Load& load, Producer& p, Instant now);
  void Arm(uint32_t slot);
  Producer* FindProducer(Load& load, PeerId peer);
  ReadId ReadIdOf(uint32_t slot, uint32_t producer, uint32_t generation) const;
  // The notice a producer whose read has landed (or never started) owes P.
  ReadNotice EndNotice(const Load& load, const Producer& p, bool read_ok) const;

  const ReadLoadTableOptions options_;
  std::vector<Load> loads_;
  uint32_t free_loads_ = kNil;
  FlatMap<TransferId, uint32_t> by_transfer_;
  FlatMap<RequestId, uint32_t> by_request_;
  TimerHeap timers_;   // key: load slot; min(next heartbeat, give-up)
  uint64_t next_seq_ = 1;
  uint32_t reads_in_flight_ = 0;
  std::deque<ReadLoadAction> actions_;
  ReadLoadTableStats stats_;
};

}  // namespace kvrelay
