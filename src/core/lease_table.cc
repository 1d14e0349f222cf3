#include "core/lease_table.h"

#include <algorithm>
#include <utility>

#include "base/check.h"

namespace kvrelay {

const char* LeaseStateName(LeaseState state) {
  switch (state) {
    case LeaseState::kWaiting: return "WAITING";
    case LeaseState::kLeased: return "LEASED";
    case LeaseState::kRevoking: return "REVOKING";
  }
  return "?";
}

LeaseTable::LeaseTable(const LeaseTableOptions& options) : options_(options) {
  KV_CHECK_GT(options_.initial_lease, Duration::Zero());
  KV_CHECK_GT(options_.extension, Duration::Zero());
  KV_CHECK_GT(options_.tombstone_ttl, Duration::Zero());
}

// ---------------------------------------------------------------------------
// Inputs from P's engine.

Status LeaseTable::Claim(TransferId transfer, uint32_t need, Instant now,
                         uint64_t prompt_hash, uint32_t consumer_engine) {
  KV_CHECK_GE(need, 1u);
  PruneTombstones(now);
  ++stats_.claims;
  if (auto it = index_.find(transfer); it != index_.end()) {
    const uint32_t s = it->second;
    Lease& lease = leases_[s];
    if (lease.claimed) {
      ++stats_.claims_rejected_duplicate;
      return AlreadyExistsError("transfer " + transfer.ToString() +
                                " is already claimed by a live request");
    }
    // Heartbeats got here first and left a placeholder: adopt it. A running
    // request never expires. Waiting heartbeats from another D engine than
    // the one named, or for another prompt, are refused now.
    lease.claimed = true;
    lease.need = need;
    lease.prompt_hash = prompt_hash;
    expiry_.Cancel(s);
    if (consumer_engine != kAnyConsumerEngine) lease.consumer = consumer_engine;
    std::vector<Waiter> keep;
    bool mismatch = false;
    for (const Waiter& w : lease.waiters) {
      if (PeerEngineOf(w.peer) != lease.consumer) {
        ++stats_.refused_wrong_engine;
        Answer(w.peer, w.seq, transfer, LeaseAnswer::kEnded, TransferResult::kRejected);
      } else {
        if (w.prompt_hash != 0 && prompt_hash != 0 && w.prompt_hash != prompt_hash) {
          ++stats_.prompt_mismatch;
          mismatch = true;
        }
        keep.push_back(w);
      }
    }
    lease.waiters = std::move(keep);
    if (mismatch) {
      // Another prompt's KV for this id's consumer: see Heartbeat.
      EndLease(s, TransferResult::kMismatch, now);
      return Status::Ok();
    }
    // With no waiter left the first engine to heartbeat binds it again.
    if (consumer_engine == kAnyConsumerEngine && lease.waiters.empty()) {
      lease.consumer = kAnyConsumerEngine;
    }
    return Status::Ok();
  }
  if (auto ended = tombstones_.find(transfer); ended != tombstones_.end()) {
    ++stats_.claims_after_end;
    return CancelledError("transfer " + transfer.ToString() + " already ended: " +
                          std::string(TransferResultName(ended->second)));
  }
  if (index_.size() >= options_.max_leases) {
    return ResourceExhaustedError("lease table full (max_leases=" +
                                  std::to_string(options_.max_leases) + ")");
  }
  const uint32_t s = NewLease(transfer, now);
  leases_[s].claimed = true;
  leases_[s].need = need;
  leases_[s].prompt_hash = prompt_hash;
  leases_[s].consumer = consumer_engine;
  return Status::Ok();
}

Status LeaseTable::Ready(TransferId transfer, std::vector<BlockId> blocks, Instant now,
                         uint64_t prompt_hash) {
  PruneTombstones(now);
  if (blocks.empty()) {
    return InvalidArgumentError("Ready with no blocks for transfer " + transfer.ToString());
  }
  auto it = index_.find(transfer);
  if (it == index_.end()) {
    ++stats_.readies_refused;
    if (auto ended = tombstones_.find(transfer); ended != tombstones_.end()) {
      return CancelledError("transfer " + transfer.ToString() + " already ended: " +
                            std::string(TransferResultName(ended->second)));
    }
    return FailedPreconditionError("Ready for unclaimed transfer " + transfer.ToString());
  }
  const uint32_t s = it->second;
  Lease& lease = leases_[s];
  if (!lease.claimed) {
    ++stats_.readies_refused;
    return FailedPreconditionError("Ready for unclaimed transfer " + transfer.ToString());
  }
  KV_CHECK(lease.state == LeaseState::kWaiting);  // REQUIRES: first Ready
  if (prompt_hash != 0 && lease.prompt_hash != 0 && prompt_hash != lease.prompt_hash) {
    // The KV was computed under other weights than claimed: no reader may
    // have it. Nobody was granted anything yet, so it ends now.
    ++stats_.readies_refused;
    Finish(s, TransferResult::kMismatch, now);
    return CancelledError("transfer " + transfer.ToString() +
                          ": KV fingerprint differs from the claim's");
  }
  if (prompt_hash != 0) lease.prompt_hash = prompt_hash;
  ++stats_.readies;
  lease.state = LeaseState::kLeased;
  lease.holds_blocks = true;
  lease.ready_at = now;
  lease.blocks = std::move(blocks);
  lease.until = now + options_.initial_lease;
  expiry_.Arm(s, lease.until);
  // A heartbeat that waited with another fingerprint ends the lease (see
  // Heartbeat); otherwise the waiting heartbeats are granted now.
  for (const Waiter& w : lease.waiters) {
    if (w.prompt_hash != 0 && lease.prompt_hash != 0 && w.prompt_hash != lease.prompt_hash) {
      ++stats_.prompt_mismatch;
      EndLease(s, TransferResult::kMismatch, now);
      return Status::Ok();
    }
  }
  std::vector<Waiter> waiters = std::move(lease.waiters);
  lease.waiters.clear();
  for (const Waiter& w : waiters) Grant(s, w.peer, w.seq, now);
  return Status::Ok();
}

void LeaseTable::Abort(TransferId transfer, Instant now) {
  PruneTombstones(now);
  if (auto it = index_.find(transfer); it != index_.end()) {
    EndLease(it->second, TransferResult::kAborted, now);
    return;
  }
  if (tombstones_.count(transfer) != 0) return;
  ++stats_.aborts_unknown;
  AddTombstone(transfer, TransferResult::kAborted, now);
}

void LeaseTable::ReleaseHeld(Instant now) {
  PruneTombstones(now);
  std::vector<uint32_t> held;
  held.reserve(index_.size());
  for (const auto& [t, s] : index_) {
    if (leases_[s].state == LeaseState::kLeased) held.push_back(s);
  }
  std::sort(held.begin(), held.end());  // slot order: deterministic actions
  for (uint32_t s : held) EndLease(s, TransferResult::kReset, now);
}

// ---------------------------------------------------------------------------
// Inputs from D ranks.

void LeaseTable::Heartbeat(PeerId peer, uint64_t seq, TransferId transfer,
                           uint64_t prompt_hash, Instant now) {
  PruneTombstones(now);
  ++stats_.heartbeats;
  auto it = index_.find(transfer);
  if (it == index_.end()) {
    if (auto ended = tombstones_.find(transfer); ended != tombstones_.end()) {
      ++stats_.ended_answers;
      Answer(peer, seq, transfer, LeaseAnswer::kEnded, ended->second);
      return;
    }
    if (index_.size() >= options_.max_leases) {
      // Full: nothing is created; D asks again at its next heartbeat.
      ++stats_.unknown_heartbeats;
      Answer(peer, seq, transfer, LeaseAnswer::kPending, TransferResult::kOk);
      return;
    }
    // D got here before P's scheduler claimed the request (both legs are
    // sent at once): a placeholder remembers the heartbeat so the grant
    // goes out the moment the prefill is done, not a heartbeat later. It
    // holds nothing and goes away after initial_lease if never claimed.
    ++stats_.placeholders;
    const uint32_t s = NewLease(transfer, now);
    leases_[s].until = now + options_.initial_lease;
    expiry_.Arm(s, leases_[s].until);
    it = index_.find(transfer);
  }
  const uint32_t s = it->second;
  Lease& lease = leases_[s];
  if (lease.consumer == kAnyConsumerEngine) lease.consumer = PeerEngineOf(peer);
  if (PeerEngineOf(peer) != lease.consumer) {
    ++stats_.refused_wrong_engine;
    Answer(peer, seq, transfer, LeaseAnswer::kEnded, TransferResult::kRejected);
    return;
  }
  if (prompt_hash != 0 && lease.prompt_hash != 0 && prompt_hash != lease.prompt_hash) {
    // The KV is not what its consumer expects (another prompt under this
    // id, or the other side's weights during an update): that D engine,
    // the only one bound to it, recomputes, so the lease ends now.
    ++stats_.prompt_mismatch;
    Answer(peer, seq, transfer, LeaseAnswer::kEnded, TransferResult::kMismatch);
    EndLease(s, TransferResult::kMismatch, now);
    return;
  }
  switch (lease.state) {
    case LeaseState::kWaiting:
      Wait(lease, peer, seq, prompt_hash);
      return;
    case LeaseState::kRevoking:
      // No new grant and no extension: the lease is ending. A granted
      // reader still reading answers the revoke it was sent.
      ++stats_.ended_answers;
      Answer(peer, seq, transfer, LeaseAnswer::kEnded, lease.end_reason);
      return;
    case LeaseState::kLeased:
      Grant(s, peer, seq, now);
      return;
  }
}

// WAITING: the heartbeat is answered when the lease starts (Ready) or ends.
// One waiting heartbeat per peer — a newer one replaces it (D pairs the
// answer with the newer send time, which is the conservative choice).
void LeaseTable::Wait(Lease& lease, PeerId peer, uint64_t seq, uint64_t prompt_hash) {
  for (Waiter& w : lease.waiters) {
    if (w.peer == peer) {
      w.seq = seq;
      w.prompt_hash = prompt_hash;
      return;
    }
  }
  if (lease.waiters.size() >= kMaxWaiters) {
    ++stats_.pending_answers;
    Answer(peer, seq, lease.transfer, LeaseAnswer::kPending, TransferResult::kOk);
    return;
  }
  ++stats_.waiting_heartbeats;
  lease.waiters.push_back(Waiter{peer, seq, prompt_hash});
}

// LEASED: heartbeat `seq` of `peer` extends the lease and is granted.
void LeaseTable::Grant(uint32_t s, PeerId peer, uint64_t seq, Instant now) {
  Lease& lease = leases_[s];
  Reader* reader = FindReader(lease, peer);
  if (reader != nullptr && reader->finished) {
    // This rank said it is done: nothing more to read.
    ++stats_.ended_answers;
    Answer(peer, seq, lease.transfer, LeaseAnswer::kEnded, TransferResult::kAlreadyPulled);
    return;
  }
  if (reader == nullptr) {
    if (lease.readers.size() >= lease.need) {
      ++stats_.surplus_readers;
      Answer(peer, seq, lease.transfer, LeaseAnswer::kEnded, TransferResult::kRejected);
      return;
    }
    lease.readers.push_back(Reader{peer, false, false});
  }
  const Instant extended = now + options_.extension;
  if (extended > lease.until) {
    lease.until = extended;
    expiry_.Arm(s, lease.until);
    ++stats_.extensions;
  }
  ++stats_.grants;
  GrantLease grant;
  grant.peer = peer;
  grant.seq = seq;
  grant.transfer = lease.transfer;
  grant.answer = LeaseAnswer::kGranted;
  grant.remaining_ns = (lease.until - now).ns();
  grant.src = lease.blocks;
  actions_.push_back(std::move(grant));
}

void LeaseTable::Notice(PeerId peer, TransferId transfer, ReadNotice notice, Instant now) {
  PruneTombstones(now);
  ++stats_.notices[static_cast<uint8_t>(notice)];
  auto it = index_.find(transfer);
  if (it == index_.end()) {
    ++stats_.notices_after_end;
    // A release for a transfer P never saw: remember it, so the claim that
    // may still come fails fast instead of holding KV nobody will read.
    if (notice == ReadNotice::kRelease && tombstones_.count(transfer) == 0) {
      AddTombstone(transfer, TransferResult::kReleased, now);
    }
    return;
  }
  const uint32_t s = it->second;
  Lease& lease = leases_[s];
  if (lease.consumer != kAnyConsumerEngine && PeerEngineOf(peer) != lease.consumer) {
    ++stats_.refused_wrong_engine;
    return;
  }
  Reader* reader = FindReader(lease, peer);
  if (reader == nullptr) {
    // Never granted, so never reading. Only a release means anything: the
    // request went away on D before it read.
    if (notice == ReadNotice::kRelease) {
      EndLease(s, TransferResult::kReleased, now);
    } else {
      ++stats_.notices_stale;
    }
    return;
  }
  if (reader->finished) {
    ++stats_.notices_stale;
    return;
  }
  reader->finished = true;
  reader->ok = notice == ReadNotice::kDone;
  switch (notice) {
    case ReadNotice::kDone:
      ++lease.done_ok;
      if (lease.state == LeaseState::kLeased && lease.done_ok == lease.need) {
        Finish(s, TransferResult::kOk, now);
        return;
      }
      break;
    case ReadNotice::kFailed:
      EndLease(s, TransferResult::kWriteFailed, now);
      break;
    case ReadNotice::kRelease:
      EndLease(s, TransferResult::kReleased, now);
      break;
    case ReadNotice::kRevoked:
      break;
  }
  // Revoking (now or since before): the last reader to finish, however it
  // finished, ends it.
  if (lease.used && lease.state == LeaseState::kRevoking && Unfinished(lease) == 0) {
    Finish(s, lease.end_reason, now);
  }
}

// ---------------------------------------------------------------------------
// Timers.

void LeaseTable::OnTimer(Instant now) {
  PruneTombstones(now);
  // Every lease whose expiry has passed, in expiry order — the heap is
  // keyed by the current `until`, so an extended lease is never reaped
  // early and an expired one is never skipped behind it.
  while (auto s = expiry_.PopExpired(now)) {
    Lease& lease = leases_[*s];
    KV_CHECK(lease.used);
    if (lease.state == LeaseState::kWaiting) {
      // A placeholder P never claimed: dropped without a tombstone (the
      // claim may still come); its waiters ask again at their next beat.
      KV_CHECK(!lease.claimed);
      ++stats_.placeholders_expired;
      for (const Waiter& w : lease.waiters) {
        Answer(w.peer, w.seq, lease.transfer, LeaseAnswer::kPending, TransferResult::kOk);
      }
      index_.erase(lease.transfer);
      const uint32_t slot = *s;
      lease = Lease{};
      lease.next_free = free_leases_;
      free_leases_ = slot;
      continue;
    }
    ++stats_.expired;
    if (lease.state == LeaseState::kRevoking) ++stats_.expired_revoking;
    Finish(*s, TransferResult::kExpired, now);
  }
}

std::optional<Instant> LeaseTable::NextDeadline() const {
  std::optional<Instant> next;
  if (auto top = expiry_.Top()) next = top->first;
  if (!tombstone_fifo_.empty()) {
    const Instant t = tombstone_fifo_.front().created + options_.tombstone_ttl;
    if (!next || t < *next) next = t;
  }
  return next;
}

std::optional<LeaseAction> LeaseTable::PollAction() {
  if (actions_.empty()) return std::nullopt;
  LeaseAction a = std::move(actions_.front());
  actions_.pop_front();
  return a;
}

// ---------------------------------------------------------------------------
// The transitions.

// Starts the end of lease `s`. Ends it now if no granted reader can be
// reading; otherwise asks those readers to stop (REVOKING) and ends when
// the last one answers, or when the lease runs out. The first reason wins.
void LeaseTable::EndLease(uint32_t s, TransferResult reason, Instant now) {
  Lease& lease = leases_[s];
  KV_CHECK(lease.used);
  if (lease.state == LeaseState::kRevoking) return;
  if (lease.state == LeaseState::kWaiting || Unfinished(lease) == 0) {
    Finish(s, reason, now);
    return;
  }
  lease.state = LeaseState::kRevoking;
  lease.end_reason = reason;
  for (const Reader& r : lease.readers) {
    if (r.finished) continue;
    ++stats_.revokes_sent;
    actions_.push_back(RevokeLease{r.peer, lease.transfer, reason});
  }
}

// Ends lease `s`: blocks handed back (once), tombstone, record freed.
void LeaseTable::Finish(uint32_t s, TransferResult reason, Instant now) {
  Lease& lease = leases_[s];
  KV_CHECK(lease.used);
  ++stats_.ends[static_cast<uint8_t>(reason)];
  if (lease.holds_blocks) {
    actions_.push_back(SendFinished{lease.transfer, reason});
    stats_.max_hold_ns = std::max(stats_.max_hold_ns, (now - lease.ready_at).ns());
  }
  for (const Waiter& w : lease.waiters) {
    ++stats_.ended_answers;
    Answer(w.peer, w.seq, lease.transfer, LeaseAnswer::kEnded, reason);
  }
  expiry_.Cancel(s);
  const TransferId transfer = lease.transfer;
  index_.erase(transfer);
  lease = Lease{};
  lease.next_free = free_leases_;
  free_leases_ = s;
  AddTombstone(transfer, reason, now);
}

// ---------------------------------------------------------------------------
// Helpers.

uint32_t LeaseTable::NewLease(TransferId transfer, Instant now) {
  uint32_t s;
  if (free_leases_ != kNil) {
    s = free_leases_;
    free_leases_ = leases_[s].next_free;
  } else {
    s = static_cast<uint32_t>(leases_.size());
    leases_.emplace_back();
  }
  Lease& lease = leases_[s];
  lease = Lease{};
  lease.used = true;
  lease.transfer = transfer;
  lease.created = now;
  index_.emplace(transfer, s);
  return s;
}

LeaseTable::Reader* LeaseTable::FindReader(Lease& lease, PeerId peer) {
  for (Reader& r : lease.readers) {
    if (r.peer == peer) return &r;
  }
  return nullptr;
}

uint32_t LeaseTable::Unfinished(const Lease& lease) const {
  uint32_t n = 0;
  for (const Reader& r : lease.readers) n += r.finished ? 0 : 1;
  return n;
}

void LeaseTable::Answer(PeerId peer, uint64_t seq, TransferId transfer, LeaseAnswer answer,
                        TransferResult result) {
  GrantLease a;
  a.peer = peer;
  a.seq = seq;
  a.transfer = transfer;
  a.answer = answer;
  a.result = result;
  actions_.push_back(std::move(a));
}

void LeaseTable::AddTombstone(TransferId transfer, TransferResult reason, Instant now) {
  if (auto it = tombstones_.find(transfer); it != tombstones_.end()) {
    it->second = reason;
    return;
  }
  if (tombstones_.size() >= options_.max_tombstones && !tombstone_fifo_.empty()) {
    tombstones_.erase(tombstone_fifo_.front().transfer);
    tombstone_fifo_.pop_front();
    ++stats_.tombstones_evicted;
  }
  tombstones_.emplace(transfer, reason);
  tombstone_fifo_.push_back(Tombstone{transfer, now});
}

void LeaseTable::PruneTombstones(Instant now) {
  // One FIFO entry per tombstone (AddTombstone never adds a second), so
  // creation order is expiry order.
  while (!tombstone_fifo_.empty() &&
         tombstone_fifo_.front().created + options_.tombstone_ttl <= now) {
    tombstones_.erase(tombstone_fifo_.front().transfer);
    tombstone_fifo_.pop_front();
  }
}

std::optional<LeaseState> LeaseTable::StateOf(TransferId transfer) const {
  auto it = index_.find(transfer);
  if (it == index_.end()) return std::nullopt;
  return leases_[it->second].state;
}

std::vector<LeaseView> LeaseTable::Leases() const {
  std::vector<LeaseView> out;
  out.reserve(index_.size());
  for (const Lease& l : leases_) {
    if (!l.used) continue;
    LeaseView v;
    v.transfer = l.transfer;
    v.state = l.state;
    v.created = l.created;
    v.until = l.until;
    v.need = l.need;
    v.readers = static_cast<uint32_t>(l.readers.size());
    v.done = l.done_ok;
    v.unfinished = Unfinished(l);
    v.blocks = static_cast<uint32_t>(l.blocks.size());
    out.push_back(v);
  }
  return out;
}

void LeaseTable::CheckInvariants() const {
  size_t used = 0;
  for (uint32_t s = 0; s < leases_.size(); ++s) {
    const Lease& l = leases_[s];
    if (!l.used) continue;
    ++used;
    auto it = index_.find(l.transfer);
    KV_CHECK(it != index_.end() && it->second == s);
    KV_CHECK(tombstones_.count(l.transfer) == 0);
    KV_CHECK(l.readers.size() <= l.need);
    KV_CHECK_LE(l.done_ok, l.need);
    KV_CHECK_LE(l.waiters.size(), kMaxWaiters);
    if (l.state == LeaseState::kWaiting) {
      // A claimed request never expires while it runs; a placeholder does.
      KV_CHECK(!l.holds_blocks && l.readers.empty() && expiry_.IsArmed(s) == !l.claimed);
    } else {
      KV_CHECK(l.claimed && l.waiters.empty());
      // Every lease holding blocks has its expiry armed: nothing is held
      // past `until` (a hang becomes an expiry, never a wedge).
      KV_CHECK(l.holds_blocks && !l.blocks.empty() && expiry_.IsArmed(s));
    }
    if (l.state == LeaseState::kLeased) KV_CHECK_LT(l.done_ok, l.need);
    if (l.state == LeaseState::kRevoking) KV_CHECK_GT(Unfinished(l), 0u);
  }
  KV_CHECK_EQ(used, index_.size());
  KV_CHECK_EQ(expiry_.size(), static_cast<size_t>(std::count_if(
      leases_.begin(), leases_.end(), [](const Lease& l) {
        return l.used && (l.state != LeaseState::kWaiting || !l.claimed);
      })));
  expiry_.CheckInvariants();
  KV_CHECK_EQ(tombstones_.size(), tombstone_fifo_.size());
}

}  // namespace kvrelay
