// sim_transport.cc — the simulator's network and data plane: per-connection
// FIFO delivery with drops, partitions and dead incarnations; writes that
// land after random delays, fail, or land garbage; and the checks that fire
// the moment a message or a write breaks an invariant.
#include <algorithm>
#include <cstdio>

#include "base/check.h"
#include "core/tp_mapping.h"
#include "sim/simulator.h"

namespace kvrelay::sim {

namespace {
// Are `blocks` granted to `t` in `grants` (a transport that checks grants
// refuses anything else)?
bool Granted(const std::unordered_map<TransferId, std::vector<uint32_t>>& grants, TransferId t,
             const std::vector<BlockId>& blocks) {
  auto it = grants.find(t);
  if (it == grants.end()) return false;
  for (const BlockId& b : blocks) {
    if (std::find(it->second.begin(), it->second.end(), b.index) == it->second.end()) {
      return false;
    }
  }
  return true;
}
}  // namespace

void Simulator::BlocksFreedCheck(uint32_t engine) {
  const std::vector<BlockId> blocks = nodes_[engine].memory->TakeFreed();
  if (blocks.empty()) return;
  // A block goes back to the pool only after every grant of it was revoked:
  // else a late write (or read) the transport lets through lands in the
  // block's next owner.
  for (const auto& session : nodes_[engine].ranks) {
    for (const auto* grants : {&session->write_grants(), &session->read_grants()}) {
      for (const auto& [t, granted] : *grants) {
        for (const BlockId& b : blocks) {
          if (std::find(granted.begin(), granted.end(), b.index) != granted.end()) {
            Violation("engine " + std::to_string(engine) + " freed block " + b.ToString() +
                      " while it is still granted to transfer " + t.ToString());
            return;
          }
        }
      }
    }
  }
  for (const Write& w : writes_) {
    // A write whose process died never lands (FinishWrite drops it): the
    // transports guarantee that (shm: the writer is gone; tcp: D's own
    // receiver writes; ucx: the endpoint is torn down with the process).
    if (!w.used || w.d_engine != engine ||
        w.d_incarnation != nodes_[engine].incarnation ||
        w.p_incarnation != nodes_[w.p_engine].incarnation) {
      continue;
    }
    // A P rank D declared gone for its silence may still be alive (a
    // partition): D freed at once, and the write, if it ever arrives, finds
    // its grant revoked and is refused (FinishWrite) — tcp's guarantee; shm
    // and ucx check no grants (docs/operations.md, "Known limits").
    if (silence_gone_.count({engine, w.d_rank, w.p_engine, w.p_rank, w.p_incarnation}) != 0) {
      Hit(Mark::kFreedUnderSilentPeer);
      continue;
    }
    for (const BlockId& b : w.w.dst) {
      if (std::find(blocks.begin(), blocks.end(), b) != blocks.end()) {
        Violation("D freed block " + b.ToString() + " while a write into it is in flight (transfer " +
                  w.w.transfer.ToString() + " from P " + std::to_string(w.p_engine) + "/" +
                  std::to_string(w.p_rank) + ")");
        return;
      }
    }
  }
  for (const Read& rd : reads_) {
    // D's own reads land in D's blocks: D must keep them until they have.
    if (!rd.used || rd.d_engine != engine || rd.d_incarnation != nodes_[engine].incarnation) {
      continue;
    }
    for (const BlockId& b : rd.r.dst) {
      if (std::find(blocks.begin(), blocks.end(), b) != blocks.end()) {
        Violation("D freed block " + b.ToString() + " while a read into it is in flight");
        return;
      }
    }
  }
}

// --- ranks, network, data plane --------------------------------------------

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
      lanes_.insert({e, r, l->engine, l->rank});
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
    } else if (pc->state == ProducerState::kGone && nodes_[pc->engine].alive &&
               nodes_[pc->engine].incarnation == pc->peer.generation) {
      // Declared gone, yet alive: silence (a partition, lost frames).
      silence_gone_.insert({e, r, pc->engine, pc->rank, pc->peer.generation});
    }
  }
  // OpenSource, grants (the checks read the session's own), observations
  // and log lines have nothing to do here.
}

namespace {
uint64_t PullKey(uint32_t p_engine, uint32_t p_inc, uint32_t p_rank, PeerId d,
                 uint64_t seq, TransferId t) {
  uint64_t h = Mix64((uint64_t{p_engine} << 40) ^ (uint64_t{p_inc} << 8) ^ p_rank);
  h = Mix64(h ^ d.Packed());
  h = Mix64(h ^ seq);
  return Mix64(h ^ t.hi) ^ t.lo;
}
}  // namespace

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

