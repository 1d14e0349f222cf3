// sim_network.cc — the simulator's control channel: every rank's session
// actions carried out, its frames (encoded wire bytes) delivered FIFO per
// connection and incarnation with delays, drops, partitions and reconnects,
// faults injected, and every answer checked the moment it leaves P.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"
#include "core/tp_mapping.h"
#include "sim/simulator.h"

namespace kvrelay::sim {

namespace {
uint64_t PullKey(uint32_t p_engine, uint32_t p_inc, uint32_t p_rank, PeerId d,
                 uint64_t seq, TransferId t) {
  uint64_t h = Mix64((uint64_t{p_engine} << 40) ^ (uint64_t{p_inc} << 8) ^ p_rank);
  h = Mix64(h ^ d.Packed());
  h = Mix64(h ^ seq);
  return Mix64(h ^ t.hi) ^ t.lo;
}
}  // namespace

void Simulator::DrainRank(uint32_t e, uint32_t r) {
  Node& node = nodes_[e];
  if (!node.alive) return;
  RankSession& rank = *node.ranks[r];
  while (auto a = rank.PollAction()) {
    RunAction(e, r, std::move(*a));
    if (!result_.ok) return;
  }
  if (rank.HasReport()) ScheduleStep(e);
  if (auto next = rank.NextDeadline()) {
    if (!node.timer_at[r] || *next < *node.timer_at[r]) {
      // Timers fire late by a random amount, as in a busy actor loop: the
      // core must not rely on a timer running before other inputs.
      const Duration late = Duration::Nanoseconds(static_cast<int64_t>(
          prng_.Uniform(static_cast<uint64_t>(params_.timer_late_max.ns()) + 1)));
      const Instant at = std::max(*next, now_) + late;
      node.timer_at[r] = at;
      queue_.Push(Event{at, 0, EventKind::kRankTimer, 0, e, r, node.incarnation});
    }
  }
}

// The session's effects, in the simulated world: frames onto the network,
// writes and reads onto the data plane, lanes and memory "opened" (always,
// but a lane only to a live P), and the checks on what it decided.
void Simulator::RunAction(uint32_t e, uint32_t r, SessionAction a) {
  RankSession& rank = *nodes_[e].ranks[r];
  if (auto* f = std::get_if<FrameToProducer>(&a)) {
    SendFrame(e, r, f->engine, f->rank, nodes_[f->engine].incarnation, true, std::move(f->frame));
  } else if (auto* f2 = std::get_if<FrameToConsumer>(&a)) {
    uint32_t de = 0, dr = 0, dinc = 0;
    KV_CHECK(std::sscanf(f2->identity.c_str(), "%u:%u:%u", &de, &dr, &dinc) == 3);
    SendFrame(e, r, de, dr, dinc, false, std::move(f2->frame));
  } else if (auto* w = std::get_if<StartWrite>(&a)) {
    BeginWrite(e, r, std::move(*w));
  } else if (auto* rd = std::get_if<StartRead>(&a)) {
    BeginRead(e, r, std::move(*rd));
  } else if (auto* o = std::get_if<OpenTarget>(&a)) {
    rank.OnTargetOpened(o->peer, true, "", now_);
  } else if (auto* l = std::get_if<kvrelay::OpenLane>(&a)) {
    if (nodes_[l->engine].alive) {
      lanes_[{e, r, l->engine, l->rank}] = nodes_[l->engine].incarnation;
      Hit(Mark::kLaneOpened);
    } else {
      lanes_.erase({e, r, l->engine, l->rank});
      rank.OnLaneClosed(l->engine, l->rank, /*process_gone=*/false, now_);
    }
  } else if (auto* pc = std::get_if<ProducerChanged>(&a)) {
    if (pc->state == ProducerState::kUp) {
      // A session never goes back to an incarnation older than one it knew.
      uint32_t& newest = newest_known_[LinkKey{e, r, pc->engine, pc->rank}];
      if (pc->peer.generation < newest) {
        Violation("D rank " + std::to_string(e) + "/" + std::to_string(r) +
                  " took incarnation " + std::to_string(pc->peer.generation) + " of P " +
                  std::to_string(pc->engine) + "/" + std::to_string(pc->rank) +
                  " after knowing " + std::to_string(newest) + " (a stale frame accepted)");
        return;
      }
      newest = pc->peer.generation;
    }
  }
  // OpenSource, grants (the checks read the session's own), observations
  // and log lines have nothing to do here.
}

uint64_t Simulator::ConnKey(uint32_t e1, uint32_t r1, uint32_t e2, uint32_t r2) const {
  uint32_t a = PeerAddress{e1, r1, 0}.Id().index, b = PeerAddress{e2, r2, 0}.Id().index;
  if (a > b) std::swap(a, b);
  return (uint64_t{a} << 32) | b;
}

bool Simulator::Partitioned(uint32_t a, uint32_t b) const {
  return partitions_.count({std::min(a, b), std::max(a, b)}) != 0;
}

void Simulator::ScheduleReconnect(uint32_t d, uint32_t dr, uint32_t p, uint32_t pr,
                                  Duration after) {
  // A client reconnects a connection once, however many sends failed.
  if (!reconnect_pending_.insert(ConnKey(d, dr, p, pr)).second) return;
  queue_.Push(Event{now_ + after, 0, EventKind::kReconnect, p, d, dr, pr});
}

// A healed partition: every connection between the two engines comes back.
void Simulator::ReconnectEngines(uint32_t p, uint32_t d) {
  for (uint32_t dr = 0; dr < nodes_[d].tp; ++dr) {
    for (uint32_t pr = 0; pr < nodes_[p].tp; ++pr) {
      ScheduleReconnect(d, dr, p, pr, NetDelay());
    }
  }
}

bool Simulator::CheckAnswer(uint32_t e, uint32_t r, PeerId to, const AnswerMsg& answer) {
  const uint64_t key = PullKey(e, nodes_[e].incarnation, r, to, answer.pull_seq, answer.transfer);
  auto it = pull_answers_.find(key);
  if (it == pull_answers_.end()) {
    Violation("an answer for a pull this P rank never received");
    return false;
  }
  PullRecord& rec = it->second;
  // One decision per (pull, transfer): re-sent only for a re-delivered
  // pull, and never changed.
  if (rec.answers > 0) {
    if (answer.result != rec.first_result) {
      Violation("pull " + std::to_string(answer.pull_seq) + " of transfer " +
                answer.transfer.ToString() + " answered twice with different results");
      return false;
    }
    if (++rec.answers > rec.deliveries) {
      Violation("pull " + std::to_string(answer.pull_seq) + " of transfer " +
                answer.transfer.ToString() + " answered more often than delivered");
      return false;
    }
    return true;
  }
  rec.first_result = answer.result;
  ++rec.answers;
  // Promptly: by the pull's deadline, plus a write that started before it
  // and a timer that ran late.
  const Instant latest = rec.received + params_.timings.abort_timeout + params_.write_time_max +
                         params_.timer_late_max;
  if (now_ > latest) {
    Violation("pull " + std::to_string(answer.pull_seq) + " of transfer " +
              answer.transfer.ToString() + " answered after its deadline");
    return false;
  }
  return true;
}

void Simulator::SendFrame(uint32_t e, uint32_t r, uint32_t te, uint32_t tr, uint32_t to_inc,
                          bool to_producer, std::vector<uint8_t> frame) {
  KV_CHECK_LT(te, nodes_.size());
  if (!to_producer) {
    // The codec in the loop: what P sends is checked as D will decode it.
    Result<WireMessage> m = DecodeWire(frame, WireLimits{});
    KV_CHECK(m.ok());
    if (const auto* answer = std::get_if<AnswerMsg>(&*m)) {
      if (!CheckAnswer(e, r, PeerAddress{te, tr, to_inc}.Id(), *answer)) return;
    }
  }
  const uint64_t conn = ConnKey(e, r, te, tr);
  if (faults_on() && prng_.Chance(params_.conn_drop_pm, 1000)) {
    ++conn_epoch_[conn];  // everything in flight on it is lost, both ways
    Hit(Mark::kConnectionDropped);
    if (nodes_[e].producer && !to_producer) {
      ScheduleReconnect(te, tr, e, r, NetDelay());
    } else {
      ScheduleReconnect(e, r, te, tr, NetDelay());
    }
    return;
  }
  if (Partitioned(e, te)) return;
  const uint32_t slot = TakeSlot(messages_, free_messages_);
  InFlightMessage& m = messages_[slot];
  m.used = true;
  m.from_engine = e;
  m.from_rank = r;
  m.from_incarnation = nodes_[e].incarnation;
  m.to_engine = te;
  m.to_rank = tr;
  m.to_incarnation = to_inc;
  m.conn_epoch = conn_epoch_[conn];
  m.to_producer = to_producer;
  m.frame = std::move(frame);
  const Duration span = params_.net_delay_max - params_.net_delay_min;
  Instant at = now_ + params_.net_delay_min +
               Duration::Nanoseconds(static_cast<int64_t>(prng_.Uniform(span.ns() + 1)));
  // FIFO within one connection's direction, as with TCP/ZeroMQ. A restarted
  // process talks on a new connection: its frames and its previous life's
  // may arrive in either order (a stale frame after a fresh one).
  const uint64_t dir = conn ^ (uint64_t{PeerAddress{e, r, 0}.Id().index} << 20) ^
                       (uint64_t{m.from_incarnation} << 44);
  Instant& last = conn_last_delivery_[dir];
  at = std::max(at, last);
  last = at;
  queue_.Push(Event{at, 0, EventKind::kDeliver, slot});
}

void Simulator::Deliver(uint32_t slot) {
  InFlightMessage m = std::move(messages_[slot]);
  messages_[slot] = InFlightMessage{};
  free_messages_.push_back(slot);
  KV_CHECK(m.used);
  const uint64_t conn = ConnKey(m.from_engine, m.from_rank, m.to_engine, m.to_rank);
  if (m.conn_epoch != conn_epoch_[conn]) return;           // connection broke
  if (Partitioned(m.from_engine, m.to_engine)) return;
  Node& to = nodes_[m.to_engine];
  if (m.to_incarnation != to.incarnation || !to.alive) return;  // receiver died
  RankSession& rank = *to.ranks[m.to_rank];
  if (!m.to_producer) {
    rank.OnFrameFromProducer(m.from_engine, m.from_rank, m.frame, now_);
    DrainRank(m.to_engine, m.to_rank);
    return;
  }
  const PeerId from = PeerAddress{m.from_engine, m.from_rank, m.from_incarnation}.Id();
  const uint64_t taken_before = rank.stats().pull_items_taken;
  const std::string identity = std::to_string(m.from_engine) + ":" +
                               std::to_string(m.from_rank) + ":" +
                               std::to_string(m.from_incarnation);
  rank.OnFrameFromConsumer(identity, m.frame, now_);
  if (rank.stats().pull_items_taken != taken_before) {
    // Every item the tables took must be answered exactly once (checked in
    // CheckAnswer and when the run drains).
    Result<WireMessage> decoded = DecodeWire(m.frame, WireLimits{});
    KV_CHECK(decoded.ok());
    const PullMsg& pull = std::get<PullMsg>(*decoded);
    for (const PullItem& item : pull.items) {
      auto [rec, fresh] = pull_answers_.emplace(
          PullKey(m.to_engine, to.incarnation, m.to_rank, from, pull.pull_seq, item.transfer),
          PullRecord{m.to_engine, to.incarnation, m.from_engine, m.from_incarnation, 0, 0,
                     TransferResult::kOk, now_});
      ++rec->second.deliveries;
      (void)fresh;
    }
  }
  DrainRank(m.to_engine, m.to_rank);
}

void Simulator::MaybeInjectFault() {
  const uint32_t n = static_cast<uint32_t>(nodes_.size());
  const uint32_t np = static_cast<uint32_t>(params_.p_tp.size());
  if (prng_.Chance(params_.crash_pm, 1000)) {
    const uint32_t e = static_cast<uint32_t>(prng_.Uniform(n));
    queue_.Push(Event{now_ + Duration::Microseconds(prng_.Range(1, 5000)), 0,
                      EventKind::kCrash, 0, e});
  }
  if (prng_.Chance(params_.partition_pm, 1000)) {
    const uint32_t p = static_cast<uint32_t>(prng_.Uniform(np));
    const uint32_t d = np + static_cast<uint32_t>(prng_.Uniform(n - np));
    if (partitions_.emplace(std::make_pair(p, d), now_).second) {
      Hit(Mark::kPartition);
      queue_.Push(Event{now_ + Duration::Milliseconds(prng_.Range(1, 200)), 0,
                        EventKind::kHeal, 0, p, d});
    }
  }
  if (prng_.Chance(params_.lifecycle_pm, 1000)) {
    const uint32_t e = static_cast<uint32_t>(prng_.Uniform(n));
    queue_.Push(Event{now_ + Duration::Microseconds(prng_.Range(1, 20000)), 0,
                      EventKind::kLifecycle, 0, e, 0, nodes_[e].incarnation});
  }
}

}  // namespace kvrelay::sim
