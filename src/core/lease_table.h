// lease_table.h — LeaseTable: P's side of every KV hand-off in read mode,
// for one P rank.
//
// Why
// ---
// In read mode (NIXL-like) D copies P's KV out of P's memory one-sided, then
// tells P it is done. P cannot see or stop a read in flight, so it must not
// free (and reuse) the blocks while one may be running — and it must not
// hold them forever for a D that died. vLLM's answer is a lease: P holds
// the blocks for `initial_lease` after the prefill, D's heartbeats extend
// it. vLLM's version has three known faults: D reads with descriptors it
// got through the router, without any proof that the lease is still live;
// an abort or cache reset on P must wait out the whole lease; and the
// reaper stops at the first unexpired entry of an insertion-ordered map,
// although heartbeats make expiry times non-monotonic. This table:
//
//   * grants a read only in answer to D's heartbeat, and the grant says how
//     long the lease still runs (`remaining_ns`, measured at P). D counts
//     that from when it *sent* the heartbeat, which is never later than
//     P's own expiry, so D knows a lower bound of the lease and starts no
//     read that could end after it (ReadLoadTable). A peer P never granted
//     cannot be reading;
//   * ends a lease early by revoking it: P asks every reader that has not
//     said done to stop; a reader answers once its reads in flight have
//     landed, and P frees on the last answer. Only a reader that does not
//     answer makes P wait out the lease — never longer;
//   * keeps expiries in an indexed heap keyed by the current expiry, so
//     every lease that has run out is reaped, whatever its order.
//
// States per transfer_id (one `Lease` record):
//
//   WAITING   claimed, the prefill is running — or a placeholder: D's
//             heartbeat came before P's claim (the router sends both legs
//             at once). No blocks. The latest heartbeat of each D rank
//             waits here and is granted the moment the lease starts, so a
//             load never waits a heartbeat interval for a finished
//             prefill. A placeholder goes away initial_lease after it was
//             made if never claimed (no tombstone: the claim may come).
//   LEASED    prefill done, blocks held until `until`. A heartbeat from one
//             of the `need` D ranks extends `until` to at least
//             now + extension and is answered with the blocks (a grant).
//   REVOKING  the lease is ending (abort, abort_all, release, a failed
//             read) but a granted reader has not said it is done: P waits
//             for its answer or for `until`, which no longer moves.
//   (ended)   SendFinished emitted once if blocks were held; a tombstone
//             remembers how it ended.
//
//   claim:   (none) | placeholder -> WAITING(claimed)
//   heartbeat of an unknown transfer: (none) -> WAITING(placeholder)
//   ready:   WAITING(claimed) -> LEASED           (until = now + initial;
//             waiting heartbeats granted)
//   heartbeat from a reader: LEASED -> LEASED     (until extended)
//   done from all `need` readers: LEASED -> ended (kOk)
//   abort | release_held (LEASED only) | release | read failed: via EndLease:
//             WAITING -> ended; LEASED -> ended if no granted reader is
//             unfinished, else -> REVOKING (revokes sent)
//   revoked | done | failed from the last unfinished reader:
//             REVOKING -> ended
//   until passes: LEASED | REVOKING -> ended (kExpired)
//
// EndLease() is the one place that starts an end and Finish() the one place
// that completes it. Notices (done, failed, release, revoked) are
// idempotent: one from a peer that already finished, or for a transfer
// that ended (a completion after expiry), is dropped and counted.
//
// Ownership and threading: owned by one P rank's connector actor; called
// from its thread only. Pure: no I/O, no clock. O(1) per input plus
// O(log n) timers, except ReleaseHeld (O(n)) and CheckInvariants.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <variant>
#include <vector>

#include "base/flat_map.h"
#include "base/status.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/messages.h"
#include "core/send_table.h"
#include "core/timer_heap.h"
#include "core/transfer_result.h"