// A P incarnation that died is found out: at once by a D rank whose lane
// to it closed, else by its successor's reply or by silence — within
// peer_dead_after of the first unanswered hello. A load of D rank (d, dr)
// still waiting on it after that is the wedge rule 8 forbids.
void Simulator::CheckDeadProducers(uint32_t d, uint32_t dr) {
  const RankConnector& conn = nodes_[d].ranks[dr]->connector();
  std::vector<LoadView> loads;
  if (const LoadTable* t = conn.load_table()) loads = t->Loads();
  if (const ReadLoadTable* t = conn.read_table()) loads = t->Loads();
  for (const LoadView& load : loads) {
    for (const PeerId& peer : load.waiting_on) {
      const PeerAddress at = PeerAddress::Of(peer);
      auto death = deaths_.find({at.engine, at.incarnation});
      if (death == deaths_.end()) continue;
      const bool lane = death->second.lanes.count({d, dr}) != 0;
      const Duration slack = params_.timer_late_max * 2 + params_.net_delay_max * 2 +
                             params_.write_time_max + Duration::Milliseconds(3);
      const Duration bound =
          lane ? slack : params_.timings.peer_dead_after + params_.timings.heartbeat * 2 + slack;
      const Instant since = std::max(death->second.at, load.started);
      if (now_ > since + bound) {
        Violation("a load of transfer " + load.transfer.ToString() + " on D " +
                  std::to_string(d) + "/" + std::to_string(dr) + " still waits on P " +
                  std::to_string(at.engine) + "/" + std::to_string(at.rank) + " incarnation " +
                  std::to_string(at.incarnation) + ", dead since t=" +
                  std::to_string(death->second.at.seconds()) + " s" +
                  (lane ? " (its lane closed)" : ""));
        return;
      }
    }
  }
}

void Simulator::BeginWrite(uint32_t e, uint32_t r, StartWrite w) {
  if (now_ >= w.deadline) {
    Violation("write for transfer " + w.transfer.ToString() +
              " started at or after its pull's deadline");
    return;
  }
  const uint32_t slot = TakeSlot(writes_, free_writes_);
  Write& wr = writes_[slot];
  wr.used = true;
  wr.p_engine = e;
  wr.p_rank = r;
  wr.p_incarnation = nodes_[e].incarnation;
  wr.d_engine = PeerAddress::Of(w.peer).engine;
  wr.d_rank = PeerAddress::Of(w.peer).rank;
  wr.d_incarnation = w.peer.generation;
  wr.fail = faults_on() && prng_.Chance(params_.write_fail_pm, 1000);
  wr.garbage = wr.fail && prng_.Chance(params_.write_partial_pm, 1000);
  wr.w = std::move(w);
  const Duration d = Duration::Nanoseconds(
      static_cast<int64_t>(prng_.Uniform(params_.write_time_max.ns()) + 1));
  queue_.Push(Event{now_ + d, 0, EventKind::kWriteDone, slot});
}

void Simulator::FinishWrite(uint32_t slot) {
  Write wr = std::move(writes_[slot]);
  writes_[slot] = Write{};
  free_writes_.push_back(slot);
  KV_CHECK(wr.used);
  Node& p = nodes_[wr.p_engine];
  if (p.incarnation != wr.p_incarnation || !p.alive) return;  // the writer's process died
  const TransferId t = wr.w.transfer;
  for (const BlockId& b : wr.w.src) {
    if (!p.memory->Live(b)) {
      Violation("P block " + b.ToString() + " of transfer " + t.ToString() +
                " was freed or reused while a write read it");
      return;
    }
  }
  Node& d = nodes_[wr.d_engine];
  bool reachable = d.incarnation == wr.d_incarnation && d.alive &&
                   !Partitioned(wr.p_engine, wr.d_engine);
  if (reachable && !Granted(d.ranks[wr.d_rank]->write_grants(), t, wr.w.dst)) {
    Hit(Mark::kWriteRefusedNoGrant);  // tcp's receiver refuses it: nothing lands
    reachable = false;
  }
  if (reachable && (!wr.fail || wr.garbage) &&
      !LandKv(wr.p_engine, wr.p_rank, wr.d_engine, wr.d_rank, t, wr.w.src, wr.w.dst, wr.garbage,
              "write")) {
    return;
  }
  p.ranks[wr.p_rank]->OnWriteDone(wr.w.write, reachable && !wr.fail, now_);
  DrainRank(wr.p_engine, wr.p_rank);
}

