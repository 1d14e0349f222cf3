// lifecycle.cc — the engine's operations: abort_requests, pause, resume,
// sleep, wake_up, release_kv_cache_memory, reset_prefix_cache,
// update_weights.
//
// Why one path: every operation that resets the cache must get every block
// back, including blocks that remote transfers hold (P: finished requests'
// KV not yet pulled; D: loads in flight). vLLM's cache resets failed on D
// exactly there. So they all go through ProgressControl's stages:
//
//   kQuiesce    abort: abort everything; keep: freeze; wait: → kDrain
//   kDrain      run until the requests that arrived before the call and
//               compute here are done (new ones wait; KV still to come
//               from P is not waited for), then freeze
//   kRelease    preempt every request holding KV (it recomputes later, in
//               arrival order) and call abort_transfers() once
//   kWaitBlocks wait until the pool has every block back (cut-short loads
//               come back as failed loads and wait to recompute), then
//               reset the pool and finish the operation
//
// Operations queue and run one at a time, at the start of engine steps and
// at Control() calls between them (the runtime calls it when an abort or an
// operation arrives during a step's compute, so an abort on P reaches the
// ranks without waiting for the step to end).
#include <algorithm>
#include <cstdio>

#include "base/check.h"
#include "engine/engine.h"

namespace kvrelay::engine {

namespace {
constexpr size_t kMaxPendingOps = 64;
}  // namespace

uint64_t Engine::Enqueue(ControlOp op) {
  op.id = next_op_++;
  op.drain_mark = next_arrival_ - 1;  // "in flight" means: before this call
  dirty_ = true;
  if (ops_.size() >= kMaxPendingOps) {
    Done(op.id, false, "too many operations pending");
    return op.id;
  }
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

uint64_t Engine::AbortRequests(std::vector<uint64_t> clients, bool all) {
  ControlOp op;
  op.kind = OpKind::kAbortRequests;
  op.clients = std::move(clients);
  op.all = all;
  return Enqueue(std::move(op));
}

uint64_t Engine::Pause(PauseMode mode, bool clear_cache) {
  ControlOp op;
  op.kind = OpKind::kPause;
  op.mode = mode;
  op.clear_cache = clear_cache;
  return Enqueue(std::move(op));
}

uint64_t Engine::Sleep(uint32_t level, PauseMode mode) {
  ControlOp op;
  op.kind = OpKind::kSleep;
  op.level = std::min<uint32_t>(level, 2);
  op.mode = mode == PauseMode::kKeep ? PauseMode::kWait : mode;
  return Enqueue(std::move(op));
}

uint64_t Engine::WakeUp() {
  ControlOp op;
  op.kind = OpKind::kWake;
  return Enqueue(std::move(op));
}

uint64_t Engine::ReleaseKvCacheMemory() {
  ControlOp op;
  op.kind = OpKind::kReleaseKv;
  op.mode = PauseMode::kKeep;
  return Enqueue(std::move(op));
}

uint64_t Engine::ResetPrefixCache(bool reset_running_requests) {
  ControlOp op;
  op.kind = OpKind::kResetPrefix;
  op.reset_running = reset_running_requests;
  return Enqueue(std::move(op));
}

uint64_t Engine::UpdateWeights(uint64_t version, PauseMode mode) {
  ControlOp op;
  op.kind = OpKind::kUpdateWeights;
  op.version = version;
  op.mode = mode;
  return Enqueue(std::move(op));
}

// Resume acts at once: it fails every operation still on its way to a
// pause, sleep or cache reset — in progress or queued behind others — and
// lets the engine run again. Other queued operations keep their turn.
uint64_t Engine::Resume() {
  const uint64_t id = next_op_++;
  dirty_ = true;
  std::deque<ControlOp> kept;
  for (ControlOp& op : ops_) {
    const bool quiescing = op.kind == OpKind::kPause || op.kind == OpKind::kSleep ||
                           op.kind == OpKind::kReleaseKv || op.kind == OpKind::kUpdateWeights;
    if (quiescing) {
      Done(op.id, false, "cancelled by resume");
    } else {
      kept.push_back(std::move(op));
    }
  }
  ops_.swap(kept);
  frozen_ = false;
  draining_ = false;
  resetting_ = false;
  if (state_ == EngineState::kPaused) state_ = EngineState::kActive;
  Done(id, true);
  return id;
}

// A wait-mode drain waits for what this engine computes itself: requests
// running, and requests waiting to run here. It does not wait for a request
// whose KV is still to come from P (queued to load, or loading): that wait
// ends only when P computes and hands over, and P may be paused or asleep
// itself (called first, or alone), so only the transfer's timeout would end
// it. Such a request keeps its place: with no cache reset its load goes on
// and it decodes after resume; with one, the load is cut short and it
// recomputes (lifecycle.md, rule 7).
bool Engine::DrainWaitsFor(const Request& r) const {
  switch (r.phase) {
    case Phase::kRunning: return true;
    case Phase::kWaiting: return !r.remote_prefill;
    case Phase::kWaitingRemote:
    case Phase::kHeld:
    case Phase::kReleasing: return false;
  }
  return false;
}

bool Engine::NeedsReset(const ControlOp& op) const {
  switch (op.kind) {
    case OpKind::kPause: return op.clear_cache;
    case OpKind::kSleep: return op.level >= 1;
    case OpKind::kReleaseKv:
    case OpKind::kUpdateWeights: return true;
    default: return false;
  }
}

void Engine::Tick(Instant now) {
  ExpireUnstarted(now);
  Control();
}

// options.max_queue_wait: a request that has produced no token that long
// after it arrived ends with a clean error, whatever holds it — a pause or
// a sleep it arrived into, a queue that does not move, KV that does not
// come. vLLM lets such requests wait for resume / wake_up with no bound;
// an operator's deadline (serve --max-queue-wait-s) gives the client an
// answer instead. A request that produced a token is never cut here.
void Engine::ExpireUnstarted(Instant now) {
  if (options_.max_queue_wait <= Duration::Zero() || now < next_expiry_scan_) return;
  next_expiry_scan_ = now + Duration::Milliseconds(100);  // O(requests) a scan: not every step
  std::vector<uint64_t> late;
  for (const auto& [c, r] : requests_) {
    const bool unstarted = r.generated == 0 && (r.phase == Phase::kWaiting ||
                                                 r.phase == Phase::kWaitingRemote);
    if (unstarted && now - r.arrived_at >= options_.max_queue_wait) late.push_back(c);
  }
  std::sort(late.begin(), late.end());  // deterministic order
  char why[128];
  std::snprintf(why, sizeof why,
                "no token within max_queue_wait (%g s): the engine is paused, asleep or "
                "overloaded", options_.max_queue_wait.seconds());
  for (uint64_t c : late) {
    ++stats_.queue_wait_expired;
    AbortOne(requests_.at(c), FinishReason::kError, why);
  }
  if (!late.empty()) dirty_ = true;
}

void Engine::Control() {
  ProgressControl();
  ConnectorMetadata meta = connector_.BuildMetadata();
  if (!meta.empty()) actions_.push_back(MetadataOut{std::move(meta)});
}

void Engine::Done(uint64_t op, bool ok, std::string detail) {
  actions_.push_back(OpDone{op, ok, std::move(detail)});
}

void Engine::ProgressControl() {
  while (!ops_.empty()) {
    ControlOp& op = ops_.front();
    bool finished = false;
    switch (op.kind) {
      case OpKind::kAbortRequests: {
        std::vector<uint64_t> targets = op.clients;
        if (op.all) {
          targets.clear();
          for (const auto& [c, r] : requests_) targets.push_back(c);
        }
        for (uint64_t c : targets) {
          auto it = requests_.find(c);
          if (it != requests_.end()) AbortOne(it->second);
        }
        Done(op.id, true);
        finished = true;
        break;
      }
      case OpKind::kResetPrefix: {
        if (op.reset_running) {
          std::vector<uint64_t> running = running_;
          for (uint64_t c : running) DropKv(requests_.at(c));
        }
        // Never raises: held blocks (transfers, running requests) make it
        // return false.
        const bool ok = pool_.ResetPrefixCache();
        Done(op.id, ok, ok ? "" : "blocks are held by requests or transfers");
        finished = true;
        break;
      }
      case OpKind::kWake:
        // Re-create what sleep discarded — only that: a level-0 sleep kept
        // the KV, and live blocks must keep their content.
        if (kv_discarded_) memory_->OnReset();  // re-register the KV memory
        kv_discarded_ = false;
        weights_loaded_ = true;
        if (state_ == EngineState::kSleeping || state_ == EngineState::kKvReleased) {
          state_ = EngineState::kActive;
        }
        {
          // The model rebuilds what sleep freed (its KV context, weights).
          const Status s = model_->Reside(WantedResidency());
          Done(op.id, s.ok(), s.ok() ? "" : s.message());
        }
        finished = true;
        break;
      case OpKind::kPause:
      case OpKind::kSleep:
      case OpKind::kReleaseKv:
      case OpKind::kUpdateWeights:
        finished = Quiesce(op);
        break;
    }
    if (!finished) return;
    ops_.pop_front();
    dirty_ = true;
  }
}

// Advances a pause / sleep / release / weight update through its stages.
// Returns true when the operation completed.
bool Engine::Quiesce(ControlOp& op) {
  if (op.stage == OpStage::kQuiesce) {
    switch (op.mode) {
      case PauseMode::kAbort: {
        std::vector<uint64_t> all;
        for (const auto& [c, r] : requests_) all.push_back(c);
        for (uint64_t c : all) {
          auto it = requests_.find(c);
          if (it != requests_.end()) AbortOne(it->second);
        }
        frozen_ = true;
        op.stage = OpStage::kRelease;
        break;
      }
      case PauseMode::kWait:
        if (state_ != EngineState::kActive) {
          // Already paused or asleep: nothing can run, nothing to drain.
          frozen_ = true;
          op.stage = OpStage::kRelease;
          break;
        }
        draining_ = true;  // AdmitWaiting reads this op's drain_mark
        op.stage = OpStage::kDrain;
        break;
      case PauseMode::kKeep:
        frozen_ = true;
        op.stage = OpStage::kRelease;
        break;
    }
    dirty_ = true;
  }
  if (op.stage == OpStage::kDrain) {
    // Nothing runs and the oldest request cannot start for want of blocks:
    // only transfers can give blocks back now (P's exports to a D that may
    // be paused, D's loads from a P that may be), so waiting on would wait
    // for a transfer's timeout. The drain ends; the requests left wait.
    if (!(running_.empty() && admission_blocked_)) {
      for (const auto& [c, r] : requests_) {
        if (DrainWaitsFor(r) && r.arrival <= op.drain_mark) return false;
      }
    }
    draining_ = false;
    frozen_ = true;
    op.stage = OpStage::kRelease;
  }
  if (op.stage == OpStage::kRelease) {
    if (!NeedsReset(op)) {
      FinishOp(op);
      return true;
    }
    // Release, then reset: requests holding KV give it back and wait to
    // recompute (queue order kept); transfers are ended once.
    resetting_ = true;
    std::vector<uint64_t> running = running_;
    for (uint64_t c : running) DropKv(requests_.at(c));
    connector_.AbortTransfers();
    op.stage = OpStage::kWaitBlocks;
    dirty_ = true;
  }
  if (op.stage == OpStage::kWaitBlocks) {
    if (pool_.num_referenced() > 0) return false;  // transfers still hold blocks
    KV_CHECK(pool_.Reset());
    memory_->OnReset();
    model_->ForgetAll();
    resetting_ = false;
    if (op.kind == OpKind::kUpdateWeights) {
      op.previous_version = weights_;
      weights_ = op.version;
    }
    if (op.kind == OpKind::kSleep && op.level >= 2) weights_loaded_ = false;
    kv_discarded_ = op.kind == OpKind::kSleep || op.kind == OpKind::kReleaseKv;
    FinishOp(op);
    return true;
  }
  return false;
}

// What the model must hold in the state the engine is in: the KV context
// unless asleep at level >= 1 or released, the weights unless asleep at
// level 2 (and not updated since).
Residency Engine::WantedResidency() const {
  Residency want;
  want.kv = !(state_ == EngineState::kKvReleased ||
              (state_ == EngineState::kSleeping && sleep_level_ >= 1));
  want.weights = weights_loaded_;
  want.weights_version = weights_;
  return want;
}

void Engine::FinishOp(ControlOp& op) {
  frozen_ = false;
  switch (op.kind) {
    // A pause does not wake a sleeping engine or re-acquire released KV.
    case OpKind::kPause:
      if (state_ == EngineState::kActive) state_ = EngineState::kPaused;
      break;
    case OpKind::kSleep:
      state_ = EngineState::kSleeping;
      sleep_level_ = op.level;
      break;
    case OpKind::kReleaseKv: state_ = EngineState::kKvReleased; break;
    // New weights are loaded; a paused, sleeping or released engine stays
    // so until resume / wake_up.
    case OpKind::kUpdateWeights: weights_loaded_ = true; break;
    default: break;
  }
  const Residency want = WantedResidency();
  const Status s = model_->Reside(want);
  if (!s.ok() && op.kind == OpKind::kUpdateWeights && op.previous_version != 0) {
    // The new weights did not load: the old ones serve on, and the
    // operation says why. The cache was reset all the same.
    weights_ = op.previous_version;
    const Status back = model_->Reside(WantedResidency());
    KV_CHECK(back.ok());
  }
  Done(op.id, s.ok(), s.ok() ? "" : s.message());
}

}  // namespace kvrelay::engine
