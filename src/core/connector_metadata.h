// connector_metadata.h — what the engine's scheduler tells every rank's
// connector once per step (vLLM's KVConnectorMetadata), and what each rank
// reports back (vLLM's get_finished()).
//
// Why a per-step value: in a real engine the scheduler and the rank workers
// are different processes; the scheduler decides, the ranks act. Each rank
// applies the whole metadata and picks what concerns it. Every rank reports
// each id exactly once; the scheduler surfaces an id only when all ranks
// have (ConnectorScheduler).
#pragma once

#include <cstdint>
#include <vector>

#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/first_token.h"
#include "core/load_table.h"
#include "core/request_id.h"

namespace kvrelay {

// P: a request that will be decoded remotely was admitted.
struct ClaimOp {
  TransferId transfer;
  uint32_t consumer_tp = 1;
  uint64_t prompt_hash = 0;
  uint32_t consumer_engine = UINT32_MAX;  // UINT32_MAX: the first D engine to pull
};
// P (push mode, streaming): the request still runs; `blocks`, the first of
// the `total_blocks` its prompt has, hold finished KV. `first`: no
// ProgressOp of this transfer came before — the rank reports the transfer
// once, for the first ProgressOp or ReadyOp it gets (RankConnector).
struct ProgressOp {
  TransferId transfer;
  std::vector<BlockId> blocks;
  uint32_t total_blocks = 0;
  uint64_t prompt_hash = 0;
  bool first = false;
};
// P: its prefill finished; these blocks (same ids on every rank) hold it.
struct ReadyOp {
  TransferId transfer;
  std::vector<BlockId> blocks;
  uint64_t prompt_hash = 0;   // fingerprint of the KV in `blocks`
  uint32_t first_token = kNoFirstToken;  // the token P computed from it
  bool streamed = false;      // a ProgressOp of this transfer came before
};
// P: the request was aborted (or, `reset`, preempted while it streamed:
// D recomputes whatever its failure policy, as after a cache reset); end
// its send.
struct AbortSendOp {
  TransferId transfer;
  bool reset = false;
};
// D: blocks are allocated; pull the KV from the producer engine's ranks.
struct LoadOp {
  RequestId request;
  TransferId transfer;
  uint32_t producer_engine = 0;
  uint32_t producer_tp = 1;
  std::vector<BlockId> dst;
  uint64_t prompt_hash = 0;
};
// D: the request finished while loading; release its load.
struct ReleaseLoadOp {
  RequestId request;
};
// D: the request finished before blocks were allocated; tell P.
struct ReleaseUnstartedOp {
  TransferId transfer;
  uint32_t producer_engine = 0;
  uint32_t producer_tp = 1;
  uint64_t prompt_hash = 0;
};

struct ConnectorMetadata {
  std::vector<ClaimOp> claims;
  std::vector<ProgressOp> progress;  // applied after claims, before readies
  std::vector<ReadyOp> readies;
  std::vector<AbortSendOp> aborts;
  std::vector<LoadOp> loads;
  std::vector<ReleaseLoadOp> releases;
  std::vector<ReleaseUnstartedOp> unstarted_releases;
  bool abort_all = false;  // abort_transfers(), applied after the rest

  bool empty() const {
    return claims.empty() && progress.empty() && readies.empty() && aborts.empty() &&
           loads.empty() && releases.empty() && unstarted_releases.empty() &&
           !abort_all;
  }
};

// One rank's get_finished(), drained once per engine step.
struct RankReport {
  std::vector<TransferId> finished_sending;  // P: this rank holds it no more
  std::vector<LoadDone> finished_recving;    // D: this rank's load ended
  std::vector<RequestId> released;           // D: released load's blocks free
  bool empty() const {
    return finished_sending.empty() && finished_recving.empty() &&
           released.empty();
  }
};

}  // namespace kvrelay
