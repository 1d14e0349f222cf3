// schedule.cc — one engine step's compute: continuous batching under a
// token budget, chunked prefill, preemption by recompute, prefix caching.
#include <algorithm>

#include "base/check.h"
#include "engine/engine.h"

namespace kvrelay::engine {

bool Engine::SchedulingAllowed() const {
  return state_ == EngineState::kActive && !frozen_ && weights_loaded_;
}

Duration Engine::Step(std::span<const RankReport> reports, Instant now) {
  dirty_ = false;
  for (uint32_t rank = 0; rank < reports.size(); ++rank) {
    if (!reports[rank].empty()) ApplyFinished(connector_.OnRankReport(rank, reports[rank]));
  }
  ExpireUnstarted(now);
  ProgressControl();
  const uint32_t tokens = Schedule();
  if (tokens > 0) dirty_ = true;
  ProgressControl();  // a drain may have just completed
  ConnectorMetadata meta = connector_.BuildMetadata();
  if (!meta.empty()) actions_.push_back(MetadataOut{std::move(meta)});
  if (tokens == 0) return Duration::Zero();
  return options_.step_base + options_.step_per_token * tokens;
}

// Plans the step (admission, then each running request's chunk or
// token, oldest first), then runs it as one batch on the model.
uint32_t Engine::Schedule() {
  if (!SchedulingAllowed()) return 0;
  uint32_t budget = options_.max_batch_tokens;
  AdmitWaiting();
  plan_.clear();
  // Oldest first; a request preempted meanwhile is skipped.
  std::vector<uint64_t> order = running_;
  for (uint64_t client : order) {
    if (budget == 0) break;
    auto it = requests_.find(client);
    if (it == requests_.end() || it->second.phase != Phase::kRunning) continue;
    AdvanceRunning(it->second, &budget);
  }
  RunPlanned();
  return options_.max_batch_tokens - budget;
}

// Admits waiting requests in arrival order while blocks allow; the head
// that does not fit blocks the rest (no reordering). A wait-mode drain
// admits only the requests that arrived before its call.
void Engine::AdmitWaiting() {
  KV_CHECK(!draining_ || !ops_.empty());  // a drain is its operation's stage
  const uint64_t drain_mark = draining_ ? ops_.front().drain_mark : UINT64_MAX;
  admission_blocked_ = false;
  while (!waiting_.empty() && running_.size() < options_.max_running) {
    const uint64_t client = waiting_.front();
    Request& r = requests_.at(client);
    if (r.arrival > drain_mark) break;  // wait mode: nothing new
    const uint32_t bs = options_.shape.block_tokens;
    if (r.remote_prefill) {
      const uint32_t need = BlocksFor(r.prompt_len, bs);
      if (pool_.num_free() + pool_.num_cached_idle() < need) {
        admission_blocked_ = true;
        break;
      }
      AllocateRun(r, need, r.kv.transfer);
      // The fingerprint is taken now: the weights may have changed since
      // admission, and D must only accept KV computed under its own.
      connector_.OnBlocksAllocated(r.id, r.blocks, Fingerprint(r));
      r.phase = Phase::kWaitingRemote;
      waiting_.pop_front();
      dirty_ = true;
      continue;
    }
    // Prefix cache: reuse full blocks whose token prefix (and weights) match.
    const uint32_t len = static_cast<uint32_t>(r.seq.size());
    std::vector<BlockId> hits;
    if (options_.prefix_caching) {
      for (uint32_t i = 0; (i + 1) * bs <= len; ++i) {
        auto b = pool_.Lookup(
            PrefixHash(weights_, std::span<const Token>(r.seq.data(), (i + 1) * bs)));
        if (!b) break;
        hits.push_back(*b);
      }
    }
    const uint32_t need = BlocksFor(len, bs) - static_cast<uint32_t>(hits.size());
    if (pool_.num_free() + pool_.num_cached_idle() < need) {
      for (const BlockId& b : hits) pool_.Unref(b);
      admission_blocked_ = true;
      break;
    }
    stats_.prefix_hits += hits.size();
    r.blocks = std::move(hits);
    r.computed = static_cast<uint32_t>(r.blocks.size()) * bs;
    AllocateRun(r, need, TransferId{});
    r.phase = Phase::kRunning;
    running_.push_back(client);
    waiting_.pop_front();
    dirty_ = true;
  }
}

// Appends `n` fresh blocks to `r`, in ascending index order. The pool's
// free list is LIFO, so a request's blocks, freed in order, come back
// descending; fresh blocks hold nothing yet, so their order is free to
// choose, and ascending runs let a transfer coalesce adjacent blocks into
// one segment per layer (net::PlanWrite: 72 runs of 1 MiB instead of 2,304
// chunks of 32 KiB for 32 blocks of the 8b shape).
// REQUIRES: n blocks are free or cached-idle.
void Engine::AllocateRun(Request& r, uint32_t n, TransferId owner) {
  const size_t first = r.blocks.size();
  for (uint32_t i = 0; i < n; ++i) {
    Result<BlockId> b = pool_.Allocate();
    KV_CHECK(b.ok());
    memory_->OnAllocate(*b, owner);
    r.blocks.push_back(*b);
  }
  std::sort(r.blocks.begin() + static_cast<std::ptrdiff_t>(first), r.blocks.end(),
            [](const BlockId& a, const BlockId& b) { return a.index < b.index; });
}

// Plans the next chunk of `r` (prefill) and its next token (decode).
bool Engine::AdvanceRunning(Request& r, uint32_t* budget) {
  const uint32_t len = static_cast<uint32_t>(r.seq.size());
  Planned p{r.client, r.computed, r.computed, false, false, false};
  if (r.computed < len) {
    uint32_t chunk = std::min(len - r.computed, *budget);
    if (const uint32_t align = model_->PrefillAlign(); align > 0) {
      // The model's own cut (compute_model.h): the chunk whole, or wait.
      chunk = std::min(len - r.computed, align - r.computed % align);
      if (chunk > *budget) return false;
    }
    if (chunk == 0) return false;
    while (!EnsureBlocks(r, r.computed + chunk)) {
      // Out of blocks: preempt the newest running request — this one, if
      // it is the newest.
      if (!PreemptNewerThan(r)) {
        ++stats_.preemptions;
        DropKv(r);
        return false;
      }
    }
    p.to = r.computed + chunk;
    *budget -= chunk;
  }
  p.emits = p.to == len;  // prefill done: a token this step
  p.prefill = !(p.from + 1 == len && p.from >= r.prompt_len);
  p.wants_token = p.emits && !CarriedTokenDue(r);
  plan_.push_back(p);
  return true;
}

// Runs the plan as one batch on the model, then applies it in plan order:
// KV computed, complete blocks offered to the prefix cache, tokens out.
void Engine::RunPlanned() {
  if (plan_.empty()) return;
  batch_.clear();
  size_t wants = 0;
  for (const Planned& p : plan_) {
    const Request& r = requests_.at(p.client);
    KV_CHECK(r.phase == Phase::kRunning && r.computed == p.from);
    batch_.push_back(SeqWork{r.id.index, r.seq, r.blocks, p.from, p.to, p.wants_token,
                             p.prefill, r.sampling});
    wants += p.wants_token ? 1 : 0;
  }
  batch_out_.resize(wants);
  model_->Run(batch_, weights_, batch_out_);
  size_t next = 0;
  for (const Planned& p : plan_) {
    Request& r = requests_.at(p.client);
    CacheBlocks(r, p.from, p.to);
    r.computed = p.to;
    if (!p.emits) {
      StreamChunk(r);
      continue;
    }
    Token t = kNoFirstToken;
    if (p.wants_token) {
      t = batch_out_[next++];
    } else {
      ++stats_.producer_tokens;
      t = r.producer_token;
    }
    r.producer_token = kNoFirstToken;
    dirty_ = true;  // a token is progress even when no KV had to be computed
    actions_.push_back(TokenOut{r.client, t, weights_});
    r.seq.push_back(t);
    ++r.generated;
    if (r.generated >= r.max_tokens) {
      Finish(r, FinishReason::kLength);
    } else if (!r.ignore_eos && model_->EndsGeneration(t)) {
      Finish(r, FinishReason::kStop);
    }
  }
  plan_.clear();
}

// P, chunk-wise hand-off: the prompt's blocks whose tokens are all
// computed hold final KV; the connector may hand them over now (the last
// chunk goes with the first token, through RequestFinished).
void Engine::StreamChunk(Request& r) {
  if (!options_.stream_chunks || !r.remote_decode || !model_->KvInBlocksAsComputed()) return;
  const uint32_t bs = options_.shape.block_tokens;
  const uint32_t full = std::min(r.computed, r.prompt_len) / bs;
  if (full == 0) return;
  if (connector_.PrefillProgress(r.id, std::span<const BlockId>(r.blocks.data(), full),
                                 BlocksFor(r.prompt_len, bs), Fingerprint(r))) {
    ++stats_.chunks_streamed;
  }
}

bool Engine::EnsureBlocks(Request& r, uint32_t tokens) {
  const uint32_t need = BlocksFor(tokens, options_.shape.block_tokens);
  while (r.blocks.size() < need) {
    Result<BlockId> b = pool_.Allocate();
    if (!b.ok()) return false;
    memory_->OnAllocate(*b, TransferId{});
    r.blocks.push_back(*b);
  }
  return true;
}

// Offers the blocks that tokens [from, to) completed to the prefix cache.
void Engine::CacheBlocks(Request& r, uint32_t from, uint32_t to) {
  if (!options_.prefix_caching) return;
  const uint32_t bs = options_.shape.block_tokens;
  for (uint32_t b = from / bs; (b + 1) * bs <= to; ++b) {
    pool_.Cache(r.blocks[b],
                PrefixHash(weights_, std::span<const Token>(r.seq.data(), (b + 1) * bs)));
  }
}

// D's first token after a load is the one P computed from the same KV, if
// P handed it over: no step on the loaded KV for it. The token after it
// reads all of that KV, so KV that landed wrong still shows in the output.
// A request that wants one token only reads it now, as P did.
bool Engine::CarriedTokenDue(const Request& r) const {
  return options_.producer_first_token && r.producer_token != kNoFirstToken &&
         r.generated == 0 && (r.max_tokens > 1 || !model_->NextTokenFromKv());
}

// Preempts the newest running request if it is newer than `self`; false
// when `self` is the newest (the caller then preempts itself).
bool Engine::PreemptNewerThan(const Request& self) {
  uint64_t victim = 0;
  uint64_t newest = self.arrival;
  for (uint64_t c : running_) {
    const Request& r = requests_.at(c);
    if (r.arrival > newest) {
      newest = r.arrival;
      victim = c;
    }
  }
  if (newest == self.arrival) return false;
  ++stats_.preemptions;
  DropKv(requests_.at(victim));
  return true;
}

}  // namespace kvrelay::engine
