// send_table.h — SendTable: P's side of every KV hand-off, for one P rank.
//
// Theory of operation
// -------------------
// A prefill engine (P) runs a prompt, then holds the prompt's KV blocks until
// every decode rank (D) that needs them has pulled them. Each D rank pulls:
// "write the KV of transfer T into my blocks B". Pulls race with everything:
// a pull may arrive before P has even seen the request, P may abort the
// request while D waits, D may give up and release, the prefill may finish
// long after the pull arrived, a write may fail or finish after an abort.
// vLLM's Mooncake connector wedged D for 480 s on several of these orders
// (a silent abort, head-of-line blocking of its sender pool, a KeyError);
// vllm-ascend freed blocks twice when D's "pulled" notice and the
// scheduler's timeout release met. This table is the one place those races
// are decided, and it decides them so that:
//
//   * every (pull, transfer) item gets exactly one answer, promptly — nothing
//     waits out a timeout to learn what is already known;
//   * P's blocks are released exactly once (one SendFinished action per
//     transfer whose Ready() was accepted), and never while a write reads
//     them;
//   * no write starts after its pull's deadline, so none lands after D could
//     have given up and reused its blocks.
//
// States per transfer_id (one `Send` record):
//
//   WAITING  P is running the request (claimed), or only pulls have arrived
//            (a placeholder, unclaimed). No blocks held. Pulls wait.
//   READY    Prefill done; P holds the blocks. Pulls are admitted, in
//            arrival order, to at most `num_workers` concurrent writes.
//   STREAMING  P is still running the request but has handed over the
//            blocks of its finished prompt chunks (Progress); pulls are
//            served chunk by chunk as those blocks come. Blocks held; no
//            expiry (the request is running), each pull keeps its deadline.
//   DONE     Nothing more will be sent. The record lingers only while writes
//            are in flight; the blocks are released when the last one ends.
//
//   claim:  (none) -> WAITING(claimed); placeholder -> WAITING(claimed)
//   progress: WAITING(claimed) -> STREAMING; STREAMING -> STREAMING (more)
//   ready:  WAITING(claimed) | STREAMING -> READY (arms expiry: now + abort_timeout)
//   pull:   (none) -> WAITING(placeholder)   (arms expiry: now + abort_timeout)
//   release | abort | release_held (READY, STREAMING) | expire
//           | write failed | deadline | progress under other weights
//           | every needed D rank pulled:    any live state -> DONE via EndSend
//
// EndSend() is the only function that moves a send to DONE. It answers every
// pull item still waiting on the send, leaves a tombstone (unless the send
// ended because everyone pulled), and releases the blocks once no write is
// in flight. Releases, "pulled", expiry and aborts therefore commute: the
// first one to reach EndSend wins; the others find DONE or a tombstone and
// do nothing but answer.
//
// Streaming (chunk-wise hand-off): a pull item is answered once, after the
// write of its last block; before that it may be written in several
// chunks, one write in flight at a time, each admitted to a sender like
// any write (deadline re-checked). An item answers kOk only after READY:
// no D load completes on a partial transfer. A chunk write that ends after
// the send ended answers the end's reason, not kOk. The first accepted
// Progress is the hold: SendFinished is owed from then on, exactly as after
// Ready, so P's engine frees a streamed request's blocks only after it —
// never while a chunk write reads them, whatever ends the send.
//
// Resent pulls: after a reconnect D resends its unanswered pulls with the
// same sequence numbers (messages in flight on a broken connection are
// lost). A resent item that is still live is ignored (its answer comes);
// one already answered gets the same answer again, from a bounded memory
// of recent answers (same count bound and age as tombstones). So an answer
// is decided exactly once and may be re-sent, never changed.
//
// Tombstones remember how a transfer ended, so a late pull or a late claim
// fails fast instead of waiting or resurrecting it. They are bounded in
// count (`max_tombstones`, oldest dropped first) and kept for
// abort_timeout + giveup_grace, which is at least D's give-up time.
//
// Pull items: each (pull, transfer) is tracked on its own (no head-of-line
// blocking). An item waiting for the prefill or for a sender holds nothing
// and has a deadline (now + abort_timeout at arrival); the deadline is
// checked again when a sender is taken, so a write never starts late. A
// deadline that passes ends the transfer: D fails the load on that answer
// anyway. Items of a batch whose transfer already ended are answered before
// any write of that batch is admitted.
//
// Complexity: every input is O(1) amortized plus O(log n) for the timer
// heaps, in the number of transfers in flight, except ReleaseHeld (O(n) by
// nature) and CheckInvariants (O(n), for tests and the simulator).
//
// Ownership and threading: a SendTable is owned by the connector actor of
// one P rank and called from that actor's thread only. It performs no I/O,
// reads no clock and allocates only from its own slabs; time arrives as
// `now`, effects leave as actions drained by PollAction().
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <variant>
#include <vector>