bool Simulator::LandKv(uint32_t pe, uint32_t pr, uint32_t de, uint32_t dr, TransferId t,
                       const std::vector<BlockId>& src, const std::vector<BlockId>& dst,
                       bool garbage, const char* what) {
  Node& p = nodes_[pe];
  Node& d = nodes_[de];
  for (const BlockId& b : src) {
    if (!p.memory->Live(b)) {
      Violation(std::string("P block ") + b.ToString() + " of transfer " + t.ToString() +
                " was freed or reused while a " + what + " read it");
      return false;
    }
  }
  // P rank pr holds the head groups it shares with D rank dr.
  const uint32_t G = engine::kHeadGroups;
  const uint32_t p_lo = pr * G / p.tp, p_hi = (pr + 1) * G / p.tp;
  const uint32_t d_lo = dr * G / d.tp, d_hi = (dr + 1) * G / d.tp;
  const uint32_t lo = std::max(p_lo, d_lo), hi = std::min(p_hi, d_hi);
  KV_CHECK_LT(lo, hi);
  KV_CHECK_EQ(src.size(), dst.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    if (!d.memory->OwnedBy(dst[i], t)) {
      Violation(std::string("a ") + what + " of transfer " + t.ToString() +
                " landed in D block " + dst[i].ToString() + ", which that transfer does not own");
      return false;
    }
    for (uint32_t g = lo; g < hi; ++g) {
      d.memory->At(dst[i], g) = garbage ? prng_.Next64() : p.memory->At(src[i], g);
    }
  }
  return true;
}

// --- read mode: D copies out of P's memory ----------------------------------

void Simulator::BeginRead(uint32_t e, uint32_t r, StartRead read) {
  if (now_ >= read.deadline) {
    Violation("read for transfer " + read.transfer.ToString() +
              " started at or after its lease deadline");
    return;
  }
  // D's lease view (the deadline plus the read margin) is a lower bound of
  // P's expiry (lease_table.h): the P rank read from must hold a lease for
  // the transfer that runs at least that long — checked when the read
  // starts, not only if P happens to free the blocks before it lands. (A
  // dead P incarnation's lease died with it; that read fails unlanded.)
  const uint32_t pe = PeerAddress::Of(read.peer).engine;
  const uint32_t pr = PeerAddress::Of(read.peer).rank;
  if (nodes_[pe].incarnation == read.peer.generation) {
    const Instant view = read.deadline + params_.timings.read_margin;
    std::optional<Instant> until;
    for (const LeaseView& v : nodes_[pe].ranks[pr]->connector().lease_table()->Leases()) {
      if (v.transfer == read.transfer) until = v.until;
    }
    if (!until || view > *until) {
      char what[96];
      if (until) {
        std::snprintf(what, sizeof what, "ends at %.6f s, after P's lease (%.6f s)",
                      view.seconds(), until->seconds());
      } else {
        std::snprintf(what, sizeof what, "ends at %.6f s, but P holds no lease for it",
                      view.seconds());
      }
      Violation("read for transfer " + read.transfer.ToString() + " started: D's lease view " +
                what);
      return;
    }
  }
  const uint32_t slot = TakeSlot(reads_, free_reads_);
  Read& rd = reads_[slot];
  rd.used = true;
  rd.d_engine = e;
  rd.d_rank = r;
  rd.d_incarnation = nodes_[e].incarnation;
  rd.p_engine = PeerAddress::Of(read.peer).engine;
  rd.p_rank = PeerAddress::Of(read.peer).rank;
  rd.p_incarnation = read.peer.generation;
  rd.fail = faults_on() && prng_.Chance(params_.write_fail_pm, 1000);
  rd.garbage = rd.fail && prng_.Chance(params_.write_partial_pm, 1000);
  rd.r = std::move(read);
  const Duration d = Duration::Nanoseconds(
      static_cast<int64_t>(prng_.Uniform(params_.write_time_max.ns()) + 1));
  queue_.Push(Event{now_ + d, 0, EventKind::kReadDone, slot});
}

void Simulator::FinishRead(uint32_t slot) {
  Read rd = std::move(reads_[slot]);
  reads_[slot] = Read{};
  free_reads_.push_back(slot);
  KV_CHECK(rd.used);
  Node& d = nodes_[rd.d_engine];
  if (d.incarnation != rd.d_incarnation || !d.alive) return;  // the reader's process died
  // A dead or cut-off P cannot be read (ucx/tcp fail; a dead P's shm
  // segment is unlinked with it): the read fails without landing.
  Node& p = nodes_[rd.p_engine];
  bool reachable = p.incarnation == rd.p_incarnation && p.alive &&
                   !Partitioned(rd.p_engine, rd.d_engine);
  if (reachable && !Granted(p.ranks[rd.p_rank]->read_grants(), rd.r.transfer, rd.r.src)) {
    Hit(Mark::kWriteRefusedNoGrant);  // P serves reads only inside a lease's grant
    reachable = false;
  }
  if (reachable && (!rd.fail || rd.garbage) &&
      !LandKv(rd.p_engine, rd.p_rank, rd.d_engine, rd.d_rank, rd.r.transfer, rd.r.src, rd.r.dst,
              rd.garbage, "read")) {
    return;
  }
  d.ranks[rd.d_rank]->OnReadDone(rd.r.read, reachable && !rd.fail, now_);
  DrainRank(rd.d_engine, rd.d_rank);
}

}  // namespace kvrelay::sim
