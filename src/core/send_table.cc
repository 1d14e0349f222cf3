#include "core/send_table.h"

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "base/prng.h"

namespace kvrelay {

SendTable::SendTable(const SendTableOptions& options) : options_(options) {
  KV_CHECK_GT(options_.num_workers, 0u);
  KV_CHECK_GT(options_.abort_timeout, Duration::Zero());
  KV_CHECK_GE(options_.giveup_grace, Duration::Zero());
}

// ---------------------------------------------------------------------------
// Inputs from P's engine.

Status SendTable::Claim(TransferId transfer, uint32_t need, Instant now,
                        uint64_t prompt_hash, uint32_t consumer_engine) {
  KV_CHECK_GE(need, 1u);
  // With many sends in flight the index lookup below is a cache miss:
  // start it now so it overlaps the tombstone pruning.
  index_.Prefetch(transfer);
  PruneTombstones(now);
  ++stats_.claims;
  const uint32_t found = FindSend(transfer);
  if (found != kNil) {
    Send& send = sends_[found];
    if (send.state == SendState::kDone) {
      ++stats_.claims_after_end;
      return CancelledError("transfer " + transfer.ToString() +
                            " already ended: " +
                            std::string(TransferResultName(send.end_reason)));
    }
    if (send.claimed) {
      ++stats_.claims_rejected_duplicate;
      return AlreadyExistsError("transfer " + transfer.ToString() +
                                " is already claimed by a live request");
    }
    // A pull got here first and left a placeholder: adopt it. A running
    // request never expires, so the placeholder's expiry is disarmed; the
    // waiting pulls keep their own deadlines.
    send.claimed = true;
    send.need = need;
    send.prompt_hash = prompt_hash;
    if (consumer_engine != kAnyConsumerEngine) send.consumer = consumer_engine;
    expiry_.Cancel(found);
    // Pulls from another D engine than the one it is handed to are refused.
    // A pull that arrived first for another prompt under this id ends the
    // send (kMismatch; see Pull).
    bool mismatch = false;
    uint32_t i = send.items.head;
    while (i != kNil) {
      const uint32_t next = items_[i].in_send.next;
      if (send.consumer != kAnyConsumerEngine &&
          PeerEngineOf(items_[i].peer) != send.consumer) {
        ++stats_.refused_wrong_engine;
        AnswerItem(i, TransferResult::kRejected);
      } else if (!PromptMatches(prompt_hash, items_[i].prompt_hash)) {
        ++stats_.prompt_mismatch;
        mismatch = true;
      }
      i = next;
    }
    if (mismatch) EndSend(found, TransferResult::kMismatch, now);
    return Status::Ok();
  }
  if (auto ended = tombstones_.find(transfer); ended != tombstones_.end()) {
    ++stats_.claims_after_end;
    return CancelledError("transfer " + transfer.ToString() +
                          " already ended: " +
                          std::string(TransferResultName(ended->second)));
  }
  if (index_.size() >= options_.max_sends) {
    return ResourceExhaustedError("send table full (max_sends=" +
                                  std::to_string(options_.max_sends) + ")");
  }
  uint32_t s = NewSend(transfer, now);
  sends_[s].claimed = true;
  sends_[s].need = need;
  sends_[s].prompt_hash = prompt_hash;
  sends_[s].consumer = consumer_engine;
  return Status::Ok();
}

Status SendTable::Ready(TransferId transfer, std::vector<BlockId> blocks,
                        Instant now, uint64_t prompt_hash, uint32_t first_token) {
  PruneTombstones(now);
  if (blocks.empty()) {
    return InvalidArgumentError("Ready with no blocks for transfer " +
                                transfer.ToString());
  }
  Result<uint32_t> target = HandOverTarget(transfer, "Ready", stats_.readies_refused);
  if (!target.ok()) return target.status();
  const uint32_t s = *target;
  Send& send = sends_[s];
  // Ready twice is a bug; after Progress, the same blocks, all of them.
  KV_CHECK(send.state == SendState::kWaiting || send.state == SendState::kStreaming);
  if (send.state == SendState::kStreaming) {
    KV_CHECK_EQ(blocks.size(), send.total_blocks);
    KV_CHECK(std::equal(send.blocks.begin(), send.blocks.end(), blocks.begin()));
  }
  if (prompt_hash != 0 && send.prompt_hash != 0 && prompt_hash != send.prompt_hash) {
    // The KV was computed under other weights than the claim promised (an
    // update landed between admission and prefill): no D that admitted this
    // prompt with the claim's fingerprint can use it, and its pulls would
    // be refused while the blocks sat here until expiry. End the send now:
    // waiting pulls are answered, later ones meet the tombstone, D
    // recomputes, and P's engine frees the blocks at once (after the
    // SendFinished a streamed send owes).
    ++stats_.readies_refused;
    ++stats_.prompt_mismatch;
    EndSend(s, TransferResult::kMismatch, now);
    return CancelledError("transfer " + transfer.ToString() +
                          ": its KV was computed under other weights than claimed");
  }
  ++stats_.readies;
  const bool streamed = send.state == SendState::kStreaming;
  send.state = SendState::kReady;
  send.holds_blocks = true;
  send.readied = true;
  send.total_blocks = static_cast<uint32_t>(blocks.size());
  send.blocks = std::move(blocks);
  if (prompt_hash != 0) send.prompt_hash = prompt_hash;
  send.first_token = first_token;
  // Expiry counts from when P is done, not from the claim.
  expiry_.Arm(s, now + options_.abort_timeout);
  // A pull that waited for the prefill with another fingerprint ends the
  // send (kMismatch; see Pull). (A streamed send checked them at Progress.)
  if (!streamed && EndedOnMismatchedPull(s, now)) return Status::Ok();
  // The others now wait for a sender, in arrival order; one that asks for
  // more blocks than the prompt has is refused; one whose every block was
  // streamed already is answered.
  uint32_t i = send.items.head;
  while (i != kNil) {
    const uint32_t next = items_[i].in_send.next;
    Item& item = items_[i];
    if (item.state == ItemState::kWaiting) {
      if (item.want > send.blocks.size()) {
        ++stats_.items_rejected;
        AnswerItem(i, TransferResult::kRejected);
      } else if (item.sent == item.want) {
        AnswerItem(i, TransferResult::kOk);
        if (++send.pulled >= send.need) {
          EndSend(s, TransferResult::kOk, now);
          return Status::Ok();
        }
      } else {
        QueueIfAvailable(i);
      }
    }
    i = next;
  }
  AdmitWrites(now);
  return Status::Ok();
}

Status SendTable::Progress(TransferId transfer, std::span<const BlockId> prefix,
                           uint32_t total_blocks, Instant now, uint64_t prompt_hash) {
  PruneTombstones(now);
  if (prefix.empty() || prefix.size() > total_blocks) {
    return InvalidArgumentError("Progress for transfer " + transfer.ToString() + " with " +
                                std::to_string(prefix.size()) + " of " +
                                std::to_string(total_blocks) + " blocks");
  }
  Result<uint32_t> target = HandOverTarget(transfer, "Progress", stats_.progresses_refused);
  if (!target.ok()) return target.status();
  const uint32_t s = *target;
  Send& send = sends_[s];
  KV_CHECK(send.state == SendState::kWaiting || send.state == SendState::kStreaming);
  const bool first = send.state == SendState::kWaiting;
  if (!first) {
    KV_CHECK_EQ(total_blocks, send.total_blocks);
    KV_CHECK(std::equal(send.blocks.begin(), send.blocks.end(), prefix.begin(),
                        prefix.begin() + static_cast<std::ptrdiff_t>(
                                             std::min(prefix.size(), send.blocks.size()))));
  }
  if (prompt_hash != 0 && send.prompt_hash != 0 && prompt_hash != send.prompt_hash) {
    // This chunk was computed under other weights than the chunks before
    // it (or than the claim promised): the two must never meet in one D
    // load. The send ends; D recomputes.
    ++stats_.progresses_refused;
    ++stats_.prompt_mismatch;
    EndSend(s, TransferResult::kMismatch, now);
    return CancelledError("transfer " + transfer.ToString() +
                          ": a chunk's KV was computed under other weights than claimed");
  }
  if (prefix.size() <= send.blocks.size()) return Status::Ok();
  ++stats_.progresses;
  if (prompt_hash != 0) send.prompt_hash = prompt_hash;
  send.blocks.assign(prefix.begin(), prefix.end());
  if (first) {
    ++stats_.streams;
    send.state = SendState::kStreaming;
    send.holds_blocks = true;
    send.total_blocks = total_blocks;
    // As at Ready: a pull for another fingerprint ends the send, one for
    // more blocks than the prompt has is refused.
    if (EndedOnMismatchedPull(s, now)) return Status::Ok();
  }
  uint32_t i = send.items.head;
  while (i != kNil) {
    const uint32_t next = items_[i].in_send.next;
    if (items_[i].state == ItemState::kWaiting && items_[i].want > total_blocks) {
      ++stats_.items_rejected;
      AnswerItem(i, TransferResult::kRejected);
    } else {
      QueueIfAvailable(i);
    }
    i = next;
  }
  AdmitWrites(now);
  return Status::Ok();
}

void SendTable::Abort(TransferId transfer, Instant now, TransferResult reason) {
  PruneTombstones(now);
  KV_CHECK(reason == TransferResult::kAborted || reason == TransferResult::kReset);
  const uint32_t found = FindSend(transfer);
  if (found != kNil) {
    if (sends_[found].state != SendState::kDone) EndSend(found, reason, now);
    return;
  }
  if (tombstones_.count(transfer) != 0) return;
  // Aborted before P ever claimed it: remember, so D's pull fails fast.
  ++stats_.aborts_unknown;
  AddTombstone(transfer, reason, now);
}

void SendTable::ReleaseHeld(Instant now) {
  PruneTombstones(now);
  std::vector<uint32_t> held;
  held.reserve(index_.size());
  index_.ForEach([&](uint32_t s) {
    if (sends_[s].state == SendState::kReady || sends_[s].state == SendState::kStreaming) {
      held.push_back(s);
    }
  });
  // Slot order, not hash order: the same inputs give the same actions.
  std::sort(held.begin(), held.end());
  for (uint32_t s : held) EndSend(s, TransferResult::kReset, now);
}

// ---------------------------------------------------------------------------
// Inputs from D ranks.

void SendTable::Pull(PeerId peer, uint64_t pull_seq,
                     std::span<const PullItem> items, Instant now) {
  PruneTombstones(now);
  if (items.size() > options_.max_items_per_pull) {
    for (const PullItem& item : items) {
      ++stats_.items_rejected;
      Answer(peer, pull_seq, item.transfer, TransferResult::kRejected);
    }
    return;
  }
  // Pass 1: everything that can be answered now is answered now, before any
  // write of this batch is admitted — releases, ended transfers, bad items.
  std::vector<const PullItem*>& rest = pull_rest_;  // reused: no allocation per pull
  rest.clear();
  for (const PullItem& item : items) {
    ++stats_.pull_items;
    // The remembered-answers lookup below and the index lookups that
    // follow use unrelated keys; start the index's cache miss now so the
    // two overlap.
    index_.Prefetch(item.transfer);
    const uint64_t key = ItemKey(peer, pull_seq, item.transfer);
    if (live_keys_.count(key) != 0) {
      ++stats_.duplicate_items;  // resent while live: its answer will come
      continue;
    }
    if (auto a = answered_.find(key); a != answered_.end()) {
      ++stats_.reanswered;       // resent after the answer was lost
      actions_.push_back(AnswerPull{peer, pull_seq, item.transfer, a->second});
      continue;
    }
    if (item.dst.empty()) {
      HandleRelease(item, peer, pull_seq, now);
      continue;
    }
    if (item.dst.size() > options_.max_blocks_per_item) {
      ++stats_.items_rejected;
      Answer(peer, pull_seq, item.transfer, TransferResult::kRejected);
      continue;
    }
    if (auto ended = EndedAs(item.transfer)) {
      ++stats_.answered_from_tombstone;
      Answer(peer, pull_seq, item.transfer, *ended);
      continue;
    }
    rest.push_back(&item);
  }
  // Pass 2: attach the rest to their sends (creating placeholders).
  for (const PullItem* item : rest) {
    // A release or deadline earlier in this batch may have ended it.
    if (auto ended = EndedAs(item->transfer)) {
      ++stats_.answered_from_tombstone;
      Answer(peer, pull_seq, item->transfer, *ended);
      continue;
    }
    const uint32_t found = FindSend(item->transfer);
    if (live_items_ >= options_.max_pull_items ||
        (found == kNil && index_.size() >= options_.max_sends)) {
      ++stats_.items_rejected;
      Answer(peer, pull_seq, item->transfer, TransferResult::kRejected);
      continue;
    }
    uint32_t s;
    if (found != kNil) {
      s = found;
    } else {
      // P has never heard of it: a placeholder that expires one timeout
      // after this pull unless P claims it.
      s = NewSend(item->transfer, now);
      ++stats_.placeholders;
      expiry_.Arm(s, now + options_.abort_timeout);
    }
    if (!BindConsumer(s, peer)) {
      Answer(peer, pull_seq, item->transfer, TransferResult::kRejected);
      continue;
    }
    if (sends_[s].claimed &&
        !PromptMatches(sends_[s].prompt_hash, item->prompt_hash)) {
      // The KV is not what its consumer expects (another prompt under this
      // id, or computed under the other side's weights while an update
      // reached one side first). That D engine is the only one bound to the
      // transfer and recomputes on this answer, so nobody will pull it: the
      // send ends now, not at expiry.
      ++stats_.prompt_mismatch;
      Answer(peer, pull_seq, item->transfer, TransferResult::kMismatch);
      EndSend(s, TransferResult::kMismatch, now);
      continue;
    }
    if (sends_[s].holds_blocks && item->dst.size() > sends_[s].total_blocks) {
      ++stats_.items_rejected;
      Answer(peer, pull_seq, item->transfer, TransferResult::kRejected);
      continue;
    }
    QueueIfAvailable(NewItem(s, peer, pull_seq, *item, now));
  }
  AdmitWrites(now);
}

void SendTable::HandleRelease(const PullItem& item, PeerId peer, uint64_t seq,
                              Instant now) {
  ++stats_.releases;
  const TransferId t = item.transfer;
  const uint32_t found = FindSend(t);
  if (found != kNil && sends_[found].state != SendState::kDone &&
      !BindConsumer(found, peer)) {
    // Another D engine's release must not end this send.
    Answer(peer, seq, t, TransferResult::kRejected);
    return;
  }
  if (found != kNil) {
    if (sends_[found].state != SendState::kDone) {
      EndSend(found, TransferResult::kReleased, now);
    }
  } else if (tombstones_.count(t) == 0) {
    // Released before P saw the request: a later claim is refused, so P
    // frees at once instead of holding the KV until expiry.
    AddTombstone(t, TransferResult::kReleased, now);
  }
  // The release itself is answered (it is a pull like any other); D drops
  // the answer without reporting a completion.
  Answer(peer, seq, t, TransferResult::kOk);
}

// ---------------------------------------------------------------------------
// Inputs from writers and timers.

void SendTable::WriteDone(WriteId write, bool ok, Instant now) {
  PruneTombstones(now);
  const uint32_t i = write.index;
  if (i >= items_.size() || items_[i].generation != write.generation ||
      items_[i].state != ItemState::kWriting) {
    ++stats_.stale_write_done;
    return;
  }
  const uint32_t s = items_[i].send;
  Send& send = sends_[s];
  KV_CHECK_GT(send.writes_in_flight, 0u);
  KV_CHECK_GT(writes_in_flight_, 0u);
  --send.writes_in_flight;
  --writes_in_flight_;
  ++(ok ? stats_.writes_ok : stats_.writes_failed);
  Item& item = items_[i];
  if (ok && (item.writing_to < item.want || !send.readied)) {
    // A chunk of a streamed transfer landed; the item is not done.
    item.sent = item.writing_to;
    if (send.state == SendState::kDone) {
      ++stats_.writes_done_after_end;
      AnswerItem(i, EndAnswer(send));
      MaybeRelease(s);
    } else {
      item.state = ItemState::kWaiting;
      deadlines_.Arm(i, item.deadline);
      if (now >= item.deadline) {
        OnItemDeadline(i, now);
      } else {
        QueueIfAvailable(i);
      }
    }
    AdmitWrites(now);
    return;
  }
  // The write's own result is the truth about the bytes it moved, whatever
  // happened to the transfer meanwhile.
  AnswerItem(i, ok ? TransferResult::kOk : TransferResult::kWriteFailed);
  if (send.state == SendState::kDone) {
    // Ended (abort, release, expiry) while this write read the blocks:
    // they are released now if it was the last write.
    ++stats_.writes_done_after_end;
    MaybeRelease(s);
  } else if (!ok) {
    // D fails the load anyway: end now rather than hold until expiry.
    EndSend(s, TransferResult::kWriteFailed, now);
  } else if (++send.pulled >= send.need) {
    EndSend(s, TransferResult::kOk, now);
  }
  AdmitWrites(now);
}

void SendTable::OnTimer(Instant now) {
  PruneTombstones(now);
  while (auto s = expiry_.PopExpired(now)) {
    KV_CHECK(sends_[*s].used);
    KV_CHECK(sends_[*s].state != SendState::kDone);
    if (!sends_[*s].claimed) ++stats_.unknown_transfer_expired;
    EndSend(*s, TransferResult::kExpired, now);
  }
  while (auto i = deadlines_.PopExpired(now)) {
    ++stats_.deadline_timer;
    OnItemDeadline(*i, now);
  }
  AdmitWrites(now);
}

std::optional<Instant> SendTable::NextDeadline() const {
  std::optional<Instant> next;
  auto consider = [&next](Instant t) {
    if (!next || t < *next) next = t;
  };
  if (auto top = expiry_.Top()) consider(top->first);
  if (auto top = deadlines_.Top()) consider(top->first);
  if (!tombstone_fifo_.empty()) {
    consider(tombstone_fifo_.front().created + TombstoneTtl());
  }
  return next;
}

std::optional<SendAction> SendTable::PollAction() {
  if (actions_.empty()) return std::nullopt;
  SendAction a = std::move(actions_.front());
  actions_.pop_front();
  return a;
}

std::optional<SendState> SendTable::StateOf(TransferId transfer) const {
  const uint32_t found = FindSend(transfer);
  if (found == kNil) return std::nullopt;
  return sends_[found].state;
}

// ---------------------------------------------------------------------------
// The transitions.

// The only place a send becomes DONE.
void SendTable::EndSend(uint32_t s, TransferResult reason, Instant now) {
  Send& send = sends_[s];
  KV_CHECK(send.used);
  KV_CHECK(send.state != SendState::kDone);
  if (send.state == SendState::kStreaming) ++stats_.ended_streaming;
  send.state = SendState::kDone;
  send.end_reason = reason;
  ++stats_.ends[static_cast<int>(reason)];
  expiry_.Cancel(s);
  // Answer every item that is still waiting (for the prefill or a sender).
  // Items being written keep their place: their write's completion answers.
  const TransferResult answer = EndAnswer(send);
  uint32_t i = send.items.head;
  while (i != kNil) {
    uint32_t next = items_[i].in_send.next;
    if (items_[i].state != ItemState::kWriting) AnswerItem(i, answer);
    i = next;
  }
  if (reason != TransferResult::kOk) AddTombstone(send.transfer, reason, now);
  MaybeRelease(s);
}

// Frees a DONE send's record once no write reads its blocks, releasing the
// blocks to P's engine if Ready() handed them over.
void SendTable::MaybeRelease(uint32_t s) {
  Send& send = sends_[s];
  KV_CHECK(send.used);
  if (send.state != SendState::kDone || send.writes_in_flight > 0) return;
  KV_CHECK_EQ(send.items.size, 0u);
  if (send.holds_blocks) {
    actions_.push_back(SendFinished{send.transfer, send.end_reason});
  }
  KV_CHECK(index_.Erase(send.transfer, SendKeyOf{&sends_}));
  FreeSend(s);
}

// Hands free senders to queued items, oldest first. The deadline is checked
// again here, after a sender is taken: no write starts after D gave up.
void SendTable::AdmitWrites(Instant now) {
  while (writes_in_flight_ < options_.num_workers && admission_.size > 0) {
    const uint32_t i = admission_.head;
    Item& item = items_[i];
    KV_CHECK(item.state == ItemState::kQueued);
    const uint32_t s = item.send;
    KV_CHECK(sends_[s].state == SendState::kReady ||
             sends_[s].state == SendState::kStreaming);
    if (now >= item.deadline) {
      ++stats_.deadline_at_admission;
      OnItemDeadline(i, now);
      continue;
    }
    ListRemove<&Item::in_queue>(admission_, i);
    deadlines_.Cancel(i);
    item.state = ItemState::kWriting;
    Send& send = sends_[s];
    ++send.writes_in_flight;
    ++writes_in_flight_;
    ++stats_.writes_started;
    // D may hold a prefix of the prompt already: it asks for the tail,
    // dst[k] is the prompt's block offset + k. This write covers the dst
    // blocks not written yet whose KV P has now: all of them once READY.
    const uint32_t offset = send.total_blocks - item.want;
    const uint32_t upto = Available(i);
    KV_CHECK_GT(upto, item.sent);
    const auto first = send.blocks.begin() + static_cast<std::ptrdiff_t>(offset + item.sent);
    std::vector<BlockId> src(first, first + static_cast<std::ptrdiff_t>(upto - item.sent));
    std::vector<BlockId> dst;
    if (item.sent == 0 && upto == item.want) {
      // The item's one write takes its dst: it never reads it again.
      dst = std::move(item.dst);
    } else {
      ++stats_.chunk_writes;
      dst.assign(item.dst.begin() + item.sent, item.dst.begin() + upto);
    }
    item.writing_to = upto;
    actions_.push_back(StartWrite{WriteId{i, item.generation}, item.peer,
                                  item.pull_seq, send.transfer, std::move(src),
                                  std::move(dst), item.deadline});
  }
}

void SendTable::QueueIfAvailable(uint32_t i) {
  Item& item = items_[i];
  const SendState state = sends_[item.send].state;
  if (item.state != ItemState::kWaiting ||
      (state != SendState::kReady && state != SendState::kStreaming) ||
      Available(i) <= item.sent) {
    return;
  }
  item.state = ItemState::kQueued;
  ListPush<&Item::in_queue>(admission_, i);
}

// A pull waited too long for its prefill or a sender. D fails the load on
// this answer, so the transfer ends with it.
void SendTable::OnItemDeadline(uint32_t i, Instant now) {
  Item& item = items_[i];
  KV_CHECK(item.state == ItemState::kWaiting || item.state == ItemState::kQueued);
  const uint32_t s = item.send;
  // Waiting items of a DONE send were answered when it ended.
  KV_CHECK(sends_[s].state != SendState::kDone);
  AnswerItem(i, TransferResult::kDeadline);
  EndSend(s, TransferResult::kDeadline, now);
}

// ---------------------------------------------------------------------------
// Slabs, lists, answers, tombstones.

bool SendTable::BindConsumer(uint32_t s, PeerId peer) {
  Send& send = sends_[s];
  const uint32_t engine = PeerEngineOf(peer);
  if (send.consumer == kAnyConsumerEngine) {
    send.consumer = engine;
    return true;
  }
  if (send.consumer == engine) return true;
  ++stats_.refused_wrong_engine;
  return false;
}

uint32_t SendTable::NewSend(TransferId transfer, Instant now) {
  uint32_t s;
  if (free_sends_ != kNil) {
    s = free_sends_;
    free_sends_ = sends_[s].next_free;
  } else {
    s = static_cast<uint32_t>(sends_.size());
    sends_.emplace_back();
  }
  Send& send = sends_[s];
  const uint32_t gen = send.generation + 1;
  send = Send{};
  send.used = true;
  send.generation = gen;
  send.transfer = transfer;
  send.created = now;
  index_.Insert(transfer, s, SendKeyOf{&sends_});
  return s;
}

void SendTable::FreeSend(uint32_t s) {
  Send& send = sends_[s];
  KV_CHECK(send.used);
  KV_CHECK(!expiry_.IsArmed(s));
  send.used = false;
  send.blocks.clear();
  send.blocks.shrink_to_fit();
  send.next_free = free_sends_;
  free_sends_ = s;
}

uint32_t SendTable::NewItem(uint32_t s, PeerId peer, uint64_t pull_seq,
                            const PullItem& pulled, Instant now) {
  uint32_t i;
  if (free_items_ != kNil) {
    i = free_items_;
    free_items_ = items_[i].next_free;
  } else {
    i = static_cast<uint32_t>(items_.size());
    items_.emplace_back();
  }
  Item& item = items_[i];
  KV_CHECK(item.state == ItemState::kFree);
  item.generation += 1;
  item.state = ItemState::kWaiting;
  item.send = s;
  item.peer = peer;
  item.pull_seq = pull_seq;
  // The pull's deadline: abort_timeout from now, or less if D says so.
  const Duration budget = pulled.budget_ns > 0 ? Duration::Nanoseconds(pulled.budget_ns)
                                               : options_.abort_timeout;
  item.deadline = now + std::min(budget, options_.abort_timeout);
  item.dst = pulled.dst;
  item.want = static_cast<uint32_t>(pulled.dst.size());
  item.sent = 0;
  item.writing_to = 0;
  item.prompt_hash = pulled.prompt_hash;
  item.in_send = Links{};
  item.in_queue = Links{};
  live_keys_[ItemKey(peer, pull_seq, sends_[s].transfer)] = i;
  ListPush<&Item::in_send>(sends_[s].items, i);
  deadlines_.Arm(i, item.deadline);
  ++live_items_;
  return i;
}

void SendTable::AnswerItem(uint32_t i, TransferResult result) {
  Item& item = items_[i];
  KV_CHECK(item.state != ItemState::kFree);
  const Send& send = sends_[item.send];
  Answer(item.peer, item.pull_seq, send.transfer, result,
         result == TransferResult::kOk ? send.first_token : kNoFirstToken);
  FreeItem(i);
}

void SendTable::FreeItem(uint32_t i) {
  Item& item = items_[i];
  if (item.state == ItemState::kQueued) {
    ListRemove<&Item::in_queue>(admission_, i);
  }
  ListRemove<&Item::in_send>(sends_[item.send].items, i);
  live_keys_.erase(ItemKey(item.peer, item.pull_seq, sends_[item.send].transfer));
  deadlines_.Cancel(i);
  item.state = ItemState::kFree;
  item.dst.clear();
  item.send = kNil;
  item.next_free = free_items_;
  free_items_ = i;
  KV_CHECK_GT(live_items_, 0u);
  --live_items_;
}

void SendTable::Answer(PeerId peer, uint64_t seq, TransferId t,
                       TransferResult r, uint32_t first_token) {
  ++stats_.answers[static_cast<int>(r)];
  actions_.push_back(AnswerPull{peer, seq, t, r, first_token});
  // Remember it, so a resent pull gets the same answer.
  // The oldest goes before the new one comes in, as for tombstones, so the
  // map never holds bound + 1 entries (which would double its capacity).
  const uint64_t key = ItemKey(peer, seq, t);
  if (answered_.contains(key)) return;
  while (answered_fifo_.size() >= options_.max_tombstones) {
    answered_.erase(answered_fifo_.front().key);
    answered_fifo_.pop_front();
  }
  answered_.emplace(key, r);
  answered_fifo_.push_back(Answered{key, now_});
}

uint64_t SendTable::ItemKey(PeerId peer, uint64_t seq, TransferId t) {
  return Mix64(Mix64(peer.Packed() ^ Mix64(seq)) ^ t.hi) ^ Mix64(t.lo + 1);
}

std::optional<TransferResult> SendTable::EndedAs(TransferId transfer) const {
  const uint32_t found = FindSend(transfer);
  if (found != kNil) {
    const Send& send = sends_[found];
    if (send.state == SendState::kDone) {
      // Everyone who needed it pulled; this pull is surplus.
      return send.end_reason == TransferResult::kOk
                 ? TransferResult::kAlreadyPulled
                 : send.end_reason;
    }
    return std::nullopt;
  }
  auto t = tombstones_.find(transfer);
  if (t != tombstones_.end()) return t->second;
  return std::nullopt;
}

void SendTable::AddTombstone(TransferId transfer, TransferResult reason,
                             Instant now) {
  if (tombstones_.count(transfer) != 0) return;
  while (tombstones_.size() >= options_.max_tombstones) {
    KV_CHECK(!tombstone_fifo_.empty());
    tombstones_.erase(tombstone_fifo_.front().transfer);
    tombstone_fifo_.pop_front();
    ++stats_.tombstones_evicted;
  }
  tombstones_.emplace(transfer, reason);
  tombstone_fifo_.push_back(Tombstone{transfer, now});
}

void SendTable::PruneTombstones(Instant now) {
  now_ = now;
  while (!answered_fifo_.empty() && answered_fifo_.front().at + TombstoneTtl() <= now) {
    answered_.erase(answered_fifo_.front().key);
    answered_fifo_.pop_front();
  }
  while (!tombstone_fifo_.empty() &&
         tombstone_fifo_.front().created + TombstoneTtl() <= now) {
    tombstones_.erase(tombstone_fifo_.front().transfer);
    tombstone_fifo_.pop_front();
  }
}

template <SendTable::Links SendTable::Item::*L>
void SendTable::ListPush(List& list, uint32_t i) {
  Links& links = items_[i].*L;
  links.prev = list.tail;
  links.next = kNil;
  if (list.tail != kNil) (items_[list.tail].*L).next = i;
  else list.head = i;
  list.tail = i;
  ++list.size;
}

template <SendTable::Links SendTable::Item::*L>
void SendTable::ListRemove(List& list, uint32_t i) {
  Links& links = items_[i].*L;
  if (links.prev != kNil) (items_[links.prev].*L).next = links.next;
  else list.head = links.next;
  if (links.next != kNil) (items_[links.next].*L).prev = links.prev;
  else list.tail = links.prev;
  links = Links{};
  KV_CHECK_GT(list.size, 0u);
  --list.size;
}

}  // namespace kvrelay