#include "base/flat_map.h"
#include "base/slot_index.h"
#include "base/result.h"
#include "base/status.h"
#include "core/first_token.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "base/typed_id.h"
#include "core/block_id.h"
#include "core/messages.h"
#include "core/timer_heap.h"
#include "core/transfer_result.h"

namespace kvrelay {

// Claim()'s "no D engine named yet": the first D engine to pull binds it.
inline constexpr uint32_t kAnyConsumerEngine = UINT32_MAX;

// Names one (pull, transfer) item; it is also the id of the write that
// serves it, so a write completion names exactly the item it belongs to.
using WriteId = TypedId<struct PullItemTag>;

struct SendTableOptions {
  // How long a READY send waits to be pulled, and a pull waits for its
  // prefill and a sender. vLLM's VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT.
  Duration abort_timeout = Duration::Seconds(480);
  // D gives up this long after a pull's deadline.
  Duration giveup_grace = Duration::Seconds(60);
  // At most this many writes in flight on this rank.
  uint32_t num_workers = 4;
  // Bounds: a peer cannot grow the table without limit.
  uint32_t max_sends = 1u << 20;          // live sends incl. placeholders
  uint32_t max_pull_items = 1u << 20;     // items waiting or writing
  uint32_t max_tombstones = 1u << 20;
  uint32_t max_items_per_pull = 4096;
  uint32_t max_blocks_per_item = 1u << 16;
};

// --- Actions (effects for the driver) -------------------------------------

// Send `result` for (pull, transfer) back to the D rank `peer`.
struct AnswerPull {
  PeerId peer;
  uint64_t pull_seq = 0;
  TransferId transfer;
  TransferResult result = TransferResult::kOk;
  // kOk from a live send: the first token its Ready() named (core/first_token.h).
  uint32_t first_token = kNoFirstToken;
};

// Copy P's `src` blocks into D's `dst` blocks (same count, in order), then
// report WriteDone(write, ok). The writer must not start after `deadline`;
// if it would, it reports WriteDone(write, false) without writing.
struct StartWrite {
  WriteId write;
  PeerId peer;
  uint64_t pull_seq = 0;
  TransferId transfer;
  std::vector<BlockId> src;
  std::vector<BlockId> dst;
  Instant deadline;
};

// No write reads the blocks of `transfer` any more: P's engine may free
// them. Emitted exactly once per transfer whose Ready() was accepted.
struct SendFinished {
  TransferId transfer;
  TransferResult reason = TransferResult::kOk;
};

using SendAction = std::variant<AnswerPull, StartWrite, SendFinished>;

enum class SendState : uint8_t { kWaiting, kStreaming, kReady, kDone };
const char* SendStateName(SendState state);

// One live send as observers (/debug/state) see it.
struct SendView {
  TransferId transfer;
  SendState state = SendState::kWaiting;
  Instant created;             // first seen (claim, or a pull before it)
  uint32_t need = 0;           // D ranks that must pull from this rank
  uint32_t pulled = 0;         // of them, pulls answered ok
  uint32_t writes_in_flight = 0;
  uint32_t blocks = 0;         // blocks held (READY and later)
  uint32_t items = 0;          // pull items waiting, queued or writing
};

struct SendTableStats {
  uint64_t claims = 0;
  uint64_t claims_rejected_duplicate = 0;
  uint64_t claims_after_end = 0;
  uint64_t readies = 0;
  uint64_t readies_refused = 0;
  uint64_t streams = 0;           // sends whose first Progress was accepted
  uint64_t progresses = 0;        // Progress calls that handed over more blocks
  uint64_t progresses_refused = 0;
  uint64_t chunk_writes = 0;      // writes of part of an item (streaming)
  uint64_t ended_streaming = 0;   // sends ended while STREAMING
  uint64_t pull_items = 0;
  uint64_t releases = 0;
  uint64_t placeholders = 0;
  uint64_t answered_from_tombstone = 0;
  uint64_t answers[kTransferResultCount] = {};
  uint64_t ends[kTransferResultCount] = {};
  uint64_t writes_started = 0;
  uint64_t writes_ok = 0;
  uint64_t writes_failed = 0;
  uint64_t writes_done_after_end = 0;
  uint64_t stale_write_done = 0;
  uint64_t deadline_at_admission = 0;
  uint64_t deadline_timer = 0;
  uint64_t tombstones_evicted = 0;
  uint64_t items_rejected = 0;
  uint64_t aborts_unknown = 0;
  uint64_t prompt_mismatch = 0;   // pulls refused: another prompt's transfer
  uint64_t duplicate_items = 0;   // resent while still live: ignored
  uint64_t reanswered = 0;        // resent after the answer: same answer again
  // Access control (docs/design.md, "Access control"): pull items refused
  // because another D engine's pull (or the claim) bound the transfer, and
  // placeholders that expired without P ever claiming their transfer.
  uint64_t refused_wrong_engine = 0;
  uint64_t unknown_transfer_expired = 0;
};

class SendTable {
 public:
  explicit SendTable(const SendTableOptions& options);
  SendTable(const SendTable&) = delete;
  SendTable& operator=(const SendTable&) = delete;

