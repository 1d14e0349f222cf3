#include "core/connector_scheduler.h"

#include "base/check.h"

namespace kvrelay {

ConnectorScheduler::ConnectorScheduler(const ConnectorSchedulerOptions& options)
    : options_(options) {
  KV_CHECK_GT(options_.tp, 0u);
}

Status ConnectorScheduler::AdmitRequest(RequestId request,
                                        const KvTransferParams& params) {
  KV_CHECK(requests_.count(request) == 0);
  if (params.do_remote_decode && params.do_remote_prefill) {
    return InvalidArgumentError("a request cannot both prefill and decode remotely");
  }
  const bool p = options_.role != ConnectorRole::kConsumer;
  const bool d = options_.role != ConnectorRole::kProducer;
  if (params.do_remote_decode) {
    if (!p) return InvalidArgumentError("do_remote_decode on a decode-only engine");
    if (params.transfer.IsZero()) return InvalidArgumentError("missing transfer_id");
    if (sending_.count(params.transfer) != 0) {
      ++stats_.duplicate_transfer_rejected;
      return AlreadyExistsError("transfer_id " + params.transfer.ToString() +
                                " is held by a live request");
    }
    requests_.emplace(request, Entry{Phase::kClaimed, params});
    sending_.emplace(params.transfer, request);
    pending_.claims.push_back(
        ClaimOp{params.transfer, params.remote_tp, params.prompt_hash, params.consumer_engine});
    return Status::Ok();
  }
  if (params.do_remote_prefill) {
    if (!d) return InvalidArgumentError("do_remote_prefill on a prefill-only engine");
    if (params.transfer.IsZero()) return InvalidArgumentError("missing transfer_id");
    if (receiving_.count(params.transfer) != 0) {
      ++stats_.duplicate_transfer_rejected;
      return AlreadyExistsError("transfer_id " + params.transfer.ToString() +
                                " is loading for a live request");
    }
    requests_.emplace(request, Entry{Phase::kAwaitingAlloc, params});
    receiving_.emplace(params.transfer, request);
    return Status::Ok();
  }
  return Status::Ok();  // a plain request: nothing to track
}

bool ConnectorScheduler::RemotePrefill(RequestId request) const {
  auto it = requests_.find(request);
  return it != requests_.end() && it->second.phase == Phase::kAwaitingAlloc;
}

void ConnectorScheduler::OnBlocksAllocated(RequestId request,
                                           std::vector<BlockId> blocks,
                                           uint64_t prompt_hash) {
  auto it = requests_.find(request);
  KV_CHECK(it != requests_.end());
  KV_CHECK(it->second.phase == Phase::kAwaitingAlloc);
  Entry& e = it->second;
  e.phase = Phase::kLoading;
  e.reports = 0;
  if (prompt_hash != 0) e.params.prompt_hash = prompt_hash;
  pending_.loads.push_back(LoadOp{request, e.params.transfer, e.params.remote_engine,
                                  e.params.remote_tp, std::move(blocks),
                                  e.params.prompt_hash});
}

bool ConnectorScheduler::RequestFinished(RequestId request,
                                         std::span<const BlockId> blocks,
                                         bool aborted, uint64_t prompt_hash,
                                         uint32_t first_token) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return false;
  Entry& e = it->second;
  switch (e.phase) {
    case Phase::kClaimed:
      if (aborted || blocks.empty()) {
        pending_.aborts.push_back(AbortSendOp{e.params.transfer});
        Erase(it);
        return false;
      }
      e.phase = Phase::kHeld;
      e.reports = 0;
      pending_.readies.push_back(
          ReadyOp{e.params.transfer, std::vector<BlockId>(blocks.begin(), blocks.end()),
                  prompt_hash != 0 ? prompt_hash : e.params.prompt_hash, first_token});
      return true;
    case Phase::kStreaming:
      // Ranks may be reading the blocks handed over: keep them until every
      // rank is done (at once if all ended the send already).
      if (aborted || blocks.empty()) {
        pending_.aborts.push_back(AbortSendOp{e.params.transfer});
      } else if (e.reports < options_.tp) {
        pending_.readies.push_back(
            ReadyOp{e.params.transfer, std::vector<BlockId>(blocks.begin(), blocks.end()),
                    prompt_hash != 0 ? prompt_hash : e.params.prompt_hash, first_token,
                    /*streamed=*/true});
      }
      if (e.reports == options_.tp) {
        Erase(it);
        return false;
      }
      e.phase = Phase::kHeld;
      return true;
    case Phase::kAbandoned:
      // Its hand-off ended at the preemption; what it recomputed is its own.
      return false;
    case Phase::kAwaitingAlloc:
      pending_.unstarted_releases.push_back(
          ReleaseUnstartedOp{e.params.transfer, e.params.remote_engine,
                             e.params.remote_tp, e.params.prompt_hash});
      Erase(it);
      return false;
    case Phase::kLoading:
      e.phase = Phase::kReleasing;
      e.reports = 0;
      pending_.releases.push_back(ReleaseLoadOp{request});
      return true;
    case Phase::kHeld:
    case Phase::kReleasing:
      KV_CHECK_MSG(false, "RequestFinished twice for one request");
  }
  return false;
}

