#include "core/read_load_table.h"

#include <algorithm>
#include <utility>

#include "base/check.h"

namespace kvrelay {

ReadLoadTable::ReadLoadTable(const ReadLoadTableOptions& options) : options_(options) {
  KV_CHECK_GT(options_.heartbeat_interval, Duration::Zero());
  KV_CHECK_GE(options_.read_margin, Duration::Zero());
  KV_CHECK_GT(options_.giveup, Duration::Zero());
  KV_CHECK_GT(options_.max_outstanding_heartbeats, 0u);
  KV_CHECK_LE(options_.max_producers, 256u);  // ReadIdOf packs the producer in 8 bits
}

// ---------------------------------------------------------------------------
// Inputs from D's engine.

Status ReadLoadTable::Start(RequestId request, TransferId transfer,
                            std::span<const PeerId> producers, std::vector<BlockId> dst,
                            Instant now, uint64_t prompt_hash) {
  if (Status shape = CheckLoadShape(producers, dst.size(), options_.max_producers);
      !shape.ok()) {
    return shape;
  }
  if (by_transfer_.count(transfer) != 0) {
    return AlreadyExistsError("transfer " + transfer.ToString() + " is already loading");
  }
  if (by_request_.count(request) != 0) {
    return AlreadyExistsError("request " + request.ToString() + " is already loading");
  }
  if (by_transfer_.size() >= options_.max_loads) return ResourceExhaustedError("load table full");
  uint32_t slot;
  if (free_loads_ != kNil) {
    slot = free_loads_;
    free_loads_ = loads_[slot].next_free;
  } else {
    slot = static_cast<uint32_t>(loads_.size());
    loads_.emplace_back();
  }
  Load& load = loads_[slot];
  const uint32_t generation = load.generation + 1;
  load = Load{};
  load.used = true;
  load.generation = generation;
  load.request = request;
  load.transfer = transfer;
  load.dst = std::move(dst);
  load.prompt_hash = prompt_hash;
  load.started = now;
  load.giveup = now + options_.giveup;
  load.next_heartbeat = now + options_.heartbeat_interval;
  load.producers.resize(producers.size());
  for (size_t i = 0; i < producers.size(); ++i) {
    load.producers[i].peer = producers[i];
    Heartbeat(load, load.producers[i], now);
  }
  by_transfer_.emplace(transfer, slot);
  by_request_.emplace(request, slot);
  ++stats_.loads_started;
  Arm(slot);
  return Status::Ok();
}

bool ReadLoadTable::Release(RequestId request, Instant now) {
  (void)now;
  auto it = by_request_.find(request);
  if (it == by_request_.end()) return false;
  const uint32_t slot = it->second;
  Load& load = loads_[slot];
  load.released = true;
  for (Producer& p : load.producers) {
    // A producer still asking has nothing in flight: P may free now. One
    // that is reading tells P when the read has landed (EndNotice).
    if (p.state == PState::kAsking) {
      ++stats_.releases_sent;
      actions_.push_back(SendNotice{p.peer, load.transfer, ReadNotice::kRelease});
      FinishProducer(slot, p, TransferResult::kReleased);
    }
  }
  FinishIfComplete(slot);
  return true;
}

void ReadLoadTable::ReleaseUnstarted(TransferId transfer, std::span<const PeerId> producers,
                                     uint64_t /*prompt_hash*/) {
  // A release promises P that this rank has no read of the transfer in
  // flight. If a live load here has the same transfer_id (a duplicate id
  // from the router: the load is someone else's), that promise would be
  // false — P would free blocks the load is reading. The load tells P
  // itself when it ends.
  if (by_transfer_.count(transfer) != 0) {
    ++stats_.releases_skipped_live;
    return;
  }
  for (const PeerId& peer : producers) {
    ++stats_.releases_sent;
    actions_.push_back(SendNotice{peer, transfer, ReadNotice::kRelease});
  }
}

void ReadLoadTable::AbortAll(Instant now) {
  (void)now;
  std::vector<uint32_t> live;
  live.reserve(by_transfer_.size());
  for (const auto& [t, slot] : by_transfer_) live.push_back(slot);
  std::sort(live.begin(), live.end());  // slot order: deterministic actions
  for (uint32_t slot : live) {
    Load& load = loads_[slot];
    if (load.released || load.cut_short) continue;
    load.cut_short = true;
    for (Producer& p : load.producers) {
      if (p.state != PState::kAsking) continue;
      ++stats_.releases_sent;
      actions_.push_back(SendNotice{p.peer, load.transfer, ReadNotice::kRelease});
      FinishProducer(slot, p, TransferResult::kAborted);
    }
    FinishIfComplete(slot);
  }
}

// ---------------------------------------------------------------------------
// Inputs from P ranks and from the reader.

void ReadLoadTable::OnGrant(PeerId peer, const GrantLease& grant, Instant now) {
  auto it = by_transfer_.find(grant.transfer);
  if (it == by_transfer_.end()) {
    ++stats_.grants_unmatched;
    return;
  }
  const uint32_t slot = it->second;
  Load& load = loads_[slot];
  Producer* p = FindProducer(load, peer);
  if (p == nullptr) {
    ++stats_.grants_unmatched;
    return;
  }
  // Answers come in heartbeat order on one connection; older entries are
  // answers that were lost (or will not come).
  std::optional<Instant> sent_at;
  while (!p->outstanding.empty() && p->outstanding.front().seq <= grant.seq) {
    if (p->outstanding.front().seq == grant.seq) sent_at = p->outstanding.front().at;
    p->outstanding.pop_front();
  }
  if (!sent_at || p->state == PState::kFinished) {
    ++stats_.grants_unmatched;
    return;
  }
  switch (grant.answer) {
    case LeaseAnswer::kPending:
      ++stats_.pending_answers;
      return;
    case LeaseAnswer::kEnded:
      ++stats_.ended_answers;
      // P ended the transfer: no notice owed unless a read is in flight.
      StopProducer(slot, *p, grant.result == TransferResult::kOk ? TransferResult::kAborted
                                                                  : grant.result,
                   std::nullopt);
      FinishIfComplete(slot);
      return;
    case LeaseAnswer::kGranted:
      break;
  }
  ++stats_.grants;
  // Counted from when D sent the heartbeat: P extended and measured the
  // lease later than that, so this is never later than P's expiry.
  const Instant view = *sent_at + Duration::Nanoseconds(grant.remaining_ns);
  if (view > p->lease_view) p->lease_view = view;
  if (p->state != PState::kAsking) return;  // reading: the lease just moved on
  if (grant.src.size() != load.dst.size()) {
    // P's blocks do not match D's: a protocol error, never a partial read.
    StopProducer(slot, *p, TransferResult::kRejected, ReadNotice::kFailed);
    FinishIfComplete(slot);
    return;
  }
  if (now + options_.read_margin >= p->lease_view) {
    ++stats_.grants_too_late;  // the next heartbeat extends and asks again
    return;
  }
  const uint32_t index = static_cast<uint32_t>(p - load.producers.data());
  p->state = PState::kReading;
  ++reads_in_flight_;
  ++stats_.reads_started;
  actions_.push_back(StartRead{ReadIdOf(slot, index, load.generation), peer, load.transfer,
                               grant.src, load.dst, p->lease_view - options_.read_margin});
}

void ReadLoadTable::OnRevoke(PeerId peer, TransferId transfer, TransferResult reason,
                             Instant now) {
  (void)now;
  ++stats_.revokes;
  auto it = by_transfer_.find(transfer);
  if (it == by_transfer_.end()) return;  // our final notice is on its way
  const uint32_t slot = it->second;
  Producer* p = FindProducer(loads_[slot], peer);
  if (p == nullptr) return;
  if (p->state == PState::kReading && !p->stop) ++stats_.revokes_waited;
  StopProducer(slot, *p, RecomputeAnyway(reason) ? reason : TransferResult::kAborted,
               ReadNotice::kRevoked);
  FinishIfComplete(slot);
}

void ReadLoadTable::OnReadDone(ReadId read, bool ok, Instant now) {
  (void)now;
  const uint32_t slot = read.index >> 8;
  const uint32_t index = read.index & 0xff;
  if (slot >= loads_.size() || !loads_[slot].used || loads_[slot].generation != read.generation ||
      index >= loads_[slot].producers.size() ||
      loads_[slot].producers[index].state != PState::kReading) {
    ++stats_.stale_read_done;
    return;
  }
  Load& load = loads_[slot];
  Producer& p = load.producers[index];
  KV_CHECK_GT(reads_in_flight_, 0u);
  --reads_in_flight_;
  ok ? ++stats_.reads_ok : ++stats_.reads_failed;
  actions_.push_back(SendNotice{p.peer, load.transfer, EndNotice(load, p, ok)});
  TransferResult result = ok ? TransferResult::kOk : TransferResult::kWriteFailed;
  if (p.stop) result = p.result;
  FinishProducer(slot, p, result);
  FinishIfComplete(slot);
}

void ReadLoadTable::ResendTo(PeerId peer, Instant now) {
  for (uint32_t slot = 0; slot < loads_.size(); ++slot) {
    Load& load = loads_[slot];
    if (!load.used) continue;
    for (Producer& p : load.producers) {
      if (p.peer == peer && p.state != PState::kFinished && !p.stop) Heartbeat(load, p, now);
    }
  }
}

void ReadLoadTable::PeerGone(PeerId peer, Instant now) {
  (void)now;
  for (uint32_t slot = 0; slot < loads_.size(); ++slot) {
    if (!loads_[slot].used) continue;
    Producer* p = FindProducer(loads_[slot], peer);
    if (p == nullptr || p->state == PState::kFinished) continue;
    ++stats_.producers_lost;
    StopProducer(slot, *p, TransferResult::kUnreachable, std::nullopt);
    FinishIfComplete(slot);
  }
}

void ReadLoadTable::OnTimer(Instant now) {
  while (auto top = timers_.Top()) {
    if (top->first > now) break;
    const uint32_t slot = top->second;
    timers_.Cancel(slot);
    Load& load = loads_[slot];
    KV_CHECK(load.used);
    if (now >= load.giveup) {
      for (Producer& p : load.producers) {
        if (p.state != PState::kAsking) continue;
        ++stats_.producers_given_up;
        StopProducer(slot, p, TransferResult::kUnreachable, ReadNotice::kRelease);
      }
      load.giveup = Instant::Never();
    }
    if (now >= load.next_heartbeat) {
      for (Producer& p : load.producers) {
        if (p.state != PState::kFinished && !p.stop) Heartbeat(load, p, now);
      }
      load.next_heartbeat = now + options_.heartbeat_interval;
    }
    FinishIfComplete(slot);
    if (loads_[slot].used) Arm(slot);
  }
}

std::optional<Instant> ReadLoadTable::NextDeadline() const {
  if (auto top = timers_.Top()) return top->first;
  return std::nullopt;
}

std::optional<ReadLoadAction> ReadLoadTable::PollAction() {
  if (actions_.empty()) return std::nullopt;
  ReadLoadAction a = std::move(actions_.front());
  actions_.pop_front();
  return a;
}

// ---------------------------------------------------------------------------
// The transitions.

// Ends producer `p` for a reason outside its read: with nothing in flight it
// finishes now (sending `notice`, if any, to P); a read in flight is let
// land first, and its notice then says why (EndNotice). The caller calls
// FinishIfComplete afterwards (never inside a loop over the producers).
void ReadLoadTable::StopProducer(uint32_t slot, Producer& p, TransferResult result,
                                 std::optional<ReadNotice> notice) {
  Load& load = loads_[slot];
  switch (p.state) {
    case PState::kFinished:
      return;
    case PState::kReading:
      if (!p.stop) {
        p.stop = true;
        p.result = result;
      }
      return;
    case PState::kAsking:
      if (notice) {
        if (*notice == ReadNotice::kRelease) ++stats_.releases_sent;
        actions_.push_back(SendNotice{p.peer, load.transfer, *notice});
      }
      FinishProducer(slot, p, result);
      return;
  }
}

void ReadLoadTable::FinishProducer(uint32_t slot, Producer& p, TransferResult result) {
  Load& load = loads_[slot];
  KV_CHECK(p.state != PState::kFinished);
  p.state = PState::kFinished;
  p.stop = false;
  p.result = result;
  p.outstanding.clear();
  if (result != TransferResult::kOk && !load.failed) {
    load.failed = true;
    load.first_error = result;
  }
}

// The one place a load ends: when every producer finished.
void ReadLoadTable::FinishIfComplete(uint32_t slot) {
  Load& load = loads_[slot];
  if (!load.used) return;
  for (const Producer& p : load.producers) {
    if (p.state != PState::kFinished) return;
  }
  if (load.released) {
    ++stats_.loads_released;
    actions_.push_back(LoadReleased{load.request, load.transfer});
  } else {
    // A producer that answered kReset or kMismatch cut the load short.
    const bool cut_short = load.cut_short || AnyProducerCutShort(load.producers);
    const bool ok = !load.failed && !cut_short;
    ok ? ++stats_.loads_ok : ++stats_.loads_failed;
    if (cut_short) ++stats_.loads_cut_short;
    actions_.push_back(LoadDone{load.request, load.transfer, ok, cut_short,
                                cut_short && !load.failed ? TransferResult::kAborted
                                                          : load.first_error});
  }
  timers_.Cancel(slot);
  by_transfer_.erase(load.transfer);
  by_request_.erase(load.request);
  const uint32_t generation = load.generation;
  load = Load{};
  load.generation = generation;
  load.next_free = free_loads_;
  free_loads_ = slot;
}

// ---------------------------------------------------------------------------
// Helpers.

void ReadLoadTable::Heartbeat(Load& load, Producer& p, Instant now) {
  const uint64_t seq = next_seq_++;
  p.outstanding.push_back(Sent{seq, now});
  if (p.outstanding.size() > options_.max_outstanding_heartbeats) p.outstanding.pop_front();
  ++stats_.heartbeats_sent;
  actions_.push_back(SendHeartbeat{p.peer, seq, load.transfer, load.prompt_hash});
}

void ReadLoadTable::Arm(uint32_t slot) {
  const Load& load = loads_[slot];
  timers_.Arm(slot, std::min(load.giveup, load.next_heartbeat));
}

ReadLoadTable::Producer* ReadLoadTable::FindProducer(Load& load, PeerId peer) {
  for (Producer& p : load.producers) {
    if (p.peer == peer) return &p;
  }
  return nullptr;
}

ReadId ReadLoadTable::ReadIdOf(uint32_t slot, uint32_t producer, uint32_t generation) const {
  KV_CHECK_LT(slot, 1u << 24);
  return ReadId{(slot << 8) | producer, generation};
}

ReadNotice ReadLoadTable::EndNotice(const Load& load, const Producer& p, bool read_ok) const {
  if (load.released || load.cut_short) return ReadNotice::kRelease;
  if (p.stop) return ReadNotice::kRevoked;
  return read_ok ? ReadNotice::kDone : ReadNotice::kFailed;
}

std::vector<LoadView> ReadLoadTable::Loads() const {
  std::vector<LoadView> out;
  for (const Load& l : loads_) {
    if (!l.used) continue;
    LoadView v;
    v.request = l.request;
    v.transfer = l.transfer;
    v.started = l.started;
    v.producers = static_cast<uint32_t>(l.producers.size());
    for (const Producer& p : l.producers) {
      if (p.state == PState::kFinished) continue;
      ++v.unanswered;
      v.waiting_on.push_back(p.peer);
    }
    v.blocks = static_cast<uint32_t>(l.dst.size());
    v.failed = l.failed;
    v.released = l.released;
    v.cut_short = l.cut_short;
    out.push_back(v);
  }
  return out;
}

void ReadLoadTable::CheckInvariants() const {
  size_t used = 0;
  uint32_t reading = 0;
  for (uint32_t slot = 0; slot < loads_.size(); ++slot) {
    const Load& l = loads_[slot];
    if (!l.used) continue;
    ++used;
    auto t = by_transfer_.find(l.transfer);
    auto r = by_request_.find(l.request);
    KV_CHECK(t != by_transfer_.end() && t->second == slot);
    KV_CHECK(r != by_request_.end() && r->second == slot);
    // A live load has something unfinished and a timer (heartbeats or
    // give-up): it can never wedge.
    KV_CHECK(timers_.IsArmed(slot));
    bool unfinished = false;
    for (const Producer& p : l.producers) {
      if (p.state == PState::kReading) ++reading;
      if (p.state != PState::kFinished) unfinished = true;
      if (p.stop) KV_CHECK(p.state == PState::kReading);
      KV_CHECK_LE(p.outstanding.size(), options_.max_outstanding_heartbeats);
    }
    KV_CHECK(unfinished);
    if (l.released) {
      for (const Producer& p : l.producers) KV_CHECK(p.state != PState::kAsking);
    }
  }
  KV_CHECK_EQ(used, by_transfer_.size());
  KV_CHECK_EQ(used, by_request_.size());
  KV_CHECK_EQ(reading, reads_in_flight_);
  timers_.CheckInvariants();
}

}  // namespace kvrelay