  // P's scheduler admits a request that will be decoded remotely. `need` is
  // the number of D ranks that must pull from this P rank (>= 1).
  // `prompt_hash` fingerprints the prompt (0: pulls are not checked).
  // `consumer_engine`: the D engine the transfer is handed to, if known
  // (else the first D engine whose pull or release names it binds it).
  // Pulls and releases from any other D engine are refused (kRejected) and
  // counted; pulls that arrived first from another engine are refused now.
  // Errors: kAlreadyExists if a live send has this id (the first one is
  // untouched); kCancelled if the transfer already ended (D released it
  // before P saw it); kResourceExhausted over max_sends.
  Status Claim(TransferId transfer, uint32_t need, Instant now,
               uint64_t prompt_hash = 0, uint32_t consumer_engine = kAnyConsumerEngine);

  // Prefill finished: P hands over the request's blocks (in prompt order).
  // On OK the table owns the hold and will emit SendFinished exactly once.
  // A non-zero `prompt_hash` fingerprints the KV actually handed over (the
  // weights it was computed with may differ from the claim's): it replaces
  // the claim's, and pulls already waiting are checked against it.
  // REQUIRES: Ready() was not accepted before for this transfer.
  // On error P keeps ownership and frees the blocks itself: kCancelled if
  // the transfer already ended (released, aborted, deadline) or if
  // `prompt_hash` differs from the claim's (the KV was computed under other
  // weights than claimed: the send ends, kRejected) — the engine frees at
  // once; kFailedPrecondition if it was never claimed;
  // kInvalidArgument if `blocks` is empty. `first_token` (kNoFirstToken:
  // none) is the token P computed from this KV; every ok answer carries it.
  Status Ready(TransferId transfer, std::vector<BlockId> blocks, Instant now,
               uint64_t prompt_hash = 0, uint32_t first_token = kNoFirstToken);

  // Chunk-wise hand-off: the request is still running, and `prefix` — the
  // first blocks of the `total_blocks` its prompt will have, in prompt
  // order — now hold finished KV. Each call hands over a longer prefix of
  // the same blocks (a shorter or equal one is a no-op); Ready() later
  // hands over all `total_blocks`. The first accepted call makes the table
  // own the hold, exactly as Ready() does: SendFinished is emitted once,
  // even if the send ends before Ready (then Ready is refused). Errors as
  // Ready's, plus kInvalidArgument if `prefix` is empty or longer than
  // `total_blocks`; a `prompt_hash` other than the send's (a weights update
  // between chunks) ends the send (kMismatch) and returns kCancelled.
  // REQUIRES: Ready() was not accepted for this transfer; `prefix` extends
  // the previous one; `total_blocks` is the same in every call.
  Status Progress(TransferId transfer, std::span<const BlockId> prefix,
                  uint32_t total_blocks, Instant now, uint64_t prompt_hash = 0);

