// engine.cc — requests: admission, aborts, finishing, connector reports.
#include "engine/engine.h"

#include <algorithm>

#include "base/check.h"
#include "base/prng.h"

namespace kvrelay::engine {

namespace {
ConnectorRole ConnectorRoleOf(Role r) {
  switch (r) {
    case Role::kProducer: return ConnectorRole::kProducer;
    case Role::kConsumer: return ConnectorRole::kConsumer;
    case Role::kBoth:
    case Role::kPlain: return ConnectorRole::kBoth;
  }
  return ConnectorRole::kBoth;
}
}  // namespace

Engine::Engine(const EngineOptions& options, KvMemory* memory, ComputeModel* model)
    : options_(options),
      memory_(memory),
      own_model_(model == nullptr ? std::make_unique<EmulatedModel>(options.shape, memory)
                                  : nullptr),
      model_(model != nullptr ? model : own_model_.get()),
      pool_(options.num_blocks),
      connector_(ConnectorSchedulerOptions{ConnectorRoleOf(options.role), options.tp,
                                           options.engine_id}),
      weights_(options.weights_version) {
  KV_CHECK(memory_ != nullptr);
  KV_CHECK_GT(options_.shape.block_tokens, 0u);
  KV_CHECK_EQ(kHeadGroups % options_.tp, 0u);
  KV_CHECK(!options_.prefix_caching || model_->SharesBlocks());
  KV_CHECK_LE(options_.shape.vocab, model_->vocab());
}

uint64_t Engine::Fingerprint(const Request& r) const {
  // The model's identity too (compute_model.h): KV from another model's
  // file is refused at the first pull, as KV from other weights is.
  return (PrefixHash(weights_, std::span<const Token>(r.seq.data(), r.prompt_len)) ^
          model_->Identity()) |
         1;
}

Status Engine::AddRequest(RequestSpec spec, Instant now) {
  const ModelShape& shape = options_.shape;
  if (spec.prompt.empty()) return InvalidArgumentError("empty prompt");
  if (spec.max_tokens == 0) return InvalidArgumentError("max_tokens must be at least 1");
  const uint64_t total = spec.prompt.size() + uint64_t{spec.max_tokens};
  if (total > shape.max_context) {
    return InvalidArgumentError("prompt (" + std::to_string(spec.prompt.size()) +
                                " tokens) + max_tokens exceeds the context of " +
                                std::to_string(shape.max_context));
  }
  if (BlocksFor(static_cast<uint32_t>(total), shape.block_tokens) > options_.num_blocks) {
    return InvalidArgumentError("request needs more KV blocks than the pool has");
  }
  for (Token t : spec.prompt) {
    if (t >= shape.vocab) return InvalidArgumentError("token id out of vocabulary");
  }
  if (requests_.count(spec.client) != 0) {
    return AlreadyExistsError("request " + std::to_string(spec.client) + " exists");
  }
  if (waiting_.size() >= options_.max_waiting) {
    return ResourceExhaustedError("waiting queue full");
  }
  const bool remote_decode = spec.kv.do_remote_decode;
  const bool remote_prefill = spec.kv.do_remote_prefill;
  if (options_.role == Role::kPlain && (remote_decode || remote_prefill)) {
    return InvalidArgumentError("a plain engine does not transfer KV");
  }
  Request r;
  r.client = spec.client;
  r.id = RequestId{next_slot_++, options_.incarnation};
  r.arrival = next_arrival_++;
  r.arrived_at = now;
  r.prompt_len = static_cast<uint32_t>(spec.prompt.size());
  r.seq = std::move(spec.prompt);
  r.max_tokens = remote_decode ? 1 : spec.max_tokens;  // P emits one token
  r.kv = spec.kv;
  r.sampling = spec.sampling;
  r.ignore_eos = spec.ignore_eos;
  r.kv.prompt_hash = Fingerprint(r);
  r.remote_decode = remote_decode;
  r.remote_prefill = remote_prefill;
  Status s = connector_.AdmitRequest(r.id, r.kv);
  if (!s.ok()) return s;
  const uint64_t client = r.client;
  client_of_slot_.emplace(r.id.index, client);
  requests_.emplace(client, std::move(r));
  waiting_.push_back(client);
  dirty_ = true;
  return Status::Ok();
}

void Engine::AbortRequest(uint64_t client) {
  auto it = requests_.find(client);
  if (it != requests_.end()) AbortOne(it->second);
  dirty_ = true;
}

Engine::Request* Engine::Find(RequestId id) {
  auto slot = client_of_slot_.find(id.index);
  if (slot == client_of_slot_.end()) return nullptr;
  auto it = requests_.find(slot->second);
  if (it == requests_.end() || it->second.id != id) return nullptr;
  return &it->second;
}

void Engine::Erase(uint64_t client) {
  auto it = requests_.find(client);
  KV_CHECK(it != requests_.end());
  client_of_slot_.erase(it->second.id.index);
  requests_.erase(it);
}

void Engine::AbortOne(Request& r, FinishReason reason, const std::string& detail) {
  switch (r.phase) {
    case Phase::kWaiting:
    case Phase::kRunning:
      // A streaming request's ranks may be reading its blocks: they stay.
      if (connector_.RequestFinished(r.id, r.blocks, /*aborted=*/true)) {
        HoldForTransfer(r, reason, detail);
      } else {
        Finish(r, reason, detail);
      }
      return;
    case Phase::kWaitingRemote:
      // The load is in flight: release it; the blocks stay until every
      // producer answered. The client learns now.
      KV_CHECK(connector_.RequestFinished(r.id, r.blocks, /*aborted=*/true));
      r.phase = Phase::kReleasing;
      actions_.push_back(RequestDone{r.client, reason, detail});
      return;
    case Phase::kHeld:
      connector_.AbortHeld(r.id);
      return;
    case Phase::kReleasing:
      return;
  }
}

void Engine::HoldForTransfer(Request& r, FinishReason reason, const std::string& detail) {
  if (r.phase == Phase::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), r.client));
  } else if (r.phase == Phase::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r.client));
  }
  actions_.push_back(RequestDone{r.client, reason, detail});
  r.phase = Phase::kHeld;
}

