// load_table.h — LoadTable: D's side of every KV hand-off, for one D rank.
//
// Theory of operation
// -------------------
// A decode request whose prompt was prefilled elsewhere allocates
// destination blocks, then asks every P rank that holds some of its KV heads
// to write them there (fan-out: homogeneous TP needs one P rank, P tp=2 →
// D tp=1 needs two). Each P rank answers once per pull. The danger is in
// ending early: if D frees its blocks on the first answer — say an error
// from P rank 0 — P rank 1 may still be writing into them, and the next
// request that gets those blocks decodes on a stranger's KV. So:
//
//   * A load ends only when every producer has answered, or D's give-up
//     time (abort_timeout + giveup_grace after the pull) has passed for
//     the ones that did not. P never starts a write after its pull's
//     deadline (abort_timeout), so the grace covers writes in flight.
//   * Success needs every answer ok; any failure is sticky.
//   * Completion is reported exactly once: LoadDone, or LoadReleased when
//     the request went away meanwhile (never both, never twice).
//   * Release: a request that ends while its KV is arriving sends an empty
//     pull to each producer that has not answered (so P ends the send and
//     answers the original pull at once) and keeps its blocks until the
//     original pulls are answered. A request that ends before D allocated
//     anything still tells P (ReleaseUnstarted), so P frees now rather than
//     at expiry.
//   * Giving up on a producer also sends it a release (best effort): if
//     P still holds the send because a message was lost, it frees now
//     rather than at expiry.
//   * abort_transfers() cuts loads short: releases go out as above, but the
//     request stays; its load is reported failed with `cut_short` so the
//     engine recomputes it instead of aborting it.
//   * An answer that matches no live pull — late, duplicated, from an old
//     incarnation, or the answer to a release — is counted and dropped.
//
// States per load: LOADING → (every producer answered or given up) → gone,
// with one flag each for `released` and `cut_short`. The transitions are in
// one place, FinishIfComplete().
//
// Pull sequence numbers: even for pulls, odd for releases, so the answer to
// a release is recognized without any lookup.
//
// Ownership and threading: owned by one D rank's connector actor; called
// from its thread only. Pure: no I/O, no clock; O(1) per input (plus
// O(log n) timers) in the number of loads in flight, except AbortAll and
// PeerGone, which visit every live load by nature (rare, engine-wide).
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
#include "base/status.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/first_token.h"
#include "core/request_id.h"
#include "core/timer_heap.h"
#include "core/transfer_result.h"

namespace kvrelay {

struct LoadTableOptions {
  Duration abort_timeout = Duration::Seconds(480);
  Duration giveup_grace = Duration::Seconds(60);
  uint32_t max_loads = 1u << 20;
  uint32_t max_producers = 64;
};

// --- Actions ----------------------------------------------------------------

// Send a pull to P rank `peer`: write `transfer` into `dst`. Empty `dst` is
// a release.
struct SendPull {
  PeerId peer;
  uint64_t pull_seq = 0;
  TransferId transfer;
  std::vector<BlockId> dst;
  uint64_t prompt_hash = 0;   // the prompt D expects (see PullItem)
  int64_t budget_ns = 0;      // resends: what is left before D gives up
};

// The load of `request` ended; every producer answered or was given up.
// ok: every answer was ok, the KV is in the blocks. !ok: the blocks hold
// garbage; the engine recomputes or fails the request by policy.
struct LoadDone {
  RequestId request;
  TransferId transfer;
  bool ok = false;
  // Cut short by a cache reset — this engine's (AbortAll) or a producer's
  // (it answered kReset): the request recomputes whatever the failure
  // policy; it did nothing wrong.
  bool cut_short = false;
  TransferResult first_error = TransferResult::kOk;
  // ok: the token every producer's answer named, or kNoFirstToken if any
  // answer named none or they differ (core/first_token.h).
  uint32_t first_token = kNoFirstToken;
};

// A released load's producers have all answered: its blocks may be freed.
// Not a completion: the request is already gone.
struct LoadReleased {
  RequestId request;
  TransferId transfer;
};

using LoadAction = std::variant<SendPull, LoadDone, LoadReleased>;

struct LoadTableStats {
  uint64_t loads_started = 0;
  uint64_t loads_ok = 0;
  uint64_t loads_failed = 0;
  uint64_t loads_released = 0;
  uint64_t loads_cut_short = 0;   // incl. loads a producer's reset ended
  uint64_t releases_sent = 0;
  uint64_t releases_unstarted = 0;
  uint64_t answers = 0;
  uint64_t release_answers = 0;
  uint64_t late_answers = 0;       // no live load for that transfer
  uint64_t mismatched_answers = 0; // live load, but not that (peer, seq)
  uint64_t duplicate_answers = 0;  // that producer had answered already
  uint64_t producers_given_up = 0;
  uint64_t producers_lost = 0;     // failed by PeerGone
  uint64_t resent = 0;             // pulls resent after a reconnect
};

// One live load as observers (/debug/state) see it.
struct LoadView {
  RequestId request;
  TransferId transfer;
  Instant started;
  uint32_t producers = 0;
  uint32_t unanswered = 0;
  uint32_t blocks = 0;
  bool failed = false;
  bool released = false;
  bool cut_short = false;
  std::vector<PeerId> waiting_on;  // the producers that have not answered
};

// The checks every load start makes, whatever the mode: 1..max_producers
// distinct producers and at least one destination block.
Status CheckLoadShape(std::span<const PeerId> producers, size_t dst_blocks,
                      uint32_t max_producers);

class LoadTable {
 public:
  explicit LoadTable(const LoadTableOptions& options);
  LoadTable(const LoadTable&) = delete;
  LoadTable& operator=(const LoadTable&) = delete;

