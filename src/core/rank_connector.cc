#include "core/rank_connector.h"

#include <algorithm>
#include <memory>
#include <type_traits>

#include "base/check.h"
#include "core/tp_mapping.h"

namespace kvrelay {

void RankConnectorOptions::ApplyTimings(const TransferTimings& t) {
  send.abort_timeout = t.abort_timeout;
  send.giveup_grace = t.giveup_grace;
  load.abort_timeout = t.abort_timeout;
  load.giveup_grace = t.giveup_grace;
  lease.initial_lease = t.lease;
  lease.extension = t.lease_extension;
  lease.tombstone_ttl = t.GiveUp();
  read.heartbeat_interval = t.lease_heartbeat;
  read.read_margin = t.read_margin;
  read.giveup = t.GiveUp();
}

const char* KvModeName(KvMode mode) { return mode == KvMode::kRead ? "read" : "push"; }

bool ParseKvMode(const std::string& name, KvMode* out) {
  if (name == "push") {
    *out = KvMode::kPush;
  } else if (name == "read") {
    *out = KvMode::kRead;
  } else {
    return false;
  }
  return true;
}

RankConnector::RankConnector(const RankConnectorOptions& options)
    : options_(options) {
  KV_CHECK_LT(options_.rank, options_.tp);
  const bool read = options_.mode == KvMode::kRead;
  if (producer() && !read) send_ = std::make_unique<SendTable>(options_.send);
  if (consumer() && !read) load_ = std::make_unique<LoadTable>(options_.load);
  if (producer() && read) lease_ = std::make_unique<LeaseTable>(options_.lease);
  if (consumer() && read) read_ = std::make_unique<ReadLoadTable>(options_.read);
}

void RankConnector::SetPeer(uint32_t engine, uint32_t rank, PeerId peer,
                            Instant now) {
  AcceptIncarnation(peer);
  auto [it, inserted] = peers_.try_emplace({engine, rank}, peer);
  if (inserted || it->second == peer) return;
  const PeerId old = it->second;
  it->second = peer;
  gone_.erase({old.index, old.generation});
  if (old.generation < peer.generation) FailPeer(old, now);
}

bool RankConnector::AcceptIncarnation(PeerId from) {
  auto [it, inserted] = newest_incarnation_.try_emplace(from.index, from.generation);
  if (inserted) return true;
  if (from.generation < it->second) {
    ++stats_.stale_incarnation;
    return false;
  }
  it->second = from.generation;
  return true;
}

void RankConnector::Reconnected(PeerId peer, Instant now) {
  gone_.erase({peer.index, peer.generation});  // it answered: alive after all
  if (load_) load_->ResendTo(peer, now);
  if (read_) read_->ResendTo(peer, now);
  Pump();
}

void RankConnector::PeerGone(PeerId peer, Instant now, bool fail_pulls) {
  for (const auto& [key, current] : peers_) {
    if (current == peer) gone_.insert({peer.index, peer.generation});
  }
  if (fail_pulls) FailPeer(peer, now);
}

void RankConnector::FailPeer(PeerId peer, Instant now) {
  if (load_) load_->PeerGone(peer, now);
  if (read_) read_->PeerGone(peer, now);
  Pump();
}

std::vector<PeerId> RankConnector::ProducersFor(uint32_t engine, uint32_t p_tp,
                                                bool* all_known) const {
  std::vector<PeerId> out;
  *all_known = true;
  for (uint32_t r : ProducerRanksFor(options_.rank, options_.tp, p_tp)) {
    auto it = peers_.find({engine, r});
    if (it == peers_.end() || gone_.count({it->second.index, it->second.generation}) != 0) {
      *all_known = false;  // never handshook, or gone: nobody would answer
      continue;
    }
    out.push_back(it->second);
  }
  return out;
}

template <typename Table>
void RankConnector::ApplyProducer(Table& table, const ConnectorMetadata& meta, Instant now) {
  for (const ClaimOp& op : meta.claims) {
    const uint32_t need = ConsumersPerProducer(options_.tp, op.consumer_tp);
    if (!table.Claim(op.transfer, need, now, op.prompt_hash, op.consumer_engine).ok()) {
      ++stats_.claim_refused;
    }
  }
  // Push mode streams: the first ProgressOp of a transfer is its hand-over
  // on this rank (accepted: reported at its SendFinished; refused: now);
  // later ones, and the ReadyOp after them, are reported by that one. Read
  // mode hands off whole: it ignores ProgressOps, its ReadyOp is the first.
  [[maybe_unused]] bool streams = false;
  if constexpr (std::is_same_v<Table, SendTable>) {
    streams = true;
    for (const ProgressOp& op : meta.progress) {
      const Status st = table.Progress(op.transfer, op.blocks, op.total_blocks, now,
                                       op.prompt_hash);
      if (!st.ok()) ++stats_.progress_refused;
      if (!st.ok() && op.first) report_.finished_sending.push_back(op.transfer);
    }
  }
  for (const ReadyOp& op : meta.readies) {
    Status ready;
    if constexpr (std::is_same_v<Table, SendTable>) {
      ready = table.Ready(op.transfer, op.blocks, now, op.prompt_hash, op.first_token);
    } else {
      ready = table.Ready(op.transfer, op.blocks, now, op.prompt_hash);  // read mode: no token
    }
    if (!ready.ok()) {
      // The send ended first (D released it, a deadline passed): nothing
      // holds the blocks on this rank (a streamed send: its first
      // ProgressOp's report covers it).
      ++stats_.ready_refused;
      if (!(streams && op.streamed)) report_.finished_sending.push_back(op.transfer);
    }
  }
  for (const AbortSendOp& op : meta.aborts) {
    if constexpr (std::is_same_v<Table, SendTable>) {
      table.Abort(op.transfer, now, op.reset ? TransferResult::kReset : TransferResult::kAborted);
    } else {
      table.Abort(op.transfer, now);  // read mode streams nothing to reset
    }
  }
}

template <typename Table>
void RankConnector::ApplyConsumer(Table& table, const ConnectorMetadata& meta, Instant now) {
  for (const LoadOp& op : meta.loads) {
    bool all_known = false;
    std::vector<PeerId> peers = ProducersFor(op.producer_engine, op.producer_tp, &all_known);
    Status s = all_known ? table.Start(op.request, op.transfer, peers, op.dst, now,
                                       op.prompt_hash)
                         : UnavailableError("producer rank unknown");
    if (!s.ok()) {
      // Nothing was sent for this load, so nothing can land: it fails now.
      // If a producer was unknown, the known ones are told to drop the
      // transfer. Any other refusal (a live load already has this
      // transfer_id) must leave the transfer alone: it is someone else's.
      if (!all_known) {
        ++stats_.unknown_producer;
        table.ReleaseUnstarted(op.transfer, peers, op.prompt_hash);
      }
      report_.finished_recving.push_back(
          LoadDone{op.request, op.transfer, false, false, TransferResult::kUnreachable});
    }
  }
  for (const ReleaseLoadOp& op : meta.releases) {
    // No live load on this rank: the blocks are free to go now.
    if (!table.Release(op.request, now)) report_.released.push_back(op.request);
  }
  for (const ReleaseUnstartedOp& op : meta.unstarted_releases) {
    bool all_known = false;
    table.ReleaseUnstarted(op.transfer,
                           ProducersFor(op.producer_engine, op.producer_tp, &all_known),
                           op.prompt_hash);
  }
}

void RankConnector::ApplyMetadata(const ConnectorMetadata& meta, Instant now) {
  if (send_) ApplyProducer(*send_, meta, now);
  if (lease_) ApplyProducer(*lease_, meta, now);
  if (load_) ApplyConsumer(*load_, meta, now);
  if (read_) ApplyConsumer(*read_, meta, now);
  if (meta.abort_all) {
    if (send_) send_->ReleaseHeld(now);
    if (load_) load_->AbortAll(now);
    if (lease_) lease_->ReleaseHeld(now);
    if (read_) read_->AbortAll(now);
  }
  Pump();
}

void RankConnector::OnMessage(PeerId from, const PeerMessage& msg, Instant now) {
  if (!AcceptIncarnation(from)) return;
  const bool to_producer = std::holds_alternative<PullMsg>(msg) ||
                           std::holds_alternative<LeaseMsg>(msg) ||
                           std::holds_alternative<NoticeMsg>(msg);
  if (to_producer ? !producer() : !consumer()) {
    ++stats_.messages_wrong_role;
    return;
  }
  if (const auto* pull = std::get_if<PullMsg>(&msg)) {
    if (!send_) return void(++stats_.messages_wrong_mode);
    send_->Pull(from, pull->pull_seq, pull->items, now);
  } else if (const auto* answer = std::get_if<AnswerMsg>(&msg)) {
    if (!load_) return void(++stats_.messages_wrong_mode);
    load_->OnAnswer(from, answer->pull_seq, answer->transfer, answer->result, now,
                    answer->first_token);
  } else if (const auto* hb = std::get_if<LeaseMsg>(&msg)) {
    if (!lease_) return void(++stats_.messages_wrong_mode);
    lease_->Heartbeat(from, hb->seq, hb->transfer, hb->prompt_hash, now);
  } else if (const auto* notice = std::get_if<NoticeMsg>(&msg)) {
    if (!lease_) return void(++stats_.messages_wrong_mode);
    lease_->Notice(from, notice->transfer, notice->notice, now);
  } else if (const auto* grant = std::get_if<GrantMsg>(&msg)) {
    if (!read_) return void(++stats_.messages_wrong_mode);
    read_->OnGrant(from,
                   GrantLease{from, grant->seq, grant->transfer, grant->answer, grant->result,
                              grant->remaining_ns, grant->src},
                   now);
  } else {
    if (!read_) return void(++stats_.messages_wrong_mode);
    const RevokeMsg& revoke = std::get<RevokeMsg>(msg);
    read_->OnRevoke(from, revoke.transfer, revoke.reason, now);
  }
  Pump();
}

void RankConnector::OnWriteDone(WriteId write, bool ok, Instant now) {
  KV_CHECK(send_ != nullptr);
  send_->WriteDone(write, ok, now);
  Pump();
}

void RankConnector::OnReadDone(ReadId read, bool ok, Instant now) {
  KV_CHECK(read_ != nullptr);
  read_->OnReadDone(read, ok, now);
  Pump();
}

void RankConnector::OnTimer(Instant now) {
  if (send_) send_->OnTimer(now);
  if (load_) load_->OnTimer(now);
  if (lease_) lease_->OnTimer(now);
  if (read_) read_->OnTimer(now);
  Pump();
}

std::optional<Instant> RankConnector::NextDeadline() const {
  std::optional<Instant> next;
  for (std::optional<Instant> t :
       {send_ ? send_->NextDeadline() : std::nullopt, load_ ? load_->NextDeadline() : std::nullopt,
        lease_ ? lease_->NextDeadline() : std::nullopt,
        read_ ? read_->NextDeadline() : std::nullopt}) {
    if (t && (!next || *t < *next)) next = t;
  }
  return next;
}

void RankConnector::PumpLease() {
  while (auto a = lease_->PollAction()) {
    if (auto* g = std::get_if<GrantLease>(&*a)) {
      actions_.push_back(OutMessage{g->peer, GrantMsg{g->seq, g->transfer, g->answer, g->result,
                                                      g->remaining_ns, std::move(g->src)}});
    } else if (auto* r = std::get_if<RevokeLease>(&*a)) {
      actions_.push_back(OutMessage{r->peer, RevokeMsg{r->transfer, r->reason}});
    } else {
      report_.finished_sending.push_back(std::get<SendFinished>(*a).transfer);
    }
  }
}

void RankConnector::PumpRead() {
  while (auto a = read_->PollAction()) {
    if (auto* hb = std::get_if<SendHeartbeat>(&*a)) {
      actions_.push_back(OutMessage{hb->peer, LeaseMsg{hb->seq, hb->transfer, hb->prompt_hash}});
    } else if (auto* n = std::get_if<SendNotice>(&*a)) {
      actions_.push_back(OutMessage{n->peer, NoticeMsg{n->transfer, n->notice}});
    } else if (auto* r = std::get_if<StartRead>(&*a)) {
      actions_.push_back(std::move(*r));
    } else if (auto* done = std::get_if<LoadDone>(&*a)) {
      report_.finished_recving.push_back(*done);
    } else {
      report_.released.push_back(std::get<LoadReleased>(*a).request);
    }
  }
}

void RankConnector::Pump() {
  if (lease_) PumpLease();
  if (read_) PumpRead();
  if (send_) {
    while (auto a = send_->PollAction()) {
      if (auto* answer = std::get_if<AnswerPull>(&*a)) {
        actions_.push_back(OutMessage{answer->peer, AnswerMsg{answer->pull_seq, answer->transfer,
                                                              answer->result, answer->first_token}});
      } else if (auto* write = std::get_if<StartWrite>(&*a)) {
        actions_.push_back(std::move(*write));
      } else {
        report_.finished_sending.push_back(std::get<SendFinished>(*a).transfer);
      }
    }
  }
  if (load_) {
    while (auto a = load_->PollAction()) {
      if (auto* pull = std::get_if<SendPull>(&*a)) {
        PullMsg msg;
        msg.pull_seq = pull->pull_seq;
        msg.items.push_back(PullItem{pull->transfer, std::move(pull->dst), pull->prompt_hash,
                                     pull->budget_ns});
        actions_.push_back(OutMessage{pull->peer, std::move(msg)});
      } else if (auto* done = std::get_if<LoadDone>(&*a)) {
        report_.finished_recving.push_back(*done);
      } else {
        report_.released.push_back(std::get<LoadReleased>(*a).request);
      }
    }
  }
}

std::optional<RankAction> RankConnector::PollAction() {
  if (actions_.empty()) return std::nullopt;
  RankAction a = std::move(actions_.front());
  actions_.pop_front();
  return a;
}

RankReport RankConnector::GetFinished() {
  RankReport out;
  std::swap(out, report_);
  return out;
}

void RankConnector::CheckInvariants() const {
  if (send_) send_->CheckInvariants();
  if (load_) load_->CheckInvariants();
  if (lease_) lease_->CheckInvariants();
  if (read_) read_->CheckInvariants();
  // A gone mark names a peer still current for its (engine, rank).
  for (const auto& [index, generation] : gone_) {
    bool current = false;
    for (const auto& [key, peer] : peers_) {
      current = current || (peer.index == index && peer.generation == generation);
    }
    KV_CHECK(current);
  }
}

}  // namespace kvrelay
