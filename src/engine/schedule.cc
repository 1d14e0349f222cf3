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

uint32_t Engine::Schedule() {
  if (!SchedulingAllowed()) return 0;
  uint32_t budget = options_.max_batch_tokens;
  AdmitWaiting();
  // Oldest first; a request preempted meanwhile is skipped.
  std::vector<uint64_t> order = running_;
  for (uint64_t client : order) {
    if (budget == 0) break;
    auto it = requests_.find(client);
    if (it == requests_.end() || it->second.phase != Phase::kRunning) continue;
    AdvanceRunning(it->second, &budget);
  }
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

// Computes the next chunk of `r` (prefill) or its next token (decode).
bool Engine::AdvanceRunning(Request& r, uint32_t* budget) {
  const uint32_t len = static_cast<uint32_t>(r.seq.size());
  if (r.computed < len) {
    const uint32_t chunk = std::min(len - r.computed, *budget);
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
    WriteKv(r, r.computed + chunk);
    *budget -= chunk;
  }
  if (r.computed < len) return true;  // prefill continues next step
  const Token t = NextTokenOf(r);
  dirty_ = true;  // a token is progress even when no KV had to be computed
  actions_.push_back(TokenOut{r.client, t, weights_});
  r.seq.push_back(t);
  ++r.generated;
  if (r.generated >= r.max_tokens) Finish(r, FinishReason::kLength);
  return true;
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

// Writes the KV of tokens [computed, upto) — rewriting the partial block it
// extends — and offers completed blocks to the prefix cache.
void Engine::WriteKv(Request& r, uint32_t upto) {
  const uint32_t bs = options_.shape.block_tokens;
  const std::span<const Token> prefix(r.seq.data(), upto);
  for (uint32_t b = r.computed / bs; b * bs < upto; ++b) {
    for (uint32_t g = 0; g < kHeadGroups; ++g) {
      memory_->Write(r.blocks[b], g, BlockDigest(weights_, prefix, bs, b, g));
    }
    if (options_.prefix_caching && (b + 1) * bs <= upto) {
      pool_.Cache(r.blocks[b],
                  PrefixHash(weights_, std::span<const Token>(r.seq.data(), (b + 1) * bs)));
    }
  }
  r.computed = upto;
}

// D's first token after a load is the one P computed from the same KV, if
// P handed it over: no step on the loaded KV for it. The token after it
// reads all of that KV (Generate), so KV that landed wrong still shows in
// the output. A request that wants one token only reads it now, as P did.
Token Engine::NextTokenOf(Request& r) {
  const Token carried = r.producer_token;
  r.producer_token = kNoFirstToken;
  if (options_.producer_first_token && carried != kNoFirstToken && r.generated == 0 &&
      r.max_tokens > 1) {
    ++stats_.producer_tokens;
    return carried;
  }
  return Generate(r);
}

// The next token from the KV actually present in the request's blocks.
Token Engine::Generate(Request& r) {
  const uint32_t len = static_cast<uint32_t>(r.seq.size());
  const uint32_t n = BlocksFor(len, options_.shape.block_tokens);
  read_scratch_.resize(size_t{n} * kHeadGroups);
  memory_->ReadBlocks(std::span<const BlockId>(r.blocks.data(), n), read_scratch_);
  uint64_t folded = 0;
  for (const uint64_t digest : read_scratch_) folded = FoldDigest(folded, digest);
  return NextToken(weights_, folded, len, options_.shape.vocab);
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