namespace kvrelay {

struct LeaseTableOptions {
  // vLLM's NIXL defaults: a 30 s lease, D heartbeats every 5 s, each
  // extending the lease to 20 s from then.
  Duration initial_lease = Duration::Seconds(30);
  Duration extension = Duration::Seconds(20);
  // How long an ended transfer is remembered, so a late heartbeat fails
  // fast. At least D's give-up time (abort_timeout + giveup_grace).
  Duration tombstone_ttl = Duration::Seconds(540);
  uint32_t max_leases = 1u << 20;
  uint32_t max_tombstones = 1u << 20;
};

// --- Actions ----------------------------------------------------------------

// Answer heartbeat `seq` of D rank `peer`.
struct GrantLease {
  PeerId peer;
  uint64_t seq = 0;
  TransferId transfer;
  LeaseAnswer answer = LeaseAnswer::kPending;
  TransferResult result = TransferResult::kOk;  // kEnded: why
  int64_t remaining_ns = 0;                     // kGranted: lease left at P
  std::vector<BlockId> src;                     // kGranted: P's blocks
};

// Ask D rank `peer` to stop reading `transfer` and say so (kRevoked).
struct RevokeLease {
  PeerId peer;
  TransferId transfer;
  TransferResult reason = TransferResult::kAborted;  // why the lease ends
};

using LeaseAction = std::variant<GrantLease, RevokeLease, SendFinished>;

enum class LeaseState : uint8_t { kWaiting, kLeased, kRevoking };
const char* LeaseStateName(LeaseState state);

struct LeaseView {
  TransferId transfer;
  LeaseState state = LeaseState::kWaiting;
  Instant created;
  Instant until;             // LEASED / REVOKING: when the lease runs out
  uint32_t need = 0;
  uint32_t readers = 0;      // D ranks granted
  uint32_t done = 0;         // of them, done (ok)
  uint32_t unfinished = 0;   // granted and not yet finished
  uint32_t blocks = 0;
};

struct LeaseTableStats {
  uint64_t claims = 0;
  uint64_t claims_rejected_duplicate = 0;
  uint64_t claims_after_end = 0;
  uint64_t readies = 0;
  uint64_t readies_refused = 0;
  uint64_t heartbeats = 0;
  uint64_t grants = 0;
  uint64_t extensions = 0;          // grants that moved `until`
  uint64_t pending_answers = 0;
  uint64_t waiting_heartbeats = 0;  // held until the lease starts or ends
  uint64_t placeholders = 0;        // heartbeats before the claim
  uint64_t placeholders_expired = 0;
  uint64_t unknown_heartbeats = 0;  // table full: answered pending, nothing kept
  uint64_t ended_answers = 0;
  uint64_t refused_wrong_engine = 0;
  uint64_t prompt_mismatch = 0;
  uint64_t surplus_readers = 0;     // more distinct D ranks than `need`
  uint64_t notices[4] = {};
  uint64_t notices_after_end = 0;   // e.g. done after the lease expired
  uint64_t notices_stale = 0;       // from a peer that already finished
  uint64_t revokes_sent = 0;
  uint64_t expired = 0;             // leases reaped at `until`
  uint64_t expired_revoking = 0;    //   of them while a revoke went unanswered
  uint64_t ends[kTransferResultCount] = {};
  uint64_t tombstones_evicted = 0;
  uint64_t aborts_unknown = 0;
  // The longest P held a lease's blocks (Ready to the end), in ns: the
  // figure the lease bounds.
  int64_t max_hold_ns = 0;
};

class LeaseTable {
 public:
  explicit LeaseTable(const LeaseTableOptions& options);
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  // As SendTable::Claim. Errors: kAlreadyExists (a live lease has this id),
  // kCancelled (it already ended), kResourceExhausted (max_leases).
  Status Claim(TransferId transfer, uint32_t need, Instant now,
               uint64_t prompt_hash = 0, uint32_t consumer_engine = kAnyConsumerEngine);
  // Prefill finished: the lease starts (until = now + initial_lease). On OK
  // the table owns the blocks and emits SendFinished exactly once. Errors
  // as SendTable::Ready (the engine keeps and frees the blocks).
  Status Ready(TransferId transfer, std::vector<BlockId> blocks, Instant now,
               uint64_t prompt_hash = 0);
  void Abort(TransferId transfer, Instant now);
  // The engine's abort-transfers hook, for a cache reset: ends every LEASED
  // lease (kReset: D recomputes, whatever its failure policy), revoking
  // granted readers. Leases of requests P has not finished (WAITING) go on.
  void ReleaseHeld(Instant now);

