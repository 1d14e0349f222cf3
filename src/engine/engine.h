// engine.h — Engine: the emulated serving engine that P and D both run.
//
// Theory of operation
// -------------------
// A scheduler with continuous batching under a token budget: each step
// first advances running requests (chunked prefill, then one token per
// decode), preempting the newest running request (recompute) when the pool
// runs out of blocks, then admits waiting requests in arrival order, using
// the prefix cache (blocks keyed by the hash chain of tokens and the weights
// version). A request's KV lives in blocks of the engine's BlockPool and is
// written to and read from KvMemory, so the next token depends on the KV
// actually present (model.h).
//
// Roles: a producer runs the prompt of a `do_remote_decode` request, emits
// its first token and hands its blocks to the connector (held until every D
// rank pulled them); a consumer loads a `do_remote_prefill` request's KV
// from its producer, then decodes; `both` serves either; `plain` transfers
// nothing (the reference engine).
//
// Lifecycle operations (lifecycle.cc) are queued and run one at a time, at
// the start of a step or at a Control() call between steps. Every operation that resets the cache goes through
// one path, ProgressControl():
//   quiesce (abort | wait for the requests computing here to finish — not
//   for KV still to come from P | keep: freeze)
//   → preempt every request that holds KV (it recomputes later, in queue
//     order) and call the connector's abort_transfers() once
//   → wait until transfers have given every block back (cut-short loads
//     are kept as failed loads with 0 computed tokens)
//   → reset the pool, then pause / sleep / release / load new weights.
// Keep pauses without a reset do not wait for exports. resume() fails a
// reset still pending. reset_prefix_cache never raises.
//
// Effects leave as actions (PollAction); time enters as `now`; the engine
// reads no clock and performs no I/O beyond the injected KvMemory.
//
// Ownership and threading: owned by the engine actor; one thread.
// Invariants (CheckInvariants): blocks referenced by requests = blocks the
// pool counts referenced (the prefix cache holds the rest); every request is
// in exactly one queue matching its phase.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "base/status.h"
#include "base/time.h"
#include "core/block_pool.h"
#include "core/connector_scheduler.h"
#include "core/first_token.h"
#include "engine/compute_model.h"
#include "engine/emulated_model.h"
#include "engine/kv_memory.h"
#include "engine/model.h"

