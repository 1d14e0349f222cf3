#include "sim/scripted_engine.h"

#include <algorithm>

#include "base/check.h"
#include "core/tp_mapping.h"

namespace kvrelay::sim {

ScriptedEngine::ScriptedEngine(const Config& config, EngineHost* host,
                               SimMemory* memory)
    : config_(config),
      host_(host),
      memory_(memory),
      pool_(config.pool_blocks),
      connector_(ConnectorSchedulerOptions{config.role, config.tp, config.engine}) {}

ScriptedEngine::Req* ScriptedEngine::Find(RequestId id) {
  if (id.generation != config_.incarnation) return nullptr;
  auto it = requests_.find(id.index);
  return it == requests_.end() ? nullptr : &it->second;
}

void ScriptedEngine::OnLeg(const LegSpec& leg, Instant /*now*/) {
  KV_CHECK(requests_.count(leg.request) == 0);
  const RequestId id{leg.request, config_.incarnation};
  Status s = connector_.AdmitRequest(id, leg.params);
  if (!s.ok()) {
    if (s.code() == StatusCode::kAlreadyExists) host_->Hit(Mark::kDuplicateTransferRejected);
    host_->LegEnded(config_.engine, leg.request, LegOutcome::kError);
    return;
  }
  Req& r = requests_[leg.request];
  r.leg = leg;
  r.id = id;
  waiting_.push_back(leg.request);
  host_->ScheduleStep(config_.engine);
}

bool ScriptedEngine::TryAllocate(Req& r) {
  const uint32_t n = r.leg.prompt_blocks;
  if (pool_.num_free() + pool_.num_cached_idle() < n) return false;
  for (uint32_t i = 0; i < n; ++i) {
    Result<BlockId> b = pool_.Allocate();
    KV_CHECK(b.ok());
    r.blocks.push_back(*b);
  }
  return true;
}

void ScriptedEngine::Step(std::vector<RankReport> reports, Instant /*now*/) {
  for (uint32_t rank = 0; rank < reports.size(); ++rank) {
    if (!reports[rank].empty()) ApplyFinished(connector_.OnRankReport(rank, reports[rank]));
  }
  // Allocate in arrival order; the head waits for blocks (pool pressure).
  while (!waiting_.empty()) {
    auto it = requests_.find(waiting_.front());
    KV_CHECK(it != requests_.end());
    Req& r = it->second;
    KV_CHECK(r.phase == Phase::kWaitBlocks);
    if (!TryAllocate(r)) {
      host_->Hit(Mark::kPoolPressure);
      break;
    }
    waiting_.pop_front();
    if (producer()) {
      r.phase = Phase::kPrefilling;
      host_->ScheduleWork(config_.engine, r.leg.request, true,
                          Duration::Nanoseconds(static_cast<int64_t>(
                              host_->prng().Uniform(config_.prefill_time_max.ns()) + 1)));
    } else {
      for (const BlockId& b : r.blocks) memory_->SetOwner(b, r.leg.params.transfer);
      connector_.OnBlocksAllocated(r.id, r.blocks);
      r.phase = Phase::kLoading;
    }
  }
  ConnectorMetadata meta = connector_.BuildMetadata();
  if (!meta.empty()) host_->ApplyToRanks(config_.engine, meta);
}

void ScriptedEngine::ApplyFinished(const EngineFinished& f) {
  for (const RequestId& id : f.sending_done) {
    Req* r = Find(id);
    if (r == nullptr || r->phase != Phase::kHeld) {
      host_->Violation("sending_done for a request that holds no KV");
      continue;
    }
    FreeBlocks(*r);
    requests_.erase(id.index);
  }
  for (const LoadOutcome& done : f.recving_done) {
    Req* r = Find(done.request);
    if (r == nullptr || r->phase != Phase::kLoading) {
      host_->Violation("load completion for a request that is not loading");
      continue;
    }
    if (done.ok) {
      if (!VerifyKv(*r)) {
        host_->Violation("request " + std::to_string(r->leg.request) + " (transfer " +
                         r->leg.params.transfer.ToString() +
                         "): load reported ok but the KV is not this prompt's");
      }
    } else {
      if (done.cut_short) host_->Hit(Mark::kLoadCutShort);
      if (!done.cut_short && !config_.recompute_on_failure) {
        host_->Hit(Mark::kLoadFailedError);
        FreeBlocks(*r);
        const uint32_t request = r->leg.request;
        requests_.erase(request);
        host_->LegEnded(config_.engine, request, LegOutcome::kError);
        continue;
      }
      // Recompute locally with 0 computed tokens: never decode on garbage.
      host_->Hit(Mark::kLoadFailedRecompute);
      WriteLocalKv(*r);
    }
    r->phase = Phase::kDecoding;
    host_->ScheduleWork(config_.engine, r->leg.request, false,
                        Duration::Nanoseconds(static_cast<int64_t>(
                            host_->prng().Uniform(config_.decode_time_max.ns()) + 1)));
  }
  for (const RequestId& id : f.released) {
    Req* r = Find(id);
    if (r == nullptr || r->phase != Phase::kReleasing) {
      host_->Violation("released for a request that is not releasing");
      continue;
    }
    FreeBlocks(*r);
    requests_.erase(id.index);
  }
}

void ScriptedEngine::OnPrefillDone(uint32_t request, Instant /*now*/) {
  auto it = requests_.find(request);
  if (it == requests_.end() || it->second.phase != Phase::kPrefilling) return;
  Req& r = it->second;
  WriteLocalKv(r);
  if (connector_.RequestFinished(r.id, r.blocks, /*aborted=*/false)) {
    r.phase = Phase::kHeld;
    host_->ScheduleStep(config_.engine);
  } else {
    FreeBlocks(r);
    requests_.erase(it);
  }
  host_->LegEnded(config_.engine, request, LegOutcome::kOk);
}

void ScriptedEngine::OnDecodeDone(uint32_t request, Instant /*now*/) {
  auto it = requests_.find(request);
  if (it == requests_.end() || it->second.phase != Phase::kDecoding) return;
  Req& r = it->second;
  if (!VerifyKv(r)) {
    host_->Violation("request " + std::to_string(request) +
                     ": decoded on KV that is not this prompt's");
  }
  FreeBlocks(r);
  requests_.erase(it);
  host_->LegEnded(config_.engine, request, LegOutcome::kOk);
}

void ScriptedEngine::OnAbort(uint32_t request, Instant /*now*/) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return;  // already ended
  Req& r = it->second;
  switch (r.phase) {
    case Phase::kWaitBlocks: {
      auto w = std::find(waiting_.begin(), waiting_.end(), request);
      KV_CHECK(w != waiting_.end());
      waiting_.erase(w);
      if (!producer()) host_->Hit(Mark::kReleaseBeforeAlloc);
      KV_CHECK(!connector_.RequestFinished(r.id, {}, /*aborted=*/true));
      requests_.erase(it);
      host_->LegEnded(config_.engine, request, LegOutcome::kAborted);
      break;
    }
    case Phase::kPrefilling:
    case Phase::kDecoding:
      KV_CHECK(!connector_.RequestFinished(r.id, r.blocks, /*aborted=*/true));
      FreeBlocks(r);
      requests_.erase(it);
      host_->LegEnded(config_.engine, request, LegOutcome::kAborted);
      break;
    case Phase::kHeld:
      connector_.AbortHeld(r.id);
      break;
    case Phase::kLoading:
      host_->Hit(Mark::kReleaseWhileLoading);
      KV_CHECK(connector_.RequestFinished(r.id, r.blocks, /*aborted=*/true));
      r.phase = Phase::kReleasing;
      host_->LegEnded(config_.engine, request, LegOutcome::kAborted);
      break;
    case Phase::kReleasing:
      break;
  }
  host_->ScheduleStep(config_.engine);
}