  // P aborts the request (before scheduling, while running or after ready).
  // An unknown transfer gets a tombstone so a later pull fails fast.
  // `reason`: kAborted, or kReset for a streamed request P preempted (it
  // gave its blocks back; D recomputes whatever its failure policy).
  void Abort(TransferId transfer, Instant now,
             TransferResult reason = TransferResult::kAborted);

  // The engine's abort-transfers hook, for a cache reset: ends every send
  // that holds blocks (READY, STREAMING; kReset: D recomputes, whatever its
  // failure policy) so P gets its blocks back. Sends that hold none
  // (WAITING: claimed or placeholders) go on.
  void ReleaseHeld(Instant now);

  // A pull from D rank `peer`, carrying one or more transfers.
  void Pull(PeerId peer, uint64_t pull_seq, std::span<const PullItem> items,
            Instant now);

  // A write started by StartWrite finished. A stale id is counted, dropped.
  void WriteDone(WriteId write, bool ok, Instant now);

  // Fires expiries, pull deadlines and tombstone ageing due at `now`.
  void OnTimer(Instant now);
  std::optional<Instant> NextDeadline() const;

  std::optional<SendAction> PollAction();

  // Observers, for tests, metrics and the simulator.
  std::optional<SendState> StateOf(TransferId transfer) const;
  bool HasTombstone(TransferId transfer) const {
    return tombstones_.count(transfer) != 0;
  }
  size_t live_sends() const { return index_.size(); }
  // Every live send, in slot order. O(sends); for observers, not hot paths.
  std::vector<SendView> Sends() const;
  size_t live_pull_items() const { return live_items_; }
  size_t tombstones() const { return tombstones_.size(); }
  uint32_t writes_in_flight() const { return writes_in_flight_; }
  size_t queued_for_sender() const { return admission_.size; }
  const SendTableStats& stats() const { return stats_; }
  const SendTableOptions& options() const { return options_; }

  // O(n) structural check: every link, count and timer agrees with the
  // records. KV_CHECK-fails on any violation.
  void CheckInvariants() const;

 private:
  static constexpr uint32_t kNil = UINT32_MAX;

  // Intrusive doubly-linked list over item slots.
  struct List {
    uint32_t head = kNil;
    uint32_t tail = kNil;
    uint32_t size = 0;
  };
  struct Links {
    uint32_t prev = kNil;
    uint32_t next = kNil;
  };

  enum class ItemState : uint8_t { kFree, kWaiting, kQueued, kWriting };

  struct Item {
    ItemState state = ItemState::kFree;
    uint32_t generation = 0;
    uint32_t send = kNil;     // owning send slot
    PeerId peer;
    uint64_t pull_seq = 0;
    Instant deadline;
    std::vector<BlockId> dst;
    uint32_t want = 0;        // dst blocks asked for (dst itself moves to the last write)
    uint32_t sent = 0;        // dst[0, sent) written (streaming: in chunks)
    uint32_t writing_to = 0;  // kWriting: this write covers dst[sent, writing_to)
    uint64_t prompt_hash = 0;
    Links in_send;            // on Send::items (waiting, queued or writing)
    Links in_queue;           // on admission_ (queued only)
    uint32_t next_free = kNil;
  };

  struct Send {
    bool used = false;
    uint32_t generation = 0;
    TransferId transfer;
    SendState state = SendState::kWaiting;
    Instant created;
    bool claimed = false;
    bool holds_blocks = false;   // Progress() or Ready() accepted; SendFinished owed
    bool readied = false;        // Ready() accepted: `blocks` is the whole prompt
    uint32_t total_blocks = 0;   // the prompt's blocks (streaming; Ready sets it too)
    TransferResult end_reason = TransferResult::kOk;
    uint32_t need = 0;
    uint32_t pulled = 0;
    uint64_t prompt_hash = 0;    // set by Claim
    uint32_t first_token = kNoFirstToken;  // set by Ready
    uint32_t consumer = kAnyConsumerEngine;  // the D engine bound to it
    uint32_t writes_in_flight = 0;
    std::vector<BlockId> blocks;
    List items;
    uint32_t next_free = kNil;
  };

  struct Tombstone {
    TransferId transfer;
    Instant created;
  };