namespace kvrelay::engine {

enum class Role : uint8_t { kProducer, kConsumer, kBoth, kPlain };
// kStop: the model ended the output (its end-of-generation token).
enum class FinishReason : uint8_t { kLength, kAborted, kError, kStop };
enum class LoadFailurePolicy : uint8_t { kRecompute, kFail };
enum class PauseMode : uint8_t { kAbort, kWait, kKeep };
enum class EngineState : uint8_t { kActive, kPaused, kSleeping, kKvReleased };

struct EngineOptions {
  uint32_t engine_id = 0;
  uint32_t incarnation = 1;
  Role role = Role::kPlain;
  uint32_t tp = 1;
  ModelShape shape;
  uint32_t num_blocks = 64;
  uint32_t max_batch_tokens = 64;
  uint32_t max_running = 32;
  uint32_t max_waiting = 4096;
  LoadFailurePolicy load_failure_policy = LoadFailurePolicy::kRecompute;
  uint64_t weights_version = 1;
  bool prefix_caching = true;
  // D: emit the first token P handed over with the KV, without a step on
  // it (core/first_token.h); false: compute it from the loaded KV.
  bool producer_first_token = true;
  Duration step_base = Duration::Microseconds(500);
  Duration step_per_token = Duration::Microseconds(20);
  // A request that has produced no token this long after it arrived —
  // queued behind a pause or a sleep, or waiting for KV that does not
  // come — ends with a clean error (FinishReason::kError). Zero: no bound
  // (requests wait for resume / wake_up however long that takes).
  Duration max_queue_wait = Duration::Zero();
  // P, push mode: hand each finished prompt chunk's blocks to the connector
  // while the prefill goes on (ConnectorScheduler::PrefillProgress), so a
  // D pull waiting at P is written chunk by chunk; the last chunk completes
  // the hand-off as without it. Only with a model whose KV is in the blocks
  // as computed (ComputeModel::KvInBlocksAsComputed); others hand off whole.
  bool stream_chunks = false;
};

struct RequestSpec {
  uint64_t client = 0;           // the driver's id, unique per engine life
  std::vector<Token> prompt;
  uint32_t max_tokens = 16;
  KvTransferParams kv;
  Sampling sampling;             // the model's sampling (compute_model.h)
  // Go on past the model's end-of-generation token (vLLM's ignore_eos).
  bool ignore_eos = false;
};

// --- actions ---------------------------------------------------------------
struct TokenOut {
  uint64_t client = 0;
  Token token = 0;
  uint64_t weights_version = 0;  // the weights this token was computed with
};
struct RequestDone {
  uint64_t client = 0;
  FinishReason reason = FinishReason::kLength;
  std::string error;
};
struct MetadataOut {
  ConnectorMetadata meta;
};
struct OpDone {
  uint64_t op = 0;
  bool ok = false;
  std::string detail;
};
using EngineAction = std::variant<TokenOut, RequestDone, MetadataOut, OpDone>;

struct EngineSnapshot {
  EngineState state = EngineState::kActive;
  bool sleeping = false;
  uint64_t weights_version = 0;
  size_t waiting = 0, running = 0, loading = 0, held = 0, releasing = 0;
  size_t blocks_used = 0, blocks_free = 0, blocks_cached = 0;
  size_t pending_ops = 0;
  uint64_t producer_tokens = 0;  // D: first tokens emitted as P computed them
  uint64_t queue_wait_expired = 0;  // requests ended by max_queue_wait
  uint64_t exports_failed = 0;   // P: hand-offs whose KV the model could not export
  uint64_t imports_failed = 0;   // D: landed KV the model refused (a failed load)
  uint64_t chunks_streamed = 0;  // P: finished prompt chunks offered (stream_chunks)
  uint64_t streams_parked = 0;   // P: streaming requests preempted, blocks parked
  KvCopyCosts kv_copy;           // the model's export (P) and import (D) copies
};

class Engine {
 public:
  // `model` computes KV and tokens (compute_model.h); null: the emulated
  // model over `memory`, owned by the engine. REQUIRES: a model that does
  // not share blocks runs with options.prefix_caching off.
  Engine(const EngineOptions& options, KvMemory* memory, ComputeModel* model = nullptr);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Requests. Errors: kInvalidArgument (empty prompt, max_tokens 0, longer
  // than the context, params the role cannot serve), kAlreadyExists
  // (client id or live transfer_id), kResourceExhausted (waiting queue).
  Status AddRequest(RequestSpec spec, Instant now);
  // The client went away: the request finishes as aborted.
  void AbortRequest(uint64_t client);

  // Lifecycle operations; each completes with an OpDone carrying its id.
  uint64_t AbortRequests(std::vector<uint64_t> clients, bool all);
  uint64_t Pause(PauseMode mode, bool clear_cache);
  uint64_t Resume();
  uint64_t Sleep(uint32_t level, PauseMode mode);
  uint64_t WakeUp();
  uint64_t ReleaseKvCacheMemory();
  uint64_t ResetPrefixCache(bool reset_running_requests);
  uint64_t UpdateWeights(uint64_t version, PauseMode mode);
  bool IsSleeping() const { return state_ == EngineState::kSleeping; }
  EngineSnapshot Snapshot() const;

  // One step: rank reports, lifecycle, scheduling, metadata. Returns the
  // modelled duration of the compute it did (zero if none).
  Duration Step(std::span<const RankReport> reports, Instant now);
  // Between steps, while the last step's modelled compute still runs:
  // aborts and lifecycle operations that arrived since take effect, and
  // their connector metadata (a send to abort, a load to release) goes
  // out now instead of at the next step. Schedules nothing and costs no
  // compute: what it does, the next Step would have done first.
  void Control();
  // Control() after ending every request that waited past
  // options.max_queue_wait without producing a token. The runtime calls it
  // while the engine has no step to run (paused, asleep, idle); Step()
  // applies the same bound.
  void Tick(Instant now);
  // True if a step now would do something (requests to run, an operation
  // in progress).
  bool HasWork() const { return dirty_; }
  // No requests and no operations: everything drained.
  bool Idle() const { return requests_.empty() && ops_.empty() && parked_.empty(); }

  std::optional<EngineAction> PollAction();
  const BlockPool& pool() const { return pool_; }
  const ConnectorScheduler& connector() const { return connector_; }
  EngineState state() const { return state_; }
  uint64_t weights_version() const { return weights_; }
  void CheckInvariants() const;

 private:
  enum class Phase : uint8_t {
    kWaiting,        // queued for blocks / compute (incl. preempted)
    kWaitingRemote,  // D: blocks allocated, load in flight
    kRunning,        // computing (prefill chunks, then decode)
    kHeld,           // P: finished; the transfer holds the blocks
    kReleasing,      // D: finished while loading; blocks held until answers
  };
  struct Request {
    uint64_t client = 0;
    RequestId id;
    uint64_t arrival = 0;          // admission order, for queue order
    Instant arrived_at;            // for max_queue_wait
    std::vector<Token> seq;        // prompt then generated tokens
    uint32_t prompt_len = 0;
    uint32_t max_tokens = 0;
    uint32_t generated = 0;
    uint32_t computed = 0;         // tokens whose KV is in `blocks`
    std::vector<BlockId> blocks;
    KvTransferParams kv;
    bool remote_prefill = false;   // D: still to load from P
    bool remote_decode = false;    // P: hand over after the first token
    // D: the first token P computed from the KV this request loaded, to be
    // emitted without a step on it (core/first_token.h); kNoFirstToken once
    // that KV is gone or when there is none.
    Token producer_token = kNoFirstToken;
    Sampling sampling;
    bool ignore_eos = false;
    Phase phase = Phase::kWaiting;
  };
  // One request's share of the step being scheduled: KV for [from, to),
  // then a token if it wants one (the model's, or the producer's carried
  // token). Built by AdvanceRunning, run by RunPlanned.
  struct Planned {
    uint64_t client = 0;
    uint32_t from = 0, to = 0;
    bool wants_token = false;   // from the model
    bool emits = false;         // a token goes out this step
    bool prefill = false;       // not a single decode token (SeqWork::prefill)
  };

  enum class OpKind : uint8_t {
    kAbortRequests, kPause, kSleep, kWake, kReleaseKv, kResetPrefix, kUpdateWeights
  };
  enum class OpStage : uint8_t { kQuiesce, kDrain, kRelease, kWaitBlocks };
  struct ControlOp {
    uint64_t id = 0;
    OpKind kind = OpKind::kPause;
    PauseMode mode = PauseMode::kKeep;
    bool clear_cache = false;
    uint32_t level = 0;
    bool reset_running = false;
    uint64_t version = 0;
    uint64_t previous_version = 0;  // update_weights: the weights it replaced
    std::vector<uint64_t> clients;
    bool all = false;
    uint64_t drain_mark = 0;   // wait mode: requests that arrived before the call
    OpStage stage = OpStage::kQuiesce;
  };

  // requests (engine.cc)
  void ApplyFinished(const EngineFinished& f);
  void Finish(Request& r, FinishReason reason, const std::string& error = "");
  // Ends `r` as the client's abort does; `reason` kError (with `detail`)
  // for a request the engine itself gives up on.
  void AbortOne(Request& r, FinishReason reason = FinishReason::kAborted,
                const std::string& detail = "");
  void FreeBlocks(Request& r);
  void Unref(std::span<const BlockId> blocks);
  void DropKv(Request& r);   // preempt: free KV, 0 computed, back to waiting
  // A request leaves the queues and its client learns now; its blocks stay
  // (kHeld) until the connector reports every rank done with them.
  void HoldForTransfer(Request& r, FinishReason reason, const std::string& detail);
  void StreamChunk(Request& r);  // P: hand the finished chunks' blocks over
  void Requeue(uint64_t client);
  void Erase(uint64_t client);   // forgets a request (and its slot)
  Request* Find(RequestId id);   // O(1): by slot, then generation
  uint64_t Fingerprint(const Request& r) const;
  // scheduling (schedule.cc)
  uint32_t Schedule();
  void AdmitWaiting();
  bool AdvanceRunning(Request& r, uint32_t* budget);
  void RunPlanned();
  bool EnsureBlocks(Request& r, uint32_t tokens);
  void AllocateRun(Request& r, uint32_t n, TransferId owner);
  void CacheBlocks(Request& r, uint32_t from, uint32_t to);
  bool CarriedTokenDue(const Request& r) const;
  bool PreemptNewerThan(const Request& self);
  bool SchedulingAllowed() const;
  // lifecycle (lifecycle.cc)
  uint64_t Enqueue(ControlOp op);
  void ProgressControl();
  bool Quiesce(ControlOp& op);
  bool NeedsReset(const ControlOp& op) const;
  void ExpireUnstarted(Instant now);
  bool DrainWaitsFor(const Request& r) const;
  void FinishOp(ControlOp& op);
  void Done(uint64_t op, bool ok, std::string detail = "");
  Residency WantedResidency() const;

  const EngineOptions options_;
  KvMemory* const memory_;
  std::unique_ptr<EmulatedModel> own_model_;  // when the driver gave none
  ComputeModel* const model_;
  BlockPool pool_;
  ConnectorScheduler connector_;
  uint64_t weights_;
  bool weights_loaded_ = true;
  EngineState state_ = EngineState::kActive;
  bool frozen_ = false;      // quiesced by an operation in progress
  bool draining_ = false;    // a wait-mode operation: admit nothing new
  // The last AdmitWaiting stopped at a request it could admit but for
  // blocks: with nothing running, only transfers can give blocks back.
  bool admission_blocked_ = false;
  std::map<uint64_t, Request> requests_;
  // P: blocks of streaming requests preempted while ranks may read them
  // (ConnectorScheduler::StreamPreempted), until EngineFinished::unparked.
  std::unordered_map<RequestId, std::vector<BlockId>> parked_;
  std::unordered_map<uint32_t, uint64_t> client_of_slot_;  // RequestId.index → client
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_;
  std::deque<ControlOp> ops_;
  uint64_t next_op_ = 1;
  uint64_t next_arrival_ = 1;
  uint32_t next_slot_ = 0;
  std::deque<EngineAction> actions_;
  bool dirty_ = false;       // an input or the last step changed something
  bool resetting_ = false;   // a cache reset released transfers, not done
  bool kv_discarded_ = false;  // sleep >= 1 / release: wake re-registers
  Instant next_expiry_scan_;   // ExpireUnstarted looks again at or after it
  uint32_t sleep_level_ = 0;   // of the sleep in force (WantedResidency)
  std::vector<Planned> plan_;      // the step being scheduled
  std::vector<SeqWork> batch_;     // RunPlanned's, reused
  std::vector<Token> batch_out_;
  struct Stats {
    uint64_t preemptions = 0;
    uint64_t loads_recomputed = 0;
    uint64_t loads_failed = 0;
    uint64_t prefix_hits = 0;
    uint64_t producer_tokens = 0;  // D: first tokens emitted as P computed them
    uint64_t queue_wait_expired = 0;  // requests ended by max_queue_wait
    uint64_t exports_failed = 0;   // P: ComputeModel::ExportKv refused (hand-off aborted)
    uint64_t imports_failed = 0;   // D: ComputeModel::ImportKv refused (a failed load)
    uint64_t chunks_streamed = 0;  // P: chunks handed over (PrefillProgress)
    uint64_t streams_parked = 0;   // P: streaming requests preempted, blocks parked
  } stats_;

 public:
  const Stats& stats() const { return stats_; }
};

// Checks one request's output: token k must be what the model gives at its
// position, from the KV of the prompt and the earlier tokens under the
// weights version token k reports. Empty string if all match, else why.
std::string CheckOutput(std::span<const Token> prompt, std::span<const TokenOut> tokens,
                        const ModelShape& shape);

}  // namespace kvrelay::engine