// Ends a request that is waiting or running: its blocks are freed now, or,
// for P's hand-over, held until every D rank pulled them.
void Engine::Finish(Request& r, FinishReason reason, const std::string& error) {
  const uint64_t client = r.client;
  if (r.phase == Phase::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), client));
  } else if (r.phase == Phase::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), client));
  }
  actions_.push_back(RequestDone{client, reason, error});
  // P emitted exactly one token, computed from that KV: D gets it with the KV.
  const uint32_t first_token = r.generated == 1 ? r.seq.back() : kNoFirstToken;
  // The KV was computed under the current weights: that is what D must
  // expect (a weight update since admission changes the fingerprint).
  if (reason == FinishReason::kLength && r.remote_decode) {
    // A model that keeps its own KV copies it into the blocks now; if it
    // cannot, the hand-off ends as an aborted one (D recomputes).
    const Status exported = model_->ExportKv(r.id.index, r.computed, r.blocks, *memory_);
    if (!exported.ok()) {
      ++stats_.exports_failed;
      if (connector_.RequestFinished(r.id, r.blocks, /*aborted=*/true)) {
        r.phase = Phase::kHeld;  // chunks streamed before: ranks may read them
        return;
      }
    } else if (connector_.RequestFinished(r.id, r.blocks, /*aborted=*/false, Fingerprint(r),
                                          first_token)) {
      r.phase = Phase::kHeld;
      return;
    }
  }
  if (reason == FinishReason::kLength && !r.remote_decode) {
    KV_CHECK(!connector_.RequestFinished(r.id, r.blocks, /*aborted=*/false));
  }
  FreeBlocks(r);
  Erase(client);
}

void Engine::FreeBlocks(Request& r) {
  model_->Forget(r.id.index);
  Unref(r.blocks);
  r.blocks.clear();
}

void Engine::Unref(std::span<const BlockId> blocks) {
  for (const BlockId& b : blocks) {
    pool_.Unref(b);
    if (!pool_.IsLive(b)) memory_->OnFree(b);
  }
}

// Preemption (recompute): the request gives its KV back and waits again in
// arrival order, with nothing computed.
void Engine::DropKv(Request& r) {
  if (r.phase == Phase::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), r.client));
  }
  // Planned this step already (preempted by an older request that ran
  // out of blocks after it): it computes nothing now.
  std::erase_if(plan_, [&](const Planned& p) { return p.client == r.client; });
  if (connector_.StreamPreempted(r.id)) {
    // Ranks may be writing from the chunks it handed over: those blocks
    // stay referenced until every rank's send has ended.
    ++stats_.streams_parked;
    KV_CHECK(parked_.emplace(r.id, std::move(r.blocks)).second);  // once: then ABANDONED
    r.blocks.clear();
  }
  FreeBlocks(r);
  r.computed = 0;
  r.remote_prefill = false;  // what it had loaded is gone: compute locally
  r.producer_token = kNoFirstToken;
  if (r.phase != Phase::kWaiting) Requeue(r.client);
  r.phase = Phase::kWaiting;
}

void Engine::Requeue(uint64_t client) {
  const uint64_t arrival = requests_.at(client).arrival;
  auto pos = std::find_if(waiting_.begin(), waiting_.end(), [&](uint64_t c) {
    return requests_.at(c).arrival > arrival;
  });
  waiting_.insert(pos, client);
}