void ScriptedEngine::AbortTransfers() {
  connector_.AbortTransfers();
  host_->ScheduleStep(config_.engine);
}

void ScriptedEngine::Crash() {
  for (auto& [request, r] : requests_) {
    if (r.phase != Phase::kHeld && r.phase != Phase::kReleasing) {
      host_->LegEnded(config_.engine, request, LegOutcome::kError);
    }
  }
  requests_.clear();
  waiting_.clear();
}

void ScriptedEngine::FreeBlocks(Req& r) {
  if (!producer()) host_->BlocksFreed(config_.engine, r.blocks);
  for (const BlockId& b : r.blocks) {
    if (!pool_.IsLive(b)) {
      host_->Violation("block " + b.ToString() + " freed twice");
      continue;
    }
    memory_->ClearOwner(b);
    pool_.Unref(b);
  }
  r.blocks.clear();
  // Freed blocks may let the head of the allocation queue in.
  if (!waiting_.empty()) host_->ScheduleStep(config_.engine);
}

void ScriptedEngine::WriteLocalKv(const Req& r) {
  const TransferId t = r.leg.params.transfer;
  for (uint32_t i = 0; i < r.blocks.size(); ++i) {
    const BlockId b = r.blocks[i];
    memory_->SetOwner(b, t);
    for (uint32_t rank = 0; rank < config_.tp; ++rank) {
      if (producer()) {
        memory_->At(b.index, rank, 0) = KvDigest(r.leg.params.prompt_hash, i, rank);
        continue;
      }
      std::vector<uint32_t> ps = ProducerRanksFor(rank, config_.tp, r.leg.remote_tp);
      for (uint32_t k = 0; k < ps.size(); ++k) {
        memory_->At(b.index, rank, k) = KvDigest(r.leg.params.prompt_hash, i, ps[k]);
      }
    }
  }
}

bool ScriptedEngine::VerifyKv(const Req& r) {
  const TransferId t = r.leg.params.transfer;
  for (uint32_t i = 0; i < r.blocks.size(); ++i) {
    const BlockId b = r.blocks[i];
    if (!memory_->OwnedBy(b, t)) return false;
    for (uint32_t rank = 0; rank < config_.tp; ++rank) {
      std::vector<uint32_t> ps = ProducerRanksFor(rank, config_.tp, r.leg.remote_tp);
      for (uint32_t k = 0; k < ps.size(); ++k) {
        if (memory_->At(b.index, rank, k) != KvDigest(r.leg.params.prompt_hash, i, ps[k])) return false;
      }
    }
  }
  return true;
}

void ScriptedEngine::CheckInvariants() const {
  pool_.CheckInvariants();
  connector_.CheckInvariants();
  size_t held = 0;
  for (const auto& [request, r] : requests_) held += r.blocks.size();
  KV_CHECK_EQ(held, pool_.num_referenced());
}

}  // namespace kvrelay::sim
