#include "core/load_table.h"

#include <algorithm>
#include <utility>

#include "base/check.h"

namespace kvrelay {

Status CheckLoadShape(std::span<const PeerId> producers, size_t dst_blocks,
                      uint32_t max_producers) {
  if (producers.empty() || producers.size() > max_producers) {
    return InvalidArgumentError("a load needs 1.." + std::to_string(max_producers) +
                                " producers, got " + std::to_string(producers.size()));
  }
  if (dst_blocks == 0) return InvalidArgumentError("a load needs destination blocks");
  for (size_t i = 0; i < producers.size(); ++i) {
    for (size_t j = i + 1; j < producers.size(); ++j) {
      if (producers[i] == producers[j]) {
        return InvalidArgumentError("producer " + producers[i].ToString() + " named twice");
      }
    }
  }
  return Status::Ok();
}

LoadTable::LoadTable(const LoadTableOptions& options) : options_(options) {
  KV_CHECK_GT(options_.abort_timeout, Duration::Zero());
}

Status LoadTable::Start(RequestId request, TransferId transfer,
                        std::span<const PeerId> producers,
                        std::vector<BlockId> dst, Instant now,
                        uint64_t prompt_hash) {
  // Both indexes are looked up below with unrelated keys: with many loads
  // in flight each lookup is a cache miss, and issuing both now lets them
  // overlap (and overlap the shape check) instead of one after the other.
  by_transfer_.Prefetch(transfer);
  by_request_.prefetch(request);
  if (Status shape = CheckLoadShape(producers, dst.size(), options_.max_producers);
      !shape.ok()) {
    return shape;
  }
  if (FindLoad(transfer) != kNil) {
    return AlreadyExistsError("transfer " + transfer.ToString() +
                              " is already loading");
  }
  if (by_request_.count(request) != 0) {
    return AlreadyExistsError("request " + request.ToString() +
                              " is already loading");
  }
  if (by_transfer_.size() >= options_.max_loads) {
    return ResourceExhaustedError("load table full");
  }
  uint32_t slot;
  if (free_loads_ != kNil) {
    slot = free_loads_;
    free_loads_ = loads_[slot].next_free;
  } else {
    slot = static_cast<uint32_t>(loads_.size());
    loads_.emplace_back();
  }
  Load& load = loads_[slot];
  // A fresh record that keeps the slot's vectors' capacity: no allocation
  // per load once the slab is warm.
  std::vector<Producer> producers_buf = std::move(load.producers);
  std::vector<BlockId> dst_buf = std::move(load.dst);
  load = Load{};
  producers_buf.clear();
  load.producers = std::move(producers_buf);
  dst_buf.assign(dst.begin(), dst.end());
  load.dst = std::move(dst_buf);
  load.used = true;
  load.request = request;
  load.transfer = transfer;
  load.prompt_hash = prompt_hash;
  load.started = now;
  load.giveup = now + options_.abort_timeout + options_.giveup_grace;
  load.unanswered = static_cast<uint32_t>(producers.size());
  for (size_t k = 0; k < producers.size(); ++k) {
    Producer p;
    p.peer = producers[k];
    p.pull_seq = NextSeq(false);
    load.producers.push_back(p);
    // The last pull takes `dst` itself; the others copy it.
    actions_.push_back(SendPull{p.peer, p.pull_seq, transfer,
                                k + 1 == producers.size() ? std::move(dst) : dst,
                                prompt_hash});
  }
  by_transfer_.Insert(transfer, slot, LoadKeyOf{&loads_});
  by_request_.emplace(request, slot);
  giveup_.Arm(slot, load.giveup);
  ++stats_.loads_started;
  return Status::Ok();
}

bool LoadTable::Release(RequestId request, Instant /*now*/) {
  auto it = by_request_.find(request);
  if (it == by_request_.end()) return false;
  Load& load = loads_[it->second];
  if (load.released) return true;  // idempotent
  load.released = true;
  SendReleases(it->second);
  return true;
}

void LoadTable::ReleaseUnstarted(TransferId transfer,
                                 std::span<const PeerId> producers,
                                 uint64_t prompt_hash) {
  ++stats_.releases_unstarted;
  for (const PeerId& peer : producers) {
    ++stats_.releases_sent;
    actions_.push_back(SendPull{peer, NextSeq(true), transfer, {}, prompt_hash});
  }
}

void LoadTable::AbortAll(Instant /*now*/) {
  std::vector<uint32_t> live;
  live.reserve(by_transfer_.size());
  by_transfer_.ForEach([&](uint32_t slot) { live.push_back(slot); });
  std::sort(live.begin(), live.end());  // deterministic order
  for (uint32_t slot : live) {
    Load& load = loads_[slot];
    if (load.released || load.cut_short) continue;
    load.cut_short = true;
    SendReleases(slot);
  }
}

// Releases go only to producers that have not answered: an answered
// producer has already ended its send.
void LoadTable::SendReleases(uint32_t slot) {
  Load& load = loads_[slot];
  for (const Producer& p : load.producers) {
    if (p.answered) continue;
    ++stats_.releases_sent;
    actions_.push_back(SendPull{p.peer, NextSeq(true), load.transfer, {}, load.prompt_hash});
  }
}

void LoadTable::OnAnswer(PeerId peer, uint64_t pull_seq, TransferId transfer,
                         TransferResult result, Instant /*now*/, uint32_t first_token) {
  ++stats_.answers;
  if (IsReleaseSeq(pull_seq)) {
    ++stats_.release_answers;
    return;
  }
  const uint32_t slot = FindLoad(transfer);
  if (slot == kNil) {
    ++stats_.late_answers;
    return;
  }
  Load& load = loads_[slot];
  for (Producer& p : load.producers) {
    if (p.peer != peer || p.pull_seq != pull_seq) continue;
    if (p.answered) {
      ++stats_.duplicate_answers;
      return;
    }
    Record(slot, p, result, first_token);
    FinishIfComplete(slot);
    return;
  }
  ++stats_.mismatched_answers;
}

void LoadTable::ResendTo(PeerId peer, Instant now) {
  std::vector<uint32_t> slots;
  by_transfer_.ForEach([&](uint32_t slot) { slots.push_back(slot); });
  std::sort(slots.begin(), slots.end());  // deterministic order
  for (uint32_t slot : slots) {
    const Load& load = loads_[slot];
    // P may start a write only before the pull's deadline, which is the
    // give-up time less the grace: a resend grants only what is left.
    const Duration left = (load.giveup - options_.giveup_grace) - now;
    if (left <= Duration::Zero()) continue;
    for (const Producer& p : load.producers) {
      if (p.peer != peer || p.answered) continue;
      ++stats_.resent;
      actions_.push_back(
          SendPull{peer, p.pull_seq, load.transfer, load.dst, load.prompt_hash, left.ns()});
      if (load.released || load.cut_short) {
        ++stats_.releases_sent;
        actions_.push_back(SendPull{peer, NextSeq(true), load.transfer, {}, load.prompt_hash});
      }
    }
  }
}

void LoadTable::PeerGone(PeerId peer, Instant /*now*/) {
  std::vector<uint32_t> hit;
  by_transfer_.ForEach([&](uint32_t slot) {
    for (const Producer& p : loads_[slot].producers) {
      if (p.peer == peer && !p.answered) hit.push_back(slot);
    }
  });
  std::sort(hit.begin(), hit.end());
  hit.erase(std::unique(hit.begin(), hit.end()), hit.end());
  for (uint32_t slot : hit) {
    for (Producer& p : loads_[slot].producers) {
      if (p.peer == peer && !p.answered) {
        ++stats_.producers_lost;
        Record(slot, p, TransferResult::kUnreachable);
      }
    }
    FinishIfComplete(slot);
  }
}

void LoadTable::OnTimer(Instant now) {
  while (auto slot = giveup_.PopExpired(now)) {
    Load& load = loads_[*slot];
    KV_CHECK(load.used);
    for (Producer& p : load.producers) {
      if (p.answered) continue;
      ++stats_.producers_given_up;
      // Best effort: if P still holds the send (our pull or its answer was
      // lost), the release lets it free now instead of at expiry. A load
      // released or cut short has told its producers already.
      if (!load.released && !load.cut_short) {
        ++stats_.releases_sent;
        actions_.push_back(SendPull{p.peer, NextSeq(true), load.transfer, {}, load.prompt_hash});
      }
      Record(*slot, p, TransferResult::kDeadline);
    }
    FinishIfComplete(*slot);
  }
}

std::optional<Instant> LoadTable::NextDeadline() const {
  if (auto top = giveup_.Top()) return top->first;
  return std::nullopt;
}

std::optional<LoadAction> LoadTable::PollAction() {
  if (actions_.empty()) return std::nullopt;
  LoadAction a = std::move(actions_.front());
  actions_.pop_front();
  return a;
}

void LoadTable::Record(uint32_t slot, Producer& p, TransferResult result,
                       uint32_t first_token) {
  Load& load = loads_[slot];
  KV_CHECK(!p.answered);
  KV_CHECK_GT(load.unanswered, 0u);
  // A failed answer names no token, so a load that failed anywhere has none.
  const auto answered = static_cast<uint32_t>(load.producers.size()) - load.unanswered;
  load.first_token = AgreeFirstToken(load.first_token, answered,
                                     result == TransferResult::kOk ? first_token : kNoFirstToken);
  p.answered = true;
  p.result = result;
  --load.unanswered;
  if (result != TransferResult::kOk && !load.failed) {
    load.failed = true;  // sticky
    load.first_error = result;
  }
}

// The only place a load ends.
void LoadTable::FinishIfComplete(uint32_t slot) {
  Load& load = loads_[slot];
  KV_CHECK(load.used);
  if (load.unanswered > 0) return;
  if (load.released) {
    ++stats_.loads_released;
    actions_.push_back(LoadReleased{load.request, load.transfer});
  } else {
    // A cut-short load is failed even if every byte landed: the cache reset
    // that cut it short is about to wipe those blocks, so the request must
    // recompute (0 computed tokens), never decode on them. A producer that
    // answered kReset or kMismatch cut it short (RecomputeAnyway).
    const bool cut_short = load.cut_short || AnyProducerCutShort(load.producers);
    const bool ok = !load.failed && !cut_short;
    const TransferResult first_error =
        load.failed ? load.first_error
                    : (cut_short ? TransferResult::kAborted : TransferResult::kOk);
    ++(ok ? stats_.loads_ok : stats_.loads_failed);
    if (cut_short) ++stats_.loads_cut_short;
    actions_.push_back(LoadDone{load.request, load.transfer, ok, cut_short, first_error,
                                ok ? load.first_token : kNoFirstToken});  // cut short: none
  }
  giveup_.Cancel(slot);
  KV_CHECK(by_transfer_.Erase(load.transfer, LoadKeyOf{&loads_}));
  by_request_.erase(load.request);
  load.used = false;
  load.producers.clear();
  load.dst.clear();
  load.next_free = free_loads_;
  free_loads_ = slot;
}

void LoadTable::CheckInvariants() const {
  giveup_.CheckInvariants();
  KV_CHECK_EQ(by_transfer_.size(), by_request_.size());
  KV_CHECK_EQ(giveup_.size(), by_transfer_.size());
  // Every entry's tag is its record's transfer id's, and a lookup of that
  // id finds the entry.
  by_transfer_.CheckInvariants(LoadKeyOf{&loads_});
  by_transfer_.ForEach([&](uint32_t slot) {
    const Load& load = loads_[slot];
    KV_CHECK(load.used);
    KV_CHECK(giveup_.IsArmed(slot));
    auto r = by_request_.find(load.request);
    KV_CHECK(r != by_request_.end() && r->second == slot);
    uint32_t unanswered = 0;
    bool any_error = false;
    for (const Producer& p : load.producers) {
      if (!p.answered) ++unanswered;
      else if (p.result != TransferResult::kOk) any_error = true;
    }
    KV_CHECK_EQ(unanswered, load.unanswered);
    KV_CHECK_GT(unanswered, 0u);  // a complete load is never left live
    KV_CHECK_EQ(any_error, load.failed);
  });
}

}  // namespace kvrelay

namespace kvrelay {

std::vector<LoadView> LoadTable::Loads() const {
  std::vector<LoadView> out;
  out.reserve(by_transfer_.size());
  for (const Load& l : loads_) {
    if (!l.used) continue;
    LoadView& v = out.emplace_back(LoadView{l.request, l.transfer, l.started,
                                            static_cast<uint32_t>(l.producers.size()),
                                            l.unanswered, static_cast<uint32_t>(l.dst.size()),
                                            l.failed, l.released, l.cut_short, {}});
    for (const Producer& p : l.producers) {
      if (!p.answered) v.waiting_on.push_back(p.peer);
    }
  }
  return out;
}

}  // namespace kvrelay
