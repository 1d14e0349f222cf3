// connector_scheduler.h — ConnectorScheduler: the scheduler half of the
// connector, one per engine.
//
// Why: an engine's scheduler must not care how KV moves; it asks a few
// questions at fixed points of a request's life (admission, block
// allocation, finish) and learns, once per step, which requests' transfers
// ended. This class answers those questions with the shape of vLLM's
// KVConnectorBase_V1 scheduler side, so a real engine could adopt it:
//
//   vLLM hook                          here
//   get_num_new_matched_tokens         RemotePrefill(request)
//   update_state_after_alloc           OnBlocksAllocated(request, blocks)
//   build_connector_meta               BuildMetadata()
//   request_finished -> delay_free     RequestFinished(request, blocks, aborted)
//   update_connector_output            OnRankReport(rank, report)
//   abort_transfers (new)              AbortTransfers()
//
// It aggregates the ranks' reports so that the engine sees each request id
// exactly once per kind, and only after every rank reported it: blocks are
// shared by all ranks' pools, so they can be freed only when the last rank
// is done with them.
//
// Per request (role P):  CLAIMED --finished--> HELD --all ranks sent--> gone
//                        CLAIMED --aborted--> gone (nothing was handed over)
//   streaming (push):    CLAIMED --chunk--> STREAMING --finished/aborted--> HELD
//                        STREAMING --preempted--> ABANDONED --all ranks--> gone
//                        (a rank may end its send early: counted, and once
//                        all have, the finished request frees at once)
// Per request (role D):  AWAITING_ALLOC --alloc--> LOADING --all ranks--> gone
//                        LOADING --finished--> RELEASING --all ranks--> gone
//                        AWAITING_ALLOC --finished--> gone (release sent)
//
// Ownership and threading: owned by the engine actor; called from its
// thread only. Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "base/transfer_id.h"
#include "core/connector_metadata.h"
#include "core/rank_connector.h"
#include "core/request_id.h"

namespace kvrelay {

// What the router attaches to a request (vLLM's kv_transfer_params).
struct KvTransferParams {
  TransferId transfer;
  bool do_remote_decode = false;   // P: hold the KV for a remote decoder
  bool do_remote_prefill = false;  // D: load the KV from a remote prefiller
  uint32_t remote_engine = 0;      // D: the producer engine
  uint32_t remote_tp = 1;          // D: producer tp; P: consumer tp
  // P: the D engine the KV is handed to (kv_transfer_params
  // consumer_engine_id); UINT32_MAX: not named, the first D engine to pull
  // binds it (SendTable::Claim).
  uint32_t consumer_engine = UINT32_MAX;
  // Fingerprint of the prompt's tokens, computed by each engine from the
  // prompt it has; P and D must agree or the pull is refused.
  uint64_t prompt_hash = 0;
};

struct ConnectorSchedulerOptions {
  ConnectorRole role = ConnectorRole::kBoth;
  uint32_t tp = 1;
  uint32_t engine_id = 0;
};

// A load outcome the engine acts on.
struct LoadOutcome {
  RequestId request;
  bool ok = false;
  bool cut_short = false;
  // ok: the producer's first token, if every rank's load agreed on one
  // (core/first_token.h); kNoFirstToken otherwise.
  uint32_t first_token = kNoFirstToken;
};

// What became final across all ranks since the last call.
struct EngineFinished {
  std::vector<RequestId> sending_done;   // P: free the held blocks
  std::vector<LoadOutcome> recving_done; // D: load ended (ok or failed)
  std::vector<RequestId> released;       // D: free the released blocks
  // P: blocks parked when a streaming request was preempted (StreamPreempted)
  // are read by no rank any more: free them.
  std::vector<RequestId> unparked;
};

struct ConnectorSchedulerStats {
  uint64_t duplicate_transfer_rejected = 0;
  uint64_t stale_reports = 0;   // a load report for a request released since
};

class ConnectorScheduler {
 public:
  explicit ConnectorScheduler(const ConnectorSchedulerOptions& options);