  // --- the transitions ---
  void EndSend(uint32_t s, TransferResult reason, Instant now);
  void MaybeRelease(uint32_t s);
  void AdmitWrites(Instant now);
  void OnItemDeadline(uint32_t i, Instant now);
  // Streaming: how many of item `i`'s dst blocks have KV at P now.
  uint32_t Available(uint32_t i) const;
  // Blocks handed over: a pull that waited with another fingerprint ends
  // the send (kMismatch; see Pull). True if it did.
  bool EndedOnMismatchedPull(uint32_t s, Instant now);
  // A waiting item with blocks to write joins the admission queue.
  void QueueIfAvailable(uint32_t i);

  // --- helpers ---
  // Ready's and Progress's refusals (unknown, ended, unclaimed): the live
  // claimed send's slot, or the error (counted in `refused`).
  Result<uint32_t> HandOverTarget(TransferId transfer, const char* what, uint64_t& refused);
  // The answer for an item of a DONE send that did not get all its blocks.
  static TransferResult EndAnswer(const Send& send) {
    return send.end_reason == TransferResult::kOk ? TransferResult::kAlreadyPulled
                                                  : send.end_reason;
  }
  uint32_t NewSend(TransferId transfer, Instant now);
  void FreeSend(uint32_t s);
  uint32_t NewItem(uint32_t s, PeerId peer, uint64_t pull_seq,
                   const PullItem& pulled, Instant now);
  static bool PromptMatches(uint64_t send_hash, uint64_t item_hash) {
    return send_hash == 0 || item_hash == 0 || send_hash == item_hash;
  }
  void AnswerItem(uint32_t i, TransferResult result);
  void FreeItem(uint32_t i);
  void Answer(PeerId peer, uint64_t seq, TransferId t, TransferResult r,
              uint32_t first_token = kNoFirstToken);
  void AddTombstone(TransferId transfer, TransferResult reason, Instant now);
  void PruneTombstones(Instant now);
  static uint64_t ItemKey(PeerId peer, uint64_t seq, TransferId t);
  Duration TombstoneTtl() const {
    return options_.abort_timeout + options_.giveup_grace;
  }
  // Looks up how an ended transfer ended: a DONE send or a tombstone.
  std::optional<TransferResult> EndedAs(TransferId transfer) const;
  void HandleRelease(const PullItem& item, PeerId peer, uint64_t seq, Instant now);
  // Binds send `s` to `peer`'s engine if unbound; false (counted) if it is
  // bound to another engine.
  bool BindConsumer(uint32_t s, PeerId peer);

  template <Links Item::*L>
  void ListPush(List& list, uint32_t i);
  template <Links Item::*L>
  void ListRemove(List& list, uint32_t i);

  const SendTableOptions options_;
  std::vector<Send> sends_;
  uint32_t free_sends_ = kNil;
  // Reads a record's transfer id for index_ (which keeps only tags).
  struct SendKeyOf {
    const std::vector<Send>* sends;
    const TransferId& operator()(uint32_t s) const { return (*sends)[s].transfer; }
  };
  // The live record of `transfer`, or kNil.
  static_assert(kNil == SlotIndex<TransferId>::kNone);
  uint32_t FindSend(TransferId transfer) const {
    return index_.Find(transfer, SendKeyOf{&sends_});
  }
  SlotIndex<TransferId> index_;  // live records
  std::vector<Item> items_;
  uint32_t free_items_ = kNil;
  size_t live_items_ = 0;
  List admission_;                  // items waiting for a sender, FIFO
  uint32_t writes_in_flight_ = 0;   // across all sends; <= num_workers
  TimerHeap expiry_;                // key: send slot
  TimerHeap deadlines_;             // key: item slot
  FlatMap<TransferId, TransferResult> tombstones_;
  std::deque<Tombstone> tombstone_fifo_;  // creation order == expiry order
  FlatMap<uint64_t, uint32_t> live_keys_;  // ItemKey → item slot
  struct Answered {
    uint64_t key;
    Instant at;
  };
  FlatMap<uint64_t, TransferResult> answered_;  // ItemKey → answer
  std::deque<Answered> answered_fifo_;                     // in answer order
  Instant now_;  // of the input being handled (answers are stamped with it)
  std::vector<const PullItem*> pull_rest_;  // Pull()'s scratch, kept for its capacity
  std::deque<SendAction> actions_;
  SendTableStats stats_;
};

}  // namespace kvrelay