  // Starts a load: one pull per producer, all into `dst`.
  // Errors: kAlreadyExists if `request` or `transfer` has a live load;
  // kInvalidArgument if producers or dst is empty or producers repeat or
  // exceed max_producers; kResourceExhausted over max_loads.
  Status Start(RequestId request, TransferId transfer,
               std::span<const PeerId> producers, std::vector<BlockId> dst,
               Instant now, uint64_t prompt_hash = 0);

  // The request finished (abort, disconnect) while its load may be in
  // flight. Returns true if a load was live: its blocks stay held until
  // LoadReleased. False: no load (never started, or already reported) —
  // the caller owns the blocks.
  bool Release(RequestId request, Instant now);

  // The request ends before D allocated blocks: tell its producers.
  void ReleaseUnstarted(TransferId transfer, std::span<const PeerId> producers,
                        uint64_t prompt_hash = 0);

  // abort_transfers(): cut every live load short (see header comment).
  void AbortAll(Instant now);

  // An answer from P rank `peer`.
  void OnAnswer(PeerId peer, uint64_t pull_seq, TransferId transfer,
                TransferResult result, Instant now, uint32_t first_token = kNoFirstToken);

  // The connection to `peer` was re-established: messages in flight on the
  // old one may be lost. Resends every unanswered pull to it with its
  // original sequence number (P answers a resent pull exactly as before,
  // or not at all while it is still live), and the release of a released
  // or cut-short load. A load past its give-up time resends nothing: P
  // remembers its answers for at least that long, and no longer.
  void ResendTo(PeerId peer, Instant now);

  // `peer` (that incarnation) is known dead: it will neither answer nor
  // write again. Its unanswered pulls fail now instead of at give-up.
  // REQUIRES: the caller knows the process is gone (it exited, or a newer
  // incarnation handshook) — a mere disconnect is not enough, since a live
  // P may still be writing.
  void PeerGone(PeerId peer, Instant now);

  void OnTimer(Instant now);
  std::optional<Instant> NextDeadline() const;
  std::optional<LoadAction> PollAction();

  bool IsLoading(RequestId request) const {
    return by_request_.count(request) != 0;
  }
  size_t live_loads() const { return by_transfer_.size(); }
  // Every live load, in slot order. O(loads); for observers.
  std::vector<LoadView> Loads() const;
  const LoadTableStats& stats() const { return stats_; }
  void CheckInvariants() const;

  static bool IsReleaseSeq(uint64_t pull_seq) { return (pull_seq & 1) != 0; }

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  struct Producer {
    PeerId peer;
    uint64_t pull_seq = 0;
    bool answered = false;
    TransferResult result = TransferResult::kOk;
  };
  struct Load {
    bool used = false;
    RequestId request;
    TransferId transfer;
    std::vector<Producer> producers;
    uint32_t unanswered = 0;
    bool failed = false;
    TransferResult first_error = TransferResult::kOk;
    uint32_t first_token = kNoFirstToken;     // what the answers so far agreed on
    bool released = false;
    bool cut_short = false;
    uint64_t prompt_hash = 0;
    std::vector<BlockId> dst;     // kept for resends
    Instant started;
    Instant giveup;
    uint32_t next_free = kNil;
  };

  void Record(uint32_t slot, Producer& p, TransferResult result,
              uint32_t first_token = kNoFirstToken);
  void SendReleases(uint32_t slot);
  void FinishIfComplete(uint32_t slot);
  uint64_t NextSeq(bool release) {
    return (next_seq_++ << 1) | (release ? 1 : 0);
  }

  const LoadTableOptions options_;
  std::vector<Load> loads_;
  uint32_t free_loads_ = kNil;
  // Reads a record's transfer id for by_transfer_ (which keeps only tags).
  struct LoadKeyOf {
    const std::vector<Load>* loads;
    const TransferId& operator()(uint32_t s) const { return (*loads)[s].transfer; }
  };
  // The live load of `transfer`, or kNil.
  static_assert(kNil == SlotIndex<TransferId>::kNone);
  uint32_t FindLoad(TransferId transfer) const {
    return by_transfer_.Find(transfer, LoadKeyOf{&loads_});
  }
  SlotIndex<TransferId> by_transfer_;
  // The engine hands out RequestIds in sequence (index = a counter), so
  // homed by index the loads started last sit in adjacent slots: Start's
  // request lookup stays in cache with 100,000 loads in flight.
  struct RequestIndexHash {
    static constexpr bool kSequentialKeys = true;
    size_t operator()(RequestId r) const { return r.index; }
  };
  FlatMap<RequestId, uint32_t, RequestIndexHash> by_request_;
  TimerHeap giveup_;  // key: load slot
  uint64_t next_seq_ = 1;
  std::deque<LoadAction> actions_;
  LoadTableStats stats_;
};

}  // namespace kvrelay