  // Admission. P with do_remote_decode: claims the transfer. D with
  // do_remote_prefill: remembers where to load from. Either way
  // kAlreadyExists if a live request of that role holds the same
  // transfer_id — the first one is left alone.
  // kInvalidArgument for params the role cannot serve.
  Status AdmitRequest(RequestId request, const KvTransferParams& params);

  // D: does this request load its prompt's KV remotely (and still wait)?
  bool RemotePrefill(RequestId request) const;

  // D: blocks for the remote KV are allocated; the load starts next step.
  // A non-zero `prompt_hash` replaces the one given at admission (the
  // engine's weights may have changed since).
  void OnBlocksAllocated(RequestId request, std::vector<BlockId> blocks,
                         uint64_t prompt_hash = 0);

  // The request finished (aborted or not) with `blocks`. Returns true when
  // the engine must keep the blocks until OnRankReport surfaces the request
  // (sending_done or released); false when it may free them now.
  // P: `prompt_hash` fingerprints the KV in `blocks` (0: the admission's);
  // `first_token` is the token P computed from it, handed to D with the KV.
  bool RequestFinished(RequestId request, std::span<const BlockId> blocks,
                       bool aborted, uint64_t prompt_hash = 0,
                       uint32_t first_token = kNoFirstToken);

  // P, chunk-wise hand-off: the running request's first prefix.size() of
  // its prompt's `total_blocks` blocks hold finished KV (computed under the
  // weights `prompt_hash` fingerprints, 0: the admission's). The ranks may
  // read them from now on, so from the first call RequestFinished keeps
  // the blocks (returns true) until every rank is done with them. A prefix
  // no longer than the last one's, a request whose send every rank ended,
  // or one not claimed or streaming is ignored. True if a chunk went out.
  bool PrefillProgress(RequestId request, std::span<const BlockId> prefix,
                       uint32_t total_blocks, uint64_t prompt_hash = 0);

  // P: a streaming request is preempted (it gives its blocks back and
  // recomputes). Its send ends on every rank; the engine parks the blocks
  // handed over until EngineFinished::unparked names the request. True if
  // the engine must park them; false (nothing handed over) if it may free.
  // The request's hand-off is over: the recompute hands nothing over.
  bool StreamPreempted(RequestId request);

  // P: an already-finished request whose KV is held is aborted
  // (abort_requests on it): end its send now.
  void AbortHeld(RequestId request);

  // abort_transfers(): every rank ends every transfer this engine holds.
  void AbortTransfers() { pending_.abort_all = true; }

  ConnectorMetadata BuildMetadata();
  EngineFinished OnRankReport(uint32_t rank, const RankReport& report);

  size_t held_sends() const;
  size_t live_loads() const;
  bool Idle() const { return requests_.empty(); }
  const ConnectorSchedulerStats& stats() const { return stats_; }
  void CheckInvariants() const;

 private:
  enum class Phase : uint8_t {
    kClaimed, kStreaming, kHeld, kAbandoned,  // P
    kAwaitingAlloc, kLoading, kReleasing,   // D
  };
  struct Entry {
    Phase phase;
    KvTransferParams params;
    uint32_t reports = 0;   // ranks that reported the awaited event
    bool load_ok = true;
    bool cut_short = false;
    uint32_t first_token = kNoFirstToken;  // what the ranks' loads agreed on
    uint32_t streamed = 0;  // P: blocks handed over (ProgressOp)
  };
  static bool Sending(Phase phase) {
    return phase == Phase::kClaimed || phase == Phase::kStreaming || phase == Phase::kHeld ||
           phase == Phase::kAbandoned;
  }

  const ConnectorSchedulerOptions options_;
  std::unordered_map<RequestId, Entry> requests_;
  // Removes a request and its transfer index entry.
  void Erase(std::unordered_map<RequestId, Entry>::iterator it);

  std::unordered_map<TransferId, RequestId> sending_;    // P: transfer → req
  std::unordered_map<TransferId, RequestId> receiving_;  // D: transfer → req
  ConnectorMetadata pending_;
  ConnectorSchedulerStats stats_;
};

}  // namespace kvrelay
