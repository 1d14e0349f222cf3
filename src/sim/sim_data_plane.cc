// sim_data_plane.cc — the simulator's data plane: writes (push) and reads
// (read mode) that land after random delays, fail, or land garbage; the
// grants a transport that checks them enforces; and the checks that fire
// the moment a block is freed under a write, or KV lands where it must not.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

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
    // A transport that checks grants (tcp) refuses a write whose grant D
    // revoked (FinishWrite): D may free its blocks before it ends — a P
    // declared gone for its silence may be alive behind a partition. One
    // that checks none (shm, ucx) would land it: there, D must not free.
    if (params_.grants_checked &&
        !Granted(nodes_[engine].ranks[w.d_rank]->write_grants(), w.w.transfer, w.w.dst)) {
      Hit(Mark::kFreedUnderRevokedWrite);
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

Duration Simulator::StartCopy(Copy* c, PeerAddress p, PeerAddress d) {
  c->used = true;
  c->p_engine = p.engine;
  c->p_rank = p.rank;
  c->p_incarnation = p.incarnation;
  c->d_engine = d.engine;
  c->d_rank = d.rank;
  c->d_incarnation = d.incarnation;
  c->fail = faults_on() && prng_.Chance(params_.write_fail_pm, 1000);
  c->garbage = c->fail && prng_.Chance(params_.write_partial_pm, 1000);
  return Duration::Nanoseconds(
      static_cast<int64_t>(prng_.Uniform(params_.write_time_max.ns()) + 1));
}

void Simulator::BeginWrite(uint32_t e, uint32_t r, StartWrite w) {
  if (now_ >= w.deadline) {
    Violation("write for transfer " + w.transfer.ToString() +
              " started at or after its pull's deadline");
    return;
  }
  const uint32_t slot = TakeSlot(writes_, free_writes_);
  Write& wr = writes_[slot];
  const Duration d =
      StartCopy(&wr, PeerAddress{e, r, nodes_[e].incarnation}, PeerAddress::Of(w.peer));
  wr.w = std::move(w);
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
  if (params_.grants_checked && reachable &&
      !Granted(d.ranks[wr.d_rank]->write_grants(), t, wr.w.dst)) {
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
  const Duration d =
      StartCopy(&rd, PeerAddress::Of(read.peer), PeerAddress{e, r, nodes_[e].incarnation});
  rd.r = std::move(read);
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
  if (params_.grants_checked && reachable &&
      !Granted(p.ranks[rd.p_rank]->read_grants(), rd.r.transfer, rd.r.src)) {
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