bool ConnectorScheduler::PrefillProgress(RequestId request, std::span<const BlockId> prefix,
                                         uint32_t total_blocks, uint64_t prompt_hash) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return false;
  Entry& e = it->second;
  if (e.phase != Phase::kClaimed && e.phase != Phase::kStreaming) return false;
  if (prefix.size() <= e.streamed || e.reports == options_.tp) return false;
  KV_CHECK_LE(prefix.size(), total_blocks);
  const bool first = e.phase == Phase::kClaimed;
  if (first) e.reports = 0;
  e.phase = Phase::kStreaming;
  e.streamed = static_cast<uint32_t>(prefix.size());
  pending_.progress.push_back(
      ProgressOp{e.params.transfer, std::vector<BlockId>(prefix.begin(), prefix.end()),
                 total_blocks, prompt_hash != 0 ? prompt_hash : e.params.prompt_hash, first});
  return true;
}

bool ConnectorScheduler::StreamPreempted(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end() || it->second.phase != Phase::kStreaming) return false;
  Entry& e = it->second;
  if (e.reports == options_.tp) {
    // Every rank is done with the blocks already.
    Erase(it);
    return false;
  }
  // kReset: as for a held send at a cache reset, D recomputes whatever its
  // failure policy (a request kept by a call must not fail for it).
  pending_.aborts.push_back(AbortSendOp{e.params.transfer, /*reset=*/true});
  e.phase = Phase::kAbandoned;
  return true;
}

void ConnectorScheduler::AbortHeld(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end() || it->second.phase != Phase::kHeld) return;
  pending_.aborts.push_back(AbortSendOp{it->second.params.transfer});
}

ConnectorMetadata ConnectorScheduler::BuildMetadata() {
  ConnectorMetadata out;
  std::swap(out, pending_);
  return out;
}

EngineFinished ConnectorScheduler::OnRankReport(uint32_t rank,
                                                const RankReport& report) {
  KV_CHECK_LT(rank, options_.tp);
  EngineFinished out;
  for (const TransferId& t : report.finished_sending) {
    auto s = sending_.find(t);
    KV_CHECK(s != sending_.end());
    const RequestId request = s->second;
    Entry& e = requests_.at(request);
    KV_CHECK(e.phase == Phase::kHeld || e.phase == Phase::kStreaming ||
             e.phase == Phase::kAbandoned);
    ++e.reports;
    KV_CHECK_LE(e.reports, options_.tp);
    // A streaming request still runs: RequestFinished sees the count.
    if (e.reports == options_.tp && e.phase != Phase::kStreaming) {
      (e.phase == Phase::kHeld ? out.sending_done : out.unparked).push_back(request);
      Erase(requests_.find(request));
    }
  }
  for (const LoadDone& done : report.finished_recving) {
    auto it = requests_.find(done.request);
    if (it == requests_.end() || it->second.phase == Phase::kReleasing) {
      // Released meanwhile: the `released` reports decide for it.
      ++stats_.stale_reports;
      continue;
    }
    Entry& e = it->second;
    KV_CHECK(e.phase == Phase::kLoading);
    e.load_ok = e.load_ok && done.ok;
    e.cut_short = e.cut_short || done.cut_short;
    e.first_token = AgreeFirstToken(e.first_token, e.reports, done.first_token);
    if (++e.reports == options_.tp) {
      // A rank whose load failed or was cut short reported no token.
      out.recving_done.push_back(
          LoadOutcome{done.request, e.load_ok, e.cut_short, e.first_token});
      Erase(it);
    }
  }
  for (const RequestId& request : report.released) {
    auto it = requests_.find(request);
    KV_CHECK(it != requests_.end());
    Entry& e = it->second;
    KV_CHECK(e.phase == Phase::kReleasing);
    if (++e.reports == options_.tp) {
      out.released.push_back(request);
      Erase(it);
    }
  }
  return out;
}

void ConnectorScheduler::Erase(std::unordered_map<RequestId, Entry>::iterator it) {
  KV_CHECK(it != requests_.end());
  const Entry& e = it->second;
  auto& index = Sending(e.phase) ? sending_ : receiving_;
  auto x = index.find(e.params.transfer);
  KV_CHECK(x != index.end() && x->second == it->first);
  index.erase(x);
  requests_.erase(it);
}

size_t ConnectorScheduler::held_sends() const {
  size_t n = 0;
  for (const auto& [r, e] : requests_) n += e.phase == Phase::kHeld;
  return n;
}

size_t ConnectorScheduler::live_loads() const {
  size_t n = 0;
  for (const auto& [r, e] : requests_) {
    n += e.phase == Phase::kLoading || e.phase == Phase::kReleasing;
  }
  return n;
}

void ConnectorScheduler::CheckInvariants() const {
  size_t p = 0, d = 0;
  for (const auto& [r, e] : requests_) {
    KV_CHECK_LE(e.reports, options_.tp);
    const bool sending = Sending(e.phase);
    auto& index = sending ? sending_ : receiving_;
    ++(sending ? p : d);
    auto s = index.find(e.params.transfer);
    KV_CHECK(s != index.end() && s->second == r);
  }
  KV_CHECK_EQ(p, sending_.size());
  KV_CHECK_EQ(d, receiving_.size());
}

}  // namespace kvrelay