  // Heartbeat `seq` from D rank `peer` (the first one asks for the grant).
  void Heartbeat(PeerId peer, uint64_t seq, TransferId transfer, uint64_t prompt_hash,
                 Instant now);
  void Notice(PeerId peer, TransferId transfer, ReadNotice notice, Instant now);

  void OnTimer(Instant now);
  std::optional<Instant> NextDeadline() const;
  std::optional<LeaseAction> PollAction();

  std::optional<LeaseState> StateOf(TransferId transfer) const;
  bool HasTombstone(TransferId transfer) const { return tombstones_.count(transfer) != 0; }
  size_t live_leases() const { return index_.size(); }
  size_t tombstones() const { return tombstones_.size(); }
  std::vector<LeaseView> Leases() const;  // O(n), slot order; observers only
  const LeaseTableStats& stats() const { return stats_; }
  const LeaseTableOptions& options() const { return options_; }
  void CheckInvariants() const;

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  struct Reader {
    PeerId peer;
    bool finished = false;
    bool ok = false;
  };
  struct Waiter {
    PeerId peer;
    uint64_t seq = 0;
    uint64_t prompt_hash = 0;
  };
  static constexpr size_t kMaxWaiters = 64;  // distinct D ranks per lease
  struct Lease {
    bool used = false;
    bool claimed = false;        // false: a placeholder made by heartbeats
    TransferId transfer;
    LeaseState state = LeaseState::kWaiting;
    Instant created;
    Instant ready_at;
    Instant until;
    bool holds_blocks = false;
    TransferResult end_reason = TransferResult::kOk;
    uint32_t need = 0;
    uint32_t done_ok = 0;
    uint64_t prompt_hash = 0;
    uint32_t consumer = kAnyConsumerEngine;
    std::vector<BlockId> blocks;
    std::vector<Reader> readers;
    std::vector<Waiter> waiters;   // WAITING only
    uint32_t next_free = kNil;
  };
  struct Tombstone {
    TransferId transfer;
    Instant created;
  };

  // --- the transitions ---
  void EndLease(uint32_t s, TransferResult reason, Instant now);
  void Finish(uint32_t s, TransferResult reason, Instant now);

  void Wait(Lease& lease, PeerId peer, uint64_t seq, uint64_t prompt_hash);
  void Grant(uint32_t s, PeerId peer, uint64_t seq, Instant now);

  // --- helpers ---
  uint32_t NewLease(TransferId transfer, Instant now);
  Reader* FindReader(Lease& lease, PeerId peer);
  uint32_t Unfinished(const Lease& lease) const;
  void AddTombstone(TransferId transfer, TransferResult reason, Instant now);
  void PruneTombstones(Instant now);
  void Answer(PeerId peer, uint64_t seq, TransferId transfer, LeaseAnswer answer,
              TransferResult result);

  const LeaseTableOptions options_;
  std::vector<Lease> leases_;
  uint32_t free_leases_ = kNil;
  FlatMap<TransferId, uint32_t> index_;
  TimerHeap expiry_;   // key: lease slot; LEASED and REVOKING only
  FlatMap<TransferId, TransferResult> tombstones_;
  std::deque<Tombstone> tombstone_fifo_;
  std::deque<LeaseAction> actions_;
  LeaseTableStats stats_;
};

}  // namespace kvrelay