void Engine::ApplyFinished(const EngineFinished& f) {
  for (const RequestId& id : f.sending_done) {
    Request* r = Find(id);
    KV_CHECK(r != nullptr && r->phase == Phase::kHeld);
    FreeBlocks(*r);
    Erase(r->client);
    dirty_ = true;
  }
  for (const RequestId& id : f.unparked) {
    auto it = parked_.find(id);
    KV_CHECK(it != parked_.end());
    Unref(it->second);
    parked_.erase(it);
    dirty_ = true;
  }
  for (const RequestId& id : f.released) {
    Request* r = Find(id);
    KV_CHECK(r != nullptr && r->phase == Phase::kReleasing);
    FreeBlocks(*r);
    Erase(r->client);
    dirty_ = true;
  }
  for (const LoadOutcome& done : f.recving_done) {
    Request* r = Find(done.request);
    KV_CHECK(r != nullptr && r->phase == Phase::kWaitingRemote);
    dirty_ = true;
    r->remote_prefill = false;
    // A model that keeps its own KV takes it from the blocks now; a frame
    // it refuses is a failed load.
    const bool imported =
        done.ok && !resetting_ &&
        model_->ImportKv(r->id.index, r->prompt_len, r->blocks, *memory_).ok();
    if (done.ok && !resetting_ && !imported) ++stats_.imports_failed;
    if (imported) {
      r->computed = r->prompt_len;
      // A token outside the vocabulary is no token: D computes its own.
      r->producer_token =
          done.first_token < options_.shape.vocab ? done.first_token : kNoFirstToken;
      r->phase = Phase::kRunning;
      running_.push_back(r->client);
      continue;
    }
    // Failed, cut short by abort_transfers, or landed while a cache reset
    // is under way: never decode on it.
    FreeBlocks(*r);
    r->computed = 0;
    if (done.cut_short || resetting_ ||
        options_.load_failure_policy == LoadFailurePolicy::kRecompute) {
      r->phase = Phase::kWaiting;
      Requeue(r->client);
      ++stats_.loads_recomputed;
    } else {
      ++stats_.loads_failed;
      actions_.push_back(RequestDone{r->client, FinishReason::kError, "KV load failed"});
      Erase(r->client);
    }
  }
}

std::optional<EngineAction> Engine::PollAction() {
  if (actions_.empty()) return std::nullopt;
  EngineAction a = std::move(actions_.front());
  actions_.pop_front();
  return a;
}

EngineSnapshot Engine::Snapshot() const {
  EngineSnapshot s;
  s.state = state_;
  s.sleeping = IsSleeping();
  s.weights_version = weights_;
  s.producer_tokens = stats_.producer_tokens;
  s.queue_wait_expired = stats_.queue_wait_expired;
  s.exports_failed = stats_.exports_failed;
  s.imports_failed = stats_.imports_failed;
  s.chunks_streamed = stats_.chunks_streamed;
  s.streams_parked = stats_.streams_parked;
  s.kv_copy = model_->CopyCosts();
  for (const auto& [c, r] : requests_) {
    switch (r.phase) {
      case Phase::kWaiting: ++s.waiting; break;
      case Phase::kRunning: ++s.running; break;
      case Phase::kWaitingRemote: ++s.loading; break;
      case Phase::kHeld: ++s.held; break;
      case Phase::kReleasing: ++s.releasing; break;
    }
  }
  s.blocks_used = pool_.num_referenced();
  s.blocks_free = pool_.num_free();
  s.blocks_cached = pool_.num_cached_idle();
  s.pending_ops = ops_.size();
  return s;
}

void Engine::CheckInvariants() const {
  pool_.CheckInvariants();
  connector_.CheckInvariants();
  size_t waiting = 0, running = 0;
  for (const auto& [c, r] : requests_) {
    KV_CHECK_EQ(c, r.client);
    KV_CHECK_LE(r.computed, r.seq.size());
    if (r.phase == Phase::kWaiting) {
      ++waiting;
      KV_CHECK(r.blocks.empty());
    }
    if (r.phase == Phase::kRunning) ++running;
    if (r.phase == Phase::kRunning || r.phase == Phase::kHeld) {
      KV_CHECK_GE(r.blocks.size() * options_.shape.block_tokens, r.computed);
    }
  }
  KV_CHECK_EQ(waiting, waiting_.size());
  KV_CHECK_EQ(running, running_.size());
  for (size_t i = 1; i < waiting_.size(); ++i) {
    KV_CHECK_LT(requests_.at(waiting_[i - 1]).arrival, requests_.at(waiting_[i]).arrival);
  }
}

std::string CheckOutput(std::span<const Token> prompt, std::span<const TokenOut> tokens,
                        const ModelShape& shape) {
  std::vector<Token> seq(prompt.begin(), prompt.end());
  for (size_t k = 0; k < tokens.size(); ++k) {
    const uint64_t v = tokens[k].weights_version;
    uint64_t folded = 0;
    const uint32_t blocks = BlocksFor(static_cast<uint32_t>(seq.size()), shape.block_tokens);
    for (uint32_t b = 0; b < blocks; ++b) {
      for (uint32_t g = 0; g < kHeadGroups; ++g) {
        folded = FoldDigest(folded, BlockDigest(v, seq, shape.block_tokens, b, g));
      }
    }
    const Token expect = NextToken(v, folded, static_cast<uint32_t>(seq.size()), shape.vocab);
    if (tokens[k].token != expect) {
      return "token " + std::to_string(k) + " is " + std::to_string(tokens[k].token) +
             ", the model gives " + std::to_string(expect) + " under weights v" +
             std::to_string(v);
    }
    seq.push_back(tokens[k].token);
  }
  return "";
}

}  // namespace kvrelay::engine
