// connector_test.cc — tests of the whole connector: ConnectorScheduler (one
// per engine) plus RankConnector (one per rank), P and D wired together by
// an in-memory channel.
//
// The Cluster harness models one P engine (tp = p_tp) and one D engine
// (tp = d_tp). Each engine has one BlockPool shared by all its ranks (as in
// vLLM: the same block ids on every rank). Each rank has a distinct PeerId
// (P ranks 0..p_tp-1, D ranks 100..100+d_tp-1, generation 1). A step is:
// BuildMetadata → ApplyMetadata on every rank of both engines; drain every
// rank's actions (OutMessage → queued for delivery, StartWrite → completed at
// once or kept outstanding); GetFinished → OnRankReport → the engine acts on
// EngineFinished (frees blocks, records load completions).
//
// The harness checks, on the fly and at the end:
//   * every (pull, transfer) item gets at most one answer, never while its
//     own write is in flight, and (at quiescence) exactly one;
//   * a write reads only live P blocks owned by its transfer, and lands only
//     in live D blocks owned by its transfer (memory is tagged);
//   * a load reported ok had every block written by every P rank the D rank
//     needs (no decode on partial KV);
//   * sending_done / recving_done / released surface exactly once per
//     request and only in the state that expects them; P's blocks are freed
//     exactly once (a double Unref would KV_CHECK-crash; the harness refuses
//     it and records an error instead);
//   * CheckInvariants() of every table, scheduler and pool after every step,
//     and the pools' referenced count equals what the engine models hold.
#include "core/connector_scheduler.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "base/prng.h"
#include "base/status.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/block_pool.h"
#include "core/connector_metadata.h"
#include "core/load_table.h"
#include "core/messages.h"
#include "core/rank_connector.h"
#include "core/request_id.h"
#include "core/send_table.h"
#include "core/tp_mapping.h"
#include "core/transfer_result.h"

namespace kvrelay {

inline void PrintTo(TransferResult r, std::ostream* os) {
  *os << TransferResultName(r);
}
inline void PrintTo(StatusCode c, std::ostream* os) { *os << StatusCodeName(c); }

namespace {

constexpr Duration kTimeout = Duration::Seconds(10);  // abort_timeout
constexpr Duration kGrace = Duration::Seconds(2);     // giveup_grace
// Property mode: no message waits longer than this for delivery and no write
// takes longer than this (well under giveup_grace / 2, so a write always
// lands before D could give up on it).
constexpr Duration kMaxLag = Duration::Milliseconds(500);
constexpr uint32_t kPEngine = 0;
constexpr uint32_t kDEngine = 1;
constexpr uint32_t kDPeerBase = 100;

Instant At(Duration d) { return Instant::Epoch() + d; }
TransferId Tid(uint64_t n) { return TransferId{0xC0FFEEULL, n}; }
// P and D fingerprint the same prompt alike.
uint64_t PromptHash(TransferId t) { return t.lo * 0x9E3779B97F4A7C15ULL + 1; }
PeerId PPeer(uint32_t r) { return PeerId{r, 1}; }
PeerId DPeer(uint32_t r) { return PeerId{kDPeerBase + r, 1}; }

enum class PState { kRunning, kHeld, kDone };
enum class DState { kAwaitingAlloc, kLoading, kReleasing, kDecoding, kDone };

const char* Name(PState s) {
  switch (s) {
    case PState::kRunning: return "RUNNING";
    case PState::kHeld: return "HELD";
    case PState::kDone: return "DONE";
  }
  return "?";
}
const char* Name(DState s) {
  switch (s) {
    case DState::kAwaitingAlloc: return "AWAITING_ALLOC";
    case DState::kLoading: return "LOADING";
    case DState::kReleasing: return "RELEASING";
    case DState::kDecoding: return "DECODING";
    case DState::kDone: return "DONE";
  }
  return "?";
}

// P's engine model of one request.
struct PReq {
  RequestId id;
  TransferId transfer;
  std::vector<BlockId> blocks;
  PState state = PState::kDone;
  Status admission;
  bool admitted = false;
  int sending_done = 0;
  std::vector<int> rank_reports;  // finished_sending per P rank
};

// D's engine model of one request.
struct DReq {
  RequestId id;
  TransferId transfer;
  std::vector<BlockId> blocks;
  DState state = DState::kDone;
  Status admission;
  int completions = 0;  // recving_done surfaced
  int released = 0;     // released surfaced
  std::optional<LoadOutcome> outcome;
  std::vector<int> rank_recving;   // finished_recving per D rank
  std::vector<int> rank_released;  // released per D rank
};

struct ClusterOptions {
  uint32_t p_tp = 1;
  uint32_t d_tp = 1;
  uint32_t num_workers = 4;
  uint32_t blocks_per_request = 3;
  uint32_t pool_capacity = 64;
};

struct HeldMessage {
  PeerId from;
  PeerId to;
  PeerMessage msg;
  Instant born;
};

struct HeldWrite {
  uint32_t p_rank;
  StartWrite w;
  Instant born;
};

// One (pull, transfer) item: (D peer index, P rank, pull_seq, transfer).
using ItemKey = std::tuple<uint32_t, uint32_t, uint64_t, TransferId>;
struct ItemRecord {
  std::vector<BlockId> dst;
  bool delivered = false;
  bool writing = false;
  int answers = 0;
  TransferResult last = TransferResult::kOk;
};

std::string Str(TransferId t) { return t.ToString().substr(24); }

struct Cluster {
  explicit Cluster(const ClusterOptions& o)
      : opt(o),
        p_sched(ConnectorSchedulerOptions{ConnectorRole::kProducer, o.p_tp, kPEngine}),
        d_sched(ConnectorSchedulerOptions{ConnectorRole::kConsumer, o.d_tp, kDEngine}),
        p_pool(o.pool_capacity),
        d_pool(o.pool_capacity) {
    SendTableOptions send;
    send.abort_timeout = kTimeout;
    send.giveup_grace = kGrace;
    send.num_workers = o.num_workers;
    LoadTableOptions load;
    load.abort_timeout = kTimeout;
    load.giveup_grace = kGrace;
    for (uint32_t q = 0; q < o.p_tp; ++q) {
      RankConnectorOptions ro;
      ro.role = ConnectorRole::kProducer;
      ro.rank = q;
      ro.tp = o.p_tp;
      ro.send = send;
      ro.load = load;
      p_ranks.push_back(std::make_unique<RankConnector>(ro));
    }
    for (uint32_t r = 0; r < o.d_tp; ++r) {
      RankConnectorOptions ro;
      ro.role = ConnectorRole::kConsumer;
      ro.rank = r;
      ro.tp = o.d_tp;
      ro.send = send;
      ro.load = load;
      d_ranks.push_back(std::make_unique<RankConnector>(ro));
      for (uint32_t q = 0; q < o.p_tp; ++q) {
        d_ranks.back()->SetPeer(kPEngine, q, PPeer(q), Instant::Epoch());
      }
    }
    p_owner.assign(o.pool_capacity, TransferId{});
    d_owner.assign(o.pool_capacity, TransferId{});
    p_pos.assign(o.pool_capacity, 0);
    written.assign(o.d_tp, std::vector<std::map<uint32_t, uint32_t>>(o.pool_capacity));
  }

  // ---- knobs ----
  bool auto_deliver = true;   // deliver every message as soon as it is sent
  bool auto_write = true;     // complete every write as soon as it starts
  bool write_ok = true;       // result of auto-completed writes
  bool bounded_lag = false;   // AdvanceTo forces messages/writes after kMaxLag

  ClusterOptions opt;
  Instant now = Instant::Epoch();
  std::vector<std::string> errors;

  ConnectorScheduler p_sched;
  ConnectorScheduler d_sched;
  std::vector<std::unique_ptr<RankConnector>> p_ranks;
  std::vector<std::unique_ptr<RankConnector>> d_ranks;
  BlockPool p_pool;
  BlockPool d_pool;
  std::vector<TransferId> p_owner;  // P block index → transfer whose KV it holds
  std::vector<uint32_t> p_pos;      // P block index → its position in the prompt
  std::vector<TransferId> d_owner;  // D block index → transfer it was allocated for
  // written[d_rank][block index][P rank] = prompt position of the P block
  // whose (ok) write of the current owner landed there.
  std::vector<std::vector<std::map<uint32_t, uint32_t>>> written;

  std::vector<PReq> preqs;
  std::vector<DReq> dreqs;
  std::deque<HeldMessage> msgs;
  std::vector<HeldWrite> writes;
  std::map<ItemKey, ItemRecord> items;

  void Fail(const std::string& e) { errors.push_back(e); }

  // ---- engine-level operations ------------------------------------------

  // A client request: admitted on P (remote decode) and/or D (remote
  // prefill). P allocates its prompt blocks at admission.
  int NewRequest(TransferId t, bool on_p = true, bool on_d = true) {
    const int k = static_cast<int>(preqs.size());
    PReq p;
    p.id = RequestId{static_cast<uint32_t>(k), 1};
    p.transfer = t;
    p.rank_reports.assign(opt.p_tp, 0);
    preqs.push_back(std::move(p));
    DReq d;
    d.id = RequestId{static_cast<uint32_t>(k), 2};
    d.transfer = t;
    d.rank_recving.assign(opt.d_tp, 0);
    d.rank_released.assign(opt.d_tp, 0);
    dreqs.push_back(std::move(d));
    if (on_p) AdmitP(k);
    if (on_d) {
      KvTransferParams params;
      params.transfer = t;
      params.do_remote_prefill = true;
      params.remote_engine = kPEngine;
      params.remote_tp = opt.p_tp;
      params.prompt_hash = PromptHash(t);
      DReq& dr = dreqs[k];
      dr.admission = d_sched.AdmitRequest(dr.id, params);
      if (dr.admission.ok()) dr.state = DState::kAwaitingAlloc;
    }
    return k;
  }

  // P admits request k (late, if NewRequest did not): the router reached D
  // first, so D's pull may reach P before P's claim.
  void AdmitP(int k) {
    PReq& p = preqs[k];
    if (p.admitted) return;
    p.admitted = true;
    for (uint32_t i = 0; i < opt.blocks_per_request; ++i) {
      Result<BlockId> b = p_pool.Allocate();
      if (!b.ok()) {
        Fail("P pool exhausted");
        break;
      }
      p_owner[b->index] = p.transfer;
      p_pos[b->index] = i;
      p.blocks.push_back(*b);
    }
    KvTransferParams params;
    params.transfer = p.transfer;
    params.do_remote_decode = true;
    params.remote_tp = opt.d_tp;
    params.prompt_hash = PromptHash(p.transfer);
    p.admission = p_sched.AdmitRequest(p.id, params);
    p.state = PState::kRunning;
    if (!p.admission.ok()) FreeP(k);  // a plain request that failed admission
  }

  // P's prefill finished. Returns RequestFinished's delay_free.
  bool FinishPrefill(int k, uint32_t first_token = kNoFirstToken) {
    PReq& p = preqs[k];
    if (p.state != PState::kRunning) {
      Fail("FinishPrefill of a request not running");
      return false;
    }
    const bool keep = p_sched.RequestFinished(p.id, p.blocks, false, 0, first_token);
    if (keep) {
      p.state = PState::kHeld;
    } else {
      FreeP(k);
    }
    return keep;
  }

  // P aborts the request: while running, or while its KV is held.
  void AbortP(int k) {
    PReq& p = preqs[k];
    if (p.state == PState::kRunning) {
      if (p_sched.RequestFinished(p.id, p.blocks, true)) {
        Fail("RequestFinished(aborted) of a running P request kept its blocks");
        p.state = PState::kHeld;
        return;
      }
      FreeP(k);
    } else if (p.state == PState::kHeld) {
      p_sched.AbortHeld(p.id);
    }
  }

  // D allocates destination blocks; the load starts next step.
  // `n` blocks (default: the whole prompt); fewer means D holds a prefix
  // already and loads the tail.
  bool AllocateD(int k, uint32_t n = 0) {
    if (n == 0) n = opt.blocks_per_request;
    DReq& d = dreqs[k];
    if (d.state != DState::kAwaitingAlloc) return false;
    if (!d_sched.RemotePrefill(d.id)) Fail("RemotePrefill false while awaiting alloc");
    if (d_pool.num_free() < n) {
      Fail("D pool exhausted");
      return false;
    }
    for (uint32_t i = 0; i < n; ++i) {
      Result<BlockId> b = d_pool.Allocate();
      d_owner[b->index] = d.transfer;
      for (auto& rank_written : written) rank_written[b->index].clear();
      d.blocks.push_back(*b);
    }
    d.state = DState::kLoading;
    d_sched.OnBlocksAllocated(d.id, d.blocks);
    return true;
  }

  // D's request ends by abort. Returns RequestFinished's delay_free, or
  // nullopt if the request had already ended.
  std::optional<bool> AbortD(int k) {
    DReq& d = dreqs[k];
    switch (d.state) {
      case DState::kAwaitingAlloc: {
        const bool keep = d_sched.RequestFinished(d.id, std::span<const BlockId>{}, true);
        if (keep) Fail("RequestFinished before alloc kept blocks");
        d.state = DState::kDone;
        return keep;
      }
      case DState::kLoading: {
        const bool keep = d_sched.RequestFinished(d.id, d.blocks, true);
        if (keep) {
          d.state = DState::kReleasing;
        } else {
          Fail("RequestFinished of a loading D request returned false");
          FreeD(k);
        }
        return keep;
      }
      case DState::kDecoding: {
        const bool keep = d_sched.RequestFinished(d.id, d.blocks, true);
        if (keep) Fail("RequestFinished of a decoding D request kept blocks");
        FreeD(k);
        return keep;
      }
      case DState::kReleasing:
      case DState::kDone:
        break;
    }
    return std::nullopt;
  }

  // D's request decoded (or recomputed) to the end.
  void FinishD(int k) {
    DReq& d = dreqs[k];
    if (d.state != DState::kDecoding) {
      Fail("FinishD of a request not decoding");
      return;
    }
    if (d_sched.RequestFinished(d.id, d.blocks, false)) {
      Fail("RequestFinished of a finished D request kept blocks");
    }
    FreeD(k);
  }

  void FreeP(int k) {
    PReq& p = preqs[k];
    for (BlockId b : p.blocks) {
      if (!p_pool.IsLive(b)) {
        Fail("P block " + b.ToString() + " freed twice");  // would KV_CHECK
        continue;
      }
      p_owner[b.index] = TransferId{};
      p_pool.Unref(b);
    }
    p.blocks.clear();
    p.state = PState::kDone;
  }

  void FreeD(int k) {
    DReq& d = dreqs[k];
    for (BlockId b : d.blocks) {
      if (!d_pool.IsLive(b)) {
        Fail("D block " + b.ToString() + " freed twice");
        continue;
      }
      d_owner[b.index] = TransferId{};
      d_pool.Unref(b);
    }
    d.blocks.clear();
    d.state = DState::kDone;
  }

  // ---- the step ------------------------------------------------------------

  void ApplyMetadata() {
    const ConnectorMetadata pm = p_sched.BuildMetadata();
    for (auto& r : p_ranks) r->ApplyMetadata(pm, now);
    const ConnectorMetadata dm = d_sched.BuildMetadata();
    for (auto& r : d_ranks) r->ApplyMetadata(dm, now);
  }

  void Step() {
    ApplyMetadata();
    Drain();
    Collect();
    CheckAll();
  }

  void Drain() {
    for (int guard = 0; guard < 100000; ++guard) {
      bool progress = false;
      for (uint32_t q = 0; q < p_ranks.size(); ++q) {
        while (auto a = p_ranks[q]->PollAction()) {
          progress = true;
          HandlePAction(q, std::move(*a));
        }
      }
      for (uint32_t r = 0; r < d_ranks.size(); ++r) {
        while (auto a = d_ranks[r]->PollAction()) {
          progress = true;
          HandleDAction(r, std::move(*a));
        }
      }
      if (auto_deliver) {
        while (!msgs.empty()) {
          HeldMessage m = std::move(msgs.front());
          msgs.pop_front();
          Deliver(m);
          progress = true;
        }
      }
      if (!progress) return;
    }
    Fail("Drain did not settle");
  }

  void Collect() {
    for (uint32_t q = 0; q < p_ranks.size(); ++q) CollectRank(true, q);
    for (uint32_t r = 0; r < d_ranks.size(); ++r) CollectRank(false, r);
  }

  // GetFinished of one rank → OnRankReport → the engine acts.
  EngineFinished CollectRank(bool producer, uint32_t rank) {
    RankConnector& rc = producer ? *p_ranks[rank] : *d_ranks[rank];
    const RankReport report = rc.GetFinished();
    if (report.empty()) return EngineFinished{};
    if (producer) {
      if (!report.finished_recving.empty() || !report.released.empty()) {
        Fail("P rank reported loads");
      }
      for (const TransferId& t : report.finished_sending) {
        const int k = PByTransfer(t);
        if (k < 0) {
          Fail("P rank reported unknown transfer " + Str(t));
          continue;
        }
        if (++preqs[k].rank_reports[rank] > 1) {
          Fail("P rank " + std::to_string(rank) + " reported " + Str(t) + " twice");
        }
      }
      EngineFinished f = p_sched.OnRankReport(rank, report);
      HandleP(f);
      return f;
    }
    if (!report.finished_sending.empty()) Fail("D rank reported sends");
    for (const LoadDone& done : report.finished_recving) {
      const int k = DIndex(done.request);
      if (k < 0) {
        Fail("D rank reported unknown request");
        continue;
      }
      if (++dreqs[k].rank_recving[rank] > 1) Fail("D rank reported a load twice");
    }
    for (const RequestId& req : report.released) {
      const int k = DIndex(req);
      if (k < 0) {
        Fail("D rank released unknown request");
        continue;
      }
      if (++dreqs[k].rank_released[rank] > 1) Fail("D rank released twice");
    }
    EngineFinished f = d_sched.OnRankReport(rank, report);
    HandleD(f);
    return f;
  }

  void HandleP(const EngineFinished& f) {
    if (!f.recving_done.empty() || !f.released.empty()) Fail("P engine got loads");
    for (const RequestId& req : f.sending_done) {
      const int k = PIndex(req);
      if (k < 0) {
        Fail("sending_done for unknown request");
        continue;
      }
      PReq& p = preqs[k];
      if (++p.sending_done > 1) Fail("sending_done twice for " + Str(p.transfer));
      if (p.state != PState::kHeld) {
        Fail(std::string("sending_done for a request in state ") + Name(p.state));
        continue;
      }
      for (int n : p.rank_reports) {
        if (n != 1) Fail("sending_done before every P rank reported");
      }
      FreeP(k);
    }
  }

  void HandleD(const EngineFinished& f) {
    if (!f.sending_done.empty()) Fail("D engine got sends");
    for (const LoadOutcome& o : f.recving_done) {
      const int k = DIndex(o.request);
      if (k < 0) {
        Fail("recving_done for unknown request");
        continue;
      }
      DReq& d = dreqs[k];
      if (++d.completions > 1) Fail("recving_done twice for " + Str(d.transfer));
      if (d.state != DState::kLoading) {
        Fail(std::string("recving_done for a request in state ") + Name(d.state));
        continue;
      }
      d.outcome = o;
      if (o.ok && o.cut_short) {
        Fail("load of " + Str(d.transfer) + " cut short but reported ok");
      }
      if (o.ok) VerifyLanded(k);
      d.state = DState::kDecoding;  // decodes (ok) or recomputes (failed)
    }
    for (const RequestId& req : f.released) {
      const int k = DIndex(req);
      if (k < 0) {
        Fail("released for unknown request");
        continue;
      }
      DReq& d = dreqs[k];
      if (++d.released > 1) Fail("released twice for " + Str(d.transfer));
      if (d.state != DState::kReleasing) {
        Fail(std::string("released for a request in state ") + Name(d.state));
        continue;
      }
      FreeD(k);
    }
  }

  // A load reported ok: every block of every D rank holds, from every P
  // rank that D rank needs, the KV of the right prompt position (D's n
  // blocks are the prompt's last n).
  void VerifyLanded(int k) {
    const DReq& d = dreqs[k];
    const size_t n = d.blocks.size();
    for (uint32_t r = 0; r < opt.d_tp; ++r) {
      for (uint32_t q : ProducerRanksFor(r, opt.d_tp, opt.p_tp)) {
        for (size_t j = 0; j < n; ++j) {
          const BlockId b = d.blocks[j];
          auto it = written[r][b.index].find(q);
          if (it == written[r][b.index].end()) {
            Fail("load of " + Str(d.transfer) + " reported ok but P rank " +
                 std::to_string(q) + " never wrote block " + b.ToString() +
                 " of D rank " + std::to_string(r));
          } else if (it->second != opt.blocks_per_request - n + j) {
            Fail("load of " + Str(d.transfer) + ": D block " + std::to_string(j) +
                 " holds prompt position " + std::to_string(it->second));
          }
        }
      }
    }
  }

  void HandlePAction(uint32_t q, RankAction&& a) {
    if (auto* m = std::get_if<OutMessage>(&a)) {
      const auto* ans = std::get_if<AnswerMsg>(&m->msg);
      if (ans == nullptr) {
        Fail("P rank sent a pull");
        return;
      }
      auto it = items.find(ItemKey{m->to.index, q, ans->pull_seq, ans->transfer});
      if (it == items.end()) {
        Fail("answer for an unknown (pull, transfer)");
      } else {
        if (!it->second.delivered) Fail("answer for an undelivered pull");
        if (it->second.answers > 0) Fail("(pull, transfer) answered twice");
        if (it->second.writing) Fail("answered while its write is in flight");
        ++it->second.answers;
        it->second.last = ans->result;
      }
      msgs.push_back(HeldMessage{PPeer(q), m->to, std::move(m->msg), now});
      return;
    }
    StartWrite& w = std::get<StartWrite>(a);
    auto it = items.find(ItemKey{w.peer.index, q, w.pull_seq, w.transfer});
    if (it == items.end()) {
      Fail("write for an unknown (pull, transfer)");
      return;
    }
    ItemRecord& rec = it->second;
    if (rec.dst.empty()) Fail("write for a release");
    if (rec.answers > 0) Fail("write for an answered item");
    if (rec.writing) Fail("two writes for one item");
    if (rec.dst != w.dst) Fail("write dst differs from the pull's");
    if (w.src.size() != w.dst.size()) Fail("write src/dst sizes differ");
    if (!(now < w.deadline)) Fail("write started at or after its deadline");
    for (BlockId b : w.src) {
      if (!p_pool.IsLive(b) || p_owner[b.index] != w.transfer) {
        Fail("write of " + Str(w.transfer) + " starts on a P block it does not own");
      }
    }
    rec.writing = true;
    if (auto_write) {
      rec.writing = false;
      Land(q, w, write_ok);
      p_ranks[q]->OnWriteDone(w.write, write_ok, now);
    } else {
      writes.push_back(HeldWrite{q, std::move(w), now});
    }
  }

  void HandleDAction(uint32_t r, RankAction&& a) {
    auto* m = std::get_if<OutMessage>(&a);
    if (m == nullptr) {
      Fail("D rank started a write");
      return;
    }
    const auto* pull = std::get_if<PullMsg>(&m->msg);
    if (pull == nullptr) {
      Fail("D rank sent an answer");
      return;
    }
    const uint32_t q = m->to.index;
    if (q >= opt.p_tp || m->to.generation != 1) {
      Fail("pull to an unknown peer");
      return;
    }
    for (const PullItem& item : pull->items) {
      const auto needed = ProducerRanksFor(r, opt.d_tp, opt.p_tp);
      if (std::find(needed.begin(), needed.end(), q) == needed.end()) {
        Fail("D rank pulled from a P rank it does not need");
      }
      ItemKey key{DPeer(r).index, q, pull->pull_seq, item.transfer};
      if (items.count(key) != 0) Fail("pull_seq reused");
      items[key] = ItemRecord{item.dst, false, false, 0, TransferResult::kOk};
    }
    msgs.push_back(HeldMessage{DPeer(r), m->to, std::move(m->msg), now});
  }

  void Deliver(const HeldMessage& m) {
    if (m.to.index >= kDPeerBase) {
      d_ranks[m.to.index - kDPeerBase]->OnMessage(m.from, m.msg, now);
      return;
    }
    const auto& pull = std::get<PullMsg>(m.msg);
    for (const PullItem& item : pull.items) {
      auto it = items.find(ItemKey{m.from.index, m.to.index, pull.pull_seq, item.transfer});
      if (it != items.end()) it->second.delivered = true;
    }
    p_ranks[m.to.index]->OnMessage(m.from, m.msg, now);
  }

  // Writes land in D's memory (tagged) when they complete.
  void Land(uint32_t q, const StartWrite& w, bool ok) {
    for (BlockId b : w.src) {
      if (!p_pool.IsLive(b) || p_owner[b.index] != w.transfer) {
        Fail("write of " + Str(w.transfer) + " read a P block freed while writing");
      }
    }
    if (w.peer.index < kDPeerBase || w.peer.index - kDPeerBase >= opt.d_tp) {
      Fail("write to an unknown D peer");
      return;
    }
    const uint32_t r = w.peer.index - kDPeerBase;
    for (size_t i = 0; i < w.dst.size(); ++i) {
      const BlockId b = w.dst[i];
      if (!d_pool.IsLive(b) || d_owner[b.index] != w.transfer) {
        Fail("write of " + Str(w.transfer) + " landed in D block " + b.ToString() +
             " it does not own");
      } else if (ok && i < w.src.size()) {
        written[r][b.index][q] = p_pos[w.src[i].index];
      }
    }
  }

  // ---- channel and writer controls ---------------------------------------

  // Delivers msgs[i] (callers keep per-path FIFO order).
  void DeliverAt(size_t i, bool drain = true) {
    HeldMessage m = std::move(msgs[i]);
    msgs.erase(msgs.begin() + static_cast<std::ptrdiff_t>(i));
    Deliver(m);
    if (drain) Drain();
  }

  // Delivers the oldest message on the path from → to. False if none.
  bool DeliverPath(PeerId from, PeerId to, bool drain = true) {
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (msgs[i].from == from && msgs[i].to == to) {
        DeliverAt(i, drain);
        return true;
      }
    }
    return false;
  }

  // Delivers everything, including what the deliveries cause.
  void DeliverAll() {
    for (int guard = 0; guard < 10000; ++guard) {
      Drain();
      if (msgs.empty()) return;
      while (!msgs.empty()) DeliverAt(0, false);
    }
    Fail("DeliverAll did not settle");
  }

  void CompleteWrite(size_t i, bool ok, bool drain = true) {
    HeldWrite hw = std::move(writes[i]);
    writes.erase(writes.begin() + static_cast<std::ptrdiff_t>(i));
    auto it = items.find(ItemKey{hw.w.peer.index, hw.p_rank, hw.w.pull_seq, hw.w.transfer});
    if (it != items.end()) it->second.writing = false;
    Land(hw.p_rank, hw.w, ok);
    p_ranks[hw.p_rank]->OnWriteDone(hw.w.write, ok, now);
    if (drain) Drain();
  }

  void CompleteAllWrites(bool ok) {
    while (!writes.empty()) CompleteWrite(0, ok);
  }

  void FireTimers() {
    for (auto& r : p_ranks) r->OnTimer(now);
    for (auto& r : d_ranks) r->OnTimer(now);
  }

  // Moves time to `target`, firing every timer at its time (and, with
  // bounded_lag, delivering messages and completing writes kMaxLag after
  // they were sent/started), stepping after each.
  void AdvanceTo(Instant target) {
    for (int guard = 0; guard < 100000; ++guard) {
      Instant next = target;
      if (bounded_lag) {
        if (!msgs.empty()) next = std::min(next, msgs.front().born + kMaxLag);
        for (const HeldWrite& w : writes) next = std::min(next, w.born + kMaxLag);
      }
      for (auto& r : p_ranks) {
        if (auto t = r->NextDeadline()) next = std::min(next, *t);
      }
      for (auto& r : d_ranks) {
        if (auto t = r->NextDeadline()) next = std::min(next, *t);
      }
      if (next > now) now = next;
      bool forced = false;
      if (bounded_lag) {
        // Messages are born in queue order, so the due ones are a prefix.
        while (!msgs.empty() && msgs.front().born + kMaxLag <= now) {
          DeliverAt(0, false);
          forced = true;
        }
        for (size_t i = 0; i < writes.size();) {
          if (writes[i].born + kMaxLag <= now) {
            CompleteWrite(i, true, false);
            forced = true;
          } else {
            ++i;
          }
        }
      }
      FireTimers();
      Step();
      if (now >= target && !forced) return;
    }
    Fail("AdvanceTo did not settle");
  }

  // ---- checks -----------------------------------------------------------------

  void CheckAll() {
    for (auto& r : p_ranks) r->CheckInvariants();
    for (auto& r : d_ranks) r->CheckInvariants();
    p_sched.CheckInvariants();
    d_sched.CheckInvariants();
    p_pool.CheckInvariants();
    d_pool.CheckInvariants();
    size_t p_held = 0, d_held = 0;
    for (const PReq& p : preqs) p_held += p.blocks.size();
    for (const DReq& d : dreqs) d_held += d.blocks.size();
    if (p_pool.num_referenced() != p_held) {
      Fail("P pool: " + std::to_string(p_pool.num_referenced()) +
           " referenced, engine holds " + std::to_string(p_held));
    }
    if (d_pool.num_referenced() != d_held) {
      Fail("D pool: " + std::to_string(d_pool.num_referenced()) +
           " referenced, engine holds " + std::to_string(d_held));
    }
    if (p_pool.num_free() + p_pool.num_referenced() + p_pool.num_cached_idle() !=
        p_pool.capacity()) {
      Fail("P pool conservation");
    }
    if (d_pool.num_free() + d_pool.num_referenced() + d_pool.num_cached_idle() !=
        d_pool.capacity()) {
      Fail("D pool conservation");
    }
  }

  // Everything that should be gone once the cluster is quiescent.
  std::vector<std::string> Leftovers() const {
    std::vector<std::string> out = errors;
    if (!msgs.empty()) out.push_back(std::to_string(msgs.size()) + " messages undelivered");
    if (!writes.empty()) out.push_back(std::to_string(writes.size()) + " writes outstanding");
    for (uint32_t q = 0; q < p_ranks.size(); ++q) {
      const SendTable* st = p_ranks[q]->send_table();
      if (st->live_sends() != 0) {
        out.push_back("P rank " + std::to_string(q) + ": " +
                      std::to_string(st->live_sends()) + " live sends");
      }
      if (st->live_pull_items() != 0) out.push_back("P rank: live pull items");
      if (st->writes_in_flight() != 0) out.push_back("P rank: writes in flight");
    }
    for (uint32_t r = 0; r < d_ranks.size(); ++r) {
      if (d_ranks[r]->load_table()->live_loads() != 0) {
        out.push_back("D rank " + std::to_string(r) + ": " +
                      std::to_string(d_ranks[r]->load_table()->live_loads()) +
                      " live loads");
      }
    }
    if (!p_sched.Idle()) out.push_back("P scheduler not idle");
    if (!d_sched.Idle()) out.push_back("D scheduler not idle");
    if (p_pool.num_referenced() != 0) {
      out.push_back("P pool: " + std::to_string(p_pool.num_referenced()) + " referenced");
    }
    if (d_pool.num_referenced() != 0) {
      out.push_back("D pool: " + std::to_string(d_pool.num_referenced()) + " referenced");
    }
    for (const auto& [key, rec] : items) {
      if (rec.answers != 1) {
        out.push_back("(pull " + std::to_string(std::get<2>(key)) + ", " +
                      Str(std::get<3>(key)) + ") answered " +
                      std::to_string(rec.answers) + " times");
      }
    }
    for (const PReq& p : preqs) {
      if (p.state != PState::kDone) {
        out.push_back("P request " + Str(p.transfer) + " in state " + Name(p.state));
      }
      if (p.sending_done > 1) out.push_back("P request freed twice");
    }
    for (const DReq& d : dreqs) {
      if (d.state != DState::kDone) {
        out.push_back("D request " + Str(d.transfer) + " in state " + Name(d.state));
      }
      if (d.completions > 1) out.push_back("D request completed twice");
      if (d.completions + d.released > 1) out.push_back("D request completed and released");
    }
    return out;
  }

  // Debug aid: how much of the lifecycle a run exercised.
  void PrintCoverage() const {
    int ok = 0, failed = 0, cut = 0, released = 0, sent = 0;
    for (const DReq& d : dreqs) {
      if (d.outcome) (d.outcome->ok ? ok : failed)++;
      if (d.outcome && d.outcome->cut_short) ++cut;
      released += d.released;
    }
    for (const PReq& p : preqs) sent += p.sending_done;
    std::ostringstream os;
    os << "reqs=" << preqs.size() << " ok=" << ok << " failed=" << failed
       << " cut=" << cut << " released=" << released << " sent=" << sent;
    for (uint32_t q = 0; q < p_ranks.size(); ++q) {
      const SendTableStats& st = p_ranks[q]->send_table()->stats();
      os << " | P" << q << " ends:";
      for (int r = 0; r < kTransferResultCount; ++r) os << st.ends[r] << ",";
      os << " wfail=" << st.writes_failed << " after_end=" << st.writes_done_after_end
         << " ph=" << st.placeholders << " tomb=" << st.answered_from_tombstone
         << " refused=" << p_ranks[q]->stats().ready_refused;
    }
    std::printf("%s\n", os.str().c_str());
  }

  std::string ErrorsText() const {
    std::ostringstream os;
    for (const std::string& e : errors) os << "  " << e << "\n";
    return os.str();
  }

  std::string Summary() const {
    std::ostringstream os;
    for (const std::string& e : Leftovers()) os << "  " << e << "\n";
    return os.str();
  }

  int PIndex(RequestId r) const {
    if (r.generation != 1 || r.index >= preqs.size()) return -1;
    return static_cast<int>(r.index);
  }
  int DIndex(RequestId r) const {
    if (r.generation != 2 || r.index >= dreqs.size()) return -1;
    return static_cast<int>(r.index);
  }
  // The live (running or held) P request of `t`, else the latest one.
  int PByTransfer(TransferId t) const {
    int last = -1;
    for (size_t k = 0; k < preqs.size(); ++k) {
      if (preqs[k].transfer != t) continue;
      if (preqs[k].state != PState::kDone) return static_cast<int>(k);
      last = static_cast<int>(k);
    }
    return last;
  }

  uint64_t SendEnds(uint32_t q, TransferResult r) const {
    return p_ranks[q]->send_table()->stats().ends[static_cast<int>(r)];
  }
  uint64_t SendEndsTotal(uint32_t q) const {
    uint64_t n = 0;
    for (uint64_t e : p_ranks[q]->send_table()->stats().ends) n += e;
    return n;
  }
};

#define EXPECT_CLEAN(c) EXPECT_TRUE((c).errors.empty()) << (c).ErrorsText()
#define EXPECT_DRAINED(c) EXPECT_TRUE((c).Leftovers().empty()) << (c).Summary()

ClusterOptions Tp(uint32_t p_tp, uint32_t d_tp, uint32_t workers = 4) {
  ClusterOptions o;
  o.p_tp = p_tp;
  o.d_tp = d_tp;
  o.num_workers = workers;
  return o;
}

using TpPair = std::pair<uint32_t, uint32_t>;
std::string TpName(const ::testing::TestParamInfo<TpPair>& info) {
  return "P" + std::to_string(info.param.first) + "_D" + std::to_string(info.param.second);
}

// ===========================================================================
// 1. Happy path, homogeneous and heterogeneous TP.

class ConnectorHappyPath : public ::testing::TestWithParam<TpPair> {};

TEST_P(ConnectorHappyPath, LoadsOnceFreesOnceAndDrains) {
  Cluster c(Tp(GetParam().first, GetParam().second));
  const int k = c.NewRequest(Tid(1));
  ASSERT_TRUE(c.preqs[k].admission.ok());
  ASSERT_TRUE(c.dreqs[k].admission.ok());
  c.Step();
  EXPECT_TRUE(c.d_sched.RemotePrefill(c.dreqs[k].id));
  EXPECT_TRUE(c.FinishPrefill(k)) << "P must keep the blocks for D";
  ASSERT_TRUE(c.AllocateD(k));
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_TRUE(c.dreqs[k].outcome->ok);
  EXPECT_FALSE(c.dreqs[k].outcome->cut_short);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.p_pool.num_referenced(), 0u);
  for (uint32_t q = 0; q < c.opt.p_tp; ++q) {
    EXPECT_EQ(c.SendEnds(q, TransferResult::kOk), 1u) << "P rank " << q;
    EXPECT_EQ(c.SendEndsTotal(q), 1u);
    EXPECT_FALSE(c.p_ranks[q]->send_table()->HasTombstone(Tid(1)))
        << "a fully pulled send leaves no tombstone";
  }
  // Nothing more surfaces later, even past every timeout.
  c.AdvanceTo(c.now + (kTimeout + kGrace) * 2);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// The first token P's engine names at Ready reaches D's engine with the
// load's outcome, through every P rank's answers to every D rank.
TEST_P(ConnectorHappyPath, TheProducersFirstTokenReachesTheConsumer) {
  Cluster c(Tp(GetParam().first, GetParam().second));
  const int k = c.NewRequest(Tid(1));
  c.Step();
  ASSERT_TRUE(c.FinishPrefill(k, 31337));
  ASSERT_TRUE(c.AllocateD(k));
  c.Step();
  EXPECT_CLEAN(c);
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_TRUE(c.dreqs[k].outcome->ok);
  EXPECT_EQ(c.dreqs[k].outcome->first_token, 31337u);
  // Without a token at Ready, none arrives.
  const int k2 = c.NewRequest(Tid(2));
  c.Step();
  ASSERT_TRUE(c.FinishPrefill(k2));
  ASSERT_TRUE(c.AllocateD(k2));
  c.Step();
  ASSERT_TRUE(c.dreqs[k2].outcome.has_value());
  EXPECT_TRUE(c.dreqs[k2].outcome->ok);
  EXPECT_EQ(c.dreqs[k2].outcome->first_token, kNoFirstToken);
  c.FinishD(k);
  c.FinishD(k2);
  c.Step();
  EXPECT_DRAINED(c);
}

INSTANTIATE_TEST_SUITE_P(Tp, ConnectorHappyPath,
                         ::testing::Values(TpPair{1, 1}, TpPair{2, 1}, TpPair{1, 2},
                                           TpPair{2, 2}, TpPair{4, 1}, TpPair{1, 4}),
                         TpName);

// P tp=2 → D tp=1: the D rank pulls from both P ranks into the same blocks;
// the load ends only when both answered, P's blocks are freed only when both
// P ranks are done.
TEST(ConnectorTest, FanInDRankPullsFromEveryPRank) {
  Cluster c(Tp(2, 1));
  c.auto_deliver = false;
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  c.AllocateD(k);
  c.Step();
  ASSERT_EQ(c.msgs.size(), 2u);
  std::set<uint32_t> targets;
  for (const HeldMessage& m : c.msgs) {
    EXPECT_EQ(m.from, DPeer(0));
    targets.insert(m.to.index);
  }
  EXPECT_EQ(targets, (std::set<uint32_t>{0, 1}));

  // P rank 0 serves its pull: its send ends, but P rank 1 still holds.
  ASSERT_TRUE(c.DeliverPath(DPeer(0), PPeer(0)));
  ASSERT_TRUE(c.DeliverPath(PPeer(0), DPeer(0)));  // the answer
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.p_ranks[0]->send_table()->live_sends(), 0u);
  EXPECT_EQ(c.p_ranks[1]->send_table()->live_sends(), 1u);
  EXPECT_EQ(c.preqs[k].sending_done, 0) << "one P rank of two reported";
  EXPECT_EQ(c.p_pool.num_referenced(), 3u);
  EXPECT_EQ(c.dreqs[k].completions, 0) << "one producer of two answered";

  c.DeliverAll();
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_TRUE(c.dreqs[k].outcome->ok);
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// P tp=1 → D tp=2: the P rank needs two pulls before it drops the send.
TEST(ConnectorTest, FanOutPRankNeedsEveryDRankPull) {
  Cluster c(Tp(1, 2));
  c.auto_deliver = false;
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  c.AllocateD(k);
  c.Step();
  ASSERT_EQ(c.msgs.size(), 2u);

  ASSERT_TRUE(c.DeliverPath(DPeer(0), PPeer(0)));
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.p_ranks[0]->send_table()->StateOf(Tid(1)), SendState::kReady)
      << "one of two D ranks pulled";
  EXPECT_EQ(c.preqs[k].sending_done, 0);
  EXPECT_EQ(c.p_pool.num_referenced(), 3u);

  ASSERT_TRUE(c.DeliverPath(DPeer(1), PPeer(0)));
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.p_ranks[0]->send_table()->StateOf(Tid(1)), std::nullopt);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.p_pool.num_referenced(), 0u);
  EXPECT_EQ(c.dreqs[k].completions, 0) << "answers not delivered yet";

  // D rank 0's answer alone does not complete the load.
  ASSERT_TRUE(c.DeliverPath(PPeer(0), DPeer(0)));
  c.Step();
  EXPECT_EQ(c.dreqs[k].completions, 0);
  ASSERT_TRUE(c.DeliverPath(PPeer(0), DPeer(1)));
  c.Step();
  EXPECT_EQ(c.dreqs[k].completions, 1);
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_TRUE(c.dreqs[k].outcome->ok);
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// ===========================================================================
// 2. Exactly-once aggregation across ranks.

TEST(ConnectorTest, EngineSeesRequestOnlyAfterEveryRankReported) {
  Cluster c(Tp(2, 2));
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  c.AllocateD(k);
  // Apply and run everything, but collect the reports rank by rank.
  c.ApplyMetadata();
  c.Drain();
  EXPECT_CLEAN(c);

  EngineFinished p0 = c.CollectRank(true, 0);
  EXPECT_TRUE(p0.sending_done.empty()) << "only P rank 0 reported";
  EXPECT_EQ(c.p_pool.num_referenced(), 3u);
  EngineFinished d0 = c.CollectRank(false, 0);
  EXPECT_TRUE(d0.recving_done.empty()) << "only D rank 0 reported";
  EXPECT_EQ(c.dreqs[k].completions, 0);
  // A second collection of the same ranks reports nothing new.
  EXPECT_TRUE(c.CollectRank(true, 0).sending_done.empty());
  EXPECT_TRUE(c.CollectRank(false, 0).recving_done.empty());

  EngineFinished p1 = c.CollectRank(true, 1);
  ASSERT_EQ(p1.sending_done.size(), 1u);
  EXPECT_EQ(p1.sending_done[0], c.preqs[k].id);
  EngineFinished d1 = c.CollectRank(false, 1);
  ASSERT_EQ(d1.recving_done.size(), 1u);
  EXPECT_EQ(d1.recving_done[0].request, c.dreqs[k].id);
  EXPECT_TRUE(d1.recving_done[0].ok);
  c.CheckAll();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// A D tp=2 load where one rank fails: the engine sees one failed outcome,
// only once both ranks reported.
TEST(ConnectorTest, OneFailedRankFailsTheWholeLoadOnce) {
  Cluster c(Tp(2, 2));
  c.auto_write = false;
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  c.AllocateD(k);
  c.Step();
  ASSERT_EQ(c.writes.size(), 2u);
  const uint32_t fail_rank = c.writes[0].p_rank;
  c.CompleteWrite(0, false);
  c.Step();
  EXPECT_EQ(c.dreqs[k].completions, 0);
  EXPECT_EQ(c.preqs[k].sending_done, 0);
  EXPECT_EQ(c.SendEnds(fail_rank, TransferResult::kWriteFailed), 1u);
  c.CompleteWrite(0, true);
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_FALSE(c.dreqs[k].outcome->ok);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// ===========================================================================
// 3. The vllm-ascend two-path release race: "pulled" vs timeout release.

struct RaceSetup {
  Cluster c{Tp(1, 1)};
  int k = 0;
  Instant ready;
  RaceSetup() {
    c.auto_write = false;
    c.now = At(Duration::Seconds(1));
    k = c.NewRequest(Tid(1));
    c.Step();
    EXPECT_TRUE(c.FinishPrefill(k));
    EXPECT_TRUE(c.AllocateD(k));
    ready = c.now;
    c.Step();  // Ready at `ready`, pull delivered, write outstanding
  }
};

TEST(ConnectorRaceTest, PulledThenExpiry) {
  RaceSetup s;
  Cluster& c = s.c;
  ASSERT_EQ(c.writes.size(), 1u);
  c.now = s.ready + Duration::Seconds(1);
  c.CompleteWrite(0, true);
  c.Step();
  EXPECT_EQ(c.preqs[s.k].sending_done, 1);
  EXPECT_EQ(c.p_pool.num_referenced(), 0u);
  c.now = s.ready + kTimeout;
  c.FireTimers();
  c.Step();
  c.now = s.ready + kTimeout + kGrace + kTimeout;
  c.FireTimers();
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[s.k].sending_done, 1);
  EXPECT_EQ(c.SendEndsTotal(0), 1u);
  EXPECT_EQ(c.SendEnds(0, TransferResult::kExpired), 0u);
  EXPECT_EQ(c.dreqs[s.k].completions, 1);
  ASSERT_TRUE(c.dreqs[s.k].outcome.has_value());
  EXPECT_TRUE(c.dreqs[s.k].outcome->ok);
  c.FinishD(s.k);
  c.Step();
  EXPECT_DRAINED(c);
}

TEST(ConnectorRaceTest, ExpiryWhileWritingThenPulled) {
  RaceSetup s;
  Cluster& c = s.c;
  ASSERT_EQ(c.writes.size(), 1u);
  c.now = s.ready + kTimeout;
  c.FireTimers();
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.p_ranks[0]->send_table()->StateOf(Tid(1)), SendState::kDone);
  EXPECT_EQ(c.preqs[s.k].sending_done, 0) << "the write still reads the blocks";
  EXPECT_EQ(c.p_pool.num_referenced(), 3u);
  c.CompleteWrite(0, true);
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[s.k].sending_done, 1);
  EXPECT_EQ(c.p_pool.num_referenced(), 0u);
  EXPECT_EQ(c.SendEndsTotal(0), 1u);
  EXPECT_EQ(c.dreqs[s.k].completions, 1);
  // Nothing more, later.
  c.AdvanceTo(c.now + (kTimeout + kGrace) * 2);
  EXPECT_EQ(c.preqs[s.k].sending_done, 1);
  EXPECT_EQ(c.dreqs[s.k].completions, 1);
  c.FinishD(s.k);
  c.Step();
  EXPECT_DRAINED(c);
}

TEST(ConnectorRaceTest, ExpiryBeforePullArrivesThenPulled) {
  Cluster c(Tp(1, 1));
  c.auto_deliver = false;
  c.now = At(Duration::Seconds(1));
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  const Instant ready = c.now;
  c.Step();
  c.AllocateD(k);
  c.now = ready + kTimeout - Duration::Milliseconds(1);
  c.Step();  // the pull is in flight
  ASSERT_EQ(c.msgs.size(), 1u);
  c.now = ready + kTimeout;
  c.FireTimers();
  c.Step();
  EXPECT_EQ(c.preqs[k].sending_done, 1) << "expired: P frees at once";
  c.DeliverAll();  // the pull meets the tombstone; D's load fails
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_FALSE(c.dreqs[k].outcome->ok);
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// WriteDone and the expiry at the same instant, in the same step, before
// anything is drained — both orders.
class ConnectorSameInstantRace : public ::testing::TestWithParam<bool> {};

TEST_P(ConnectorSameInstantRace, FreedExactlyOnce) {
  const bool write_first = GetParam();
  RaceSetup s;
  Cluster& c = s.c;
  ASSERT_EQ(c.writes.size(), 1u);
  c.now = s.ready + kTimeout;
  if (write_first) {
    c.CompleteWrite(0, true, /*drain=*/false);
    c.FireTimers();
  } else {
    c.FireTimers();
    c.CompleteWrite(0, true, /*drain=*/false);
  }
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[s.k].sending_done, 1);
  EXPECT_EQ(c.p_pool.num_referenced(), 0u);
  EXPECT_EQ(c.SendEndsTotal(0), 1u);
  EXPECT_EQ(c.SendEnds(0, write_first ? TransferResult::kOk : TransferResult::kExpired), 1u);
  EXPECT_EQ(c.dreqs[s.k].completions, 1);
  c.AdvanceTo(c.now + (kTimeout + kGrace) * 2);
  EXPECT_EQ(c.preqs[s.k].sending_done, 1);
  EXPECT_EQ(c.dreqs[s.k].completions, 1);
  c.FinishD(s.k);
  c.Step();
  EXPECT_DRAINED(c);
}

INSTANTIATE_TEST_SUITE_P(Order, ConnectorSameInstantRace, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("WriteDoneFirst")
                                             : std::string("TimerFirst");
                         });

// Pulled, expiry and D's release all at the same instant, before draining.
TEST(ConnectorRaceTest, PulledExpiryAndReleaseSameInstant) {
  RaceSetup s;
  Cluster& c = s.c;
  ASSERT_EQ(c.writes.size(), 1u);
  c.auto_deliver = false;
  ASSERT_EQ(c.AbortD(s.k), std::optional<bool>(true));
  c.Step();  // the release is sent, not delivered
  ASSERT_EQ(c.msgs.size(), 1u);
  c.now = s.ready + kTimeout;
  c.DeliverAt(0, /*drain=*/false);
  c.FireTimers();
  c.CompleteWrite(0, true, /*drain=*/false);
  c.auto_deliver = true;
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[s.k].sending_done, 1);
  EXPECT_EQ(c.SendEndsTotal(0), 1u);
  EXPECT_EQ(c.dreqs[s.k].completions, 0) << "a released load never completes";
  EXPECT_EQ(c.dreqs[s.k].released, 1);
  EXPECT_DRAINED(c);
}

// ===========================================================================
// 4. D request aborted while its KV is arriving / before allocation.

// P tp=1 → D tp=2 with one sender: D rank 0's pull is being written, D rank
// 1's waits for a sender. The abort releases both; P ends the send at once
// (answering the waiting pull kReleased) but the write keeps P's blocks; D's
// blocks are freed only once every rank's original pull was answered.
TEST(ConnectorAbortTest, DAbortWhileWriteOutstanding) {
  Cluster c(Tp(1, 2, /*workers=*/1));
  c.auto_write = false;
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  c.AllocateD(k);
  c.Step();
  ASSERT_EQ(c.writes.size(), 1u);
  EXPECT_EQ(c.p_ranks[0]->send_table()->queued_for_sender(), 1u);

  ASSERT_EQ(c.AbortD(k), std::optional<bool>(true)) << "delay_free while loading";
  EXPECT_EQ(c.dreqs[k].state, DState::kReleasing);
  c.Step();
  EXPECT_CLEAN(c);
  const SendTable* st = c.p_ranks[0]->send_table();
  EXPECT_EQ(st->StateOf(Tid(1)), SendState::kDone);
  EXPECT_EQ(st->stats().answers[static_cast<int>(TransferResult::kReleased)], 1u)
      << "the waiting pull is answered kReleased at once";
  EXPECT_EQ(c.preqs[k].sending_done, 0) << "the outstanding write keeps P's blocks";
  EXPECT_EQ(c.p_pool.num_referenced(), 3u);
  EXPECT_EQ(c.dreqs[k].released, 0) << "D rank 0's original pull is unanswered";
  EXPECT_EQ(c.d_pool.num_referenced(), 3u);
  EXPECT_EQ(c.dreqs[k].rank_released[1], 1);
  EXPECT_EQ(c.dreqs[k].rank_released[0], 0);

  c.CompleteWrite(0, true);
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.dreqs[k].released, 1);
  EXPECT_EQ(c.dreqs[k].completions, 0) << "a release never reports a completion";
  EXPECT_EQ(c.p_pool.num_referenced(), 0u);
  EXPECT_EQ(c.d_pool.num_referenced(), 0u);
  EXPECT_DRAINED(c);
}

// 1P1D: the only pull is being written when D aborts. P ends the send at
// once (the release is answered, the send is DONE) but keeps its blocks
// until WriteDone; the original pull is answered by the write's own result;
// D frees only then, and reports no completion. Both write outcomes.
class ConnectorAbortSoleWrite : public ::testing::TestWithParam<bool> {};

TEST_P(ConnectorAbortSoleWrite, BlocksHeldUntilWriteDone) {
  const bool write_ok = GetParam();
  Cluster c(Tp(1, 1));
  c.auto_write = false;
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  c.AllocateD(k);
  c.Step();
  ASSERT_EQ(c.writes.size(), 1u);
  const StartWrite w = c.writes[0].w;
  ASSERT_EQ(c.AbortD(k), std::optional<bool>(true));
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.p_ranks[0]->send_table()->StateOf(Tid(1)), SendState::kDone);
  EXPECT_EQ(c.SendEnds(0, TransferResult::kReleased), 1u);
  EXPECT_EQ(c.preqs[k].sending_done, 0);
  EXPECT_EQ(c.p_pool.num_referenced(), 3u);
  EXPECT_EQ(c.dreqs[k].released, 0);
  EXPECT_EQ(c.d_pool.num_referenced(), 3u);
  const ItemKey original{w.peer.index, 0, w.pull_seq, w.transfer};
  EXPECT_EQ(c.items.at(original).answers, 0);

  c.CompleteWrite(0, write_ok);
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.items.at(original).answers, 1);
  EXPECT_EQ(c.items.at(original).last,
            write_ok ? TransferResult::kOk : TransferResult::kWriteFailed);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.dreqs[k].released, 1);
  EXPECT_EQ(c.dreqs[k].completions, 0);
  EXPECT_EQ(c.SendEndsTotal(0), 1u);
  EXPECT_DRAINED(c);
}

INSTANTIATE_TEST_SUITE_P(Write, ConnectorAbortSoleWrite, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("Ok") : std::string("Failed");
                         });

// 1P1D: the pull waits for the prefill; the abort's release answers it
// kReleased at once, D frees, and P's later Ready is refused and freed at
// once.
TEST(ConnectorAbortTest, DAbortWhilePullWaitsForPrefill) {
  Cluster c(Tp(1, 1));
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.AllocateD(k);
  c.Step();
  EXPECT_EQ(c.p_ranks[0]->send_table()->StateOf(Tid(1)), SendState::kWaiting);
  ASSERT_EQ(c.AbortD(k), std::optional<bool>(true));
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.dreqs[k].released, 1);
  EXPECT_EQ(c.dreqs[k].completions, 0);
  EXPECT_EQ(c.d_pool.num_referenced(), 0u);
  const SendTableStats& st = c.p_ranks[0]->send_table()->stats();
  EXPECT_EQ(st.answers[static_cast<int>(TransferResult::kReleased)], 1u);
  EXPECT_TRUE(c.FinishPrefill(k));
  c.Step();
  EXPECT_EQ(c.preqs[k].sending_done, 1) << "Ready refused: P frees right away";
  EXPECT_EQ(c.p_ranks[0]->stats().ready_refused, 1u);
  EXPECT_DRAINED(c);
}

class ConnectorAbortBeforeAlloc : public ::testing::TestWithParam<TpPair> {};

TEST_P(ConnectorAbortBeforeAlloc, ReleaseSentAndPFreesAtReady) {
  Cluster c(Tp(GetParam().first, GetParam().second));
  const int k = c.NewRequest(Tid(1));
  c.Step();
  ASSERT_EQ(c.AbortD(k), std::optional<bool>(false)) << "nothing allocated";
  EXPECT_FALSE(c.d_sched.RemotePrefill(c.dreqs[k].id));
  c.Step();  // the releases reach every P rank
  EXPECT_CLEAN(c);
  for (uint32_t q = 0; q < c.opt.p_tp; ++q) {
    EXPECT_EQ(c.p_ranks[q]->send_table()->StateOf(Tid(1)), std::nullopt);
    EXPECT_TRUE(c.p_ranks[q]->send_table()->HasTombstone(Tid(1)));
  }
  EXPECT_TRUE(c.FinishPrefill(k));
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[k].sending_done, 1) << "sending_done right after the Ready step";
  EXPECT_EQ(c.p_pool.num_referenced(), 0u);
  EXPECT_EQ(c.dreqs[k].completions, 0);
  EXPECT_DRAINED(c);
}

// The same, but the release reaches P only after P's prefill finished.
TEST_P(ConnectorAbortBeforeAlloc, ReleaseAfterReadyEndsHeldSend) {
  Cluster c(Tp(GetParam().first, GetParam().second));
  c.auto_deliver = false;
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  ASSERT_EQ(c.AbortD(k), std::optional<bool>(false));
  c.Step();
  EXPECT_EQ(c.preqs[k].sending_done, 0);
  c.DeliverAll();
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[k].sending_done, 1) << "the release ends P's held send";
  EXPECT_DRAINED(c);
}

INSTANTIATE_TEST_SUITE_P(Tp, ConnectorAbortBeforeAlloc,
                         ::testing::Values(TpPair{1, 1}, TpPair{2, 1}, TpPair{1, 2}),
                         TpName);

// P aborts while the pull waits for its prefill: the pull is answered at
// once, D fails the load (not a release).
TEST(ConnectorAbortTest, PAbortWhileRunningFailsWaitingPull) {
  Cluster c(Tp(1, 2));
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.AllocateD(k);
  c.Step();
  c.AbortP(k);
  EXPECT_EQ(c.preqs[k].state, PState::kDone);
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_FALSE(c.dreqs[k].outcome->ok);
  EXPECT_FALSE(c.dreqs[k].outcome->cut_short);
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// ===========================================================================
// 5. abort_transfers().

class ConnectorAbortTransfers : public ::testing::TestWithParam<TpPair> {};

// D: loads in flight end failed and cut short; the request is kept.
TEST_P(ConnectorAbortTransfers, DCutsLoadsShortAndKeepsRequest) {
  Cluster c(Tp(GetParam().first, GetParam().second));
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.AllocateD(k);
  c.Step();  // pulls wait at P for the prefill
  c.d_sched.AbortTransfers();
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  EXPECT_EQ(c.dreqs[k].released, 0) << "kept, not released";
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_FALSE(c.dreqs[k].outcome->ok);
  EXPECT_TRUE(c.dreqs[k].outcome->cut_short);
  EXPECT_EQ(c.dreqs[k].state, DState::kDecoding) << "recomputes locally";
  EXPECT_EQ(c.d_pool.num_referenced(), 3u);
  EXPECT_TRUE(c.FinishPrefill(k));
  c.Step();
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// P: held sends end (sending_done surfaces); a running request's send ends
// too, and its later Ready is refused and freed at once; D's pulls fail.
TEST_P(ConnectorAbortTransfers, PEndsHeldSends) {
  Cluster c(Tp(GetParam().first, GetParam().second));
  const int held = c.NewRequest(Tid(1));
  const int running = c.NewRequest(Tid(2));
  c.Step();
  c.FinishPrefill(held);
  c.Step();
  EXPECT_EQ(c.p_sched.held_sends(), 1u);
  c.p_sched.AbortTransfers();
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[held].sending_done, 1);
  EXPECT_EQ(c.p_sched.held_sends(), 0u);
  // A request P had not finished keeps its transfer (lifecycle.md, rule 7).
  c.FinishPrefill(running);
  c.Step();
  EXPECT_EQ(c.preqs[running].sending_done, 0);
  EXPECT_GT(c.p_pool.num_referenced(), 0u);
  c.AllocateD(held);
  c.AllocateD(running);
  c.Step();
  EXPECT_CLEAN(c);
  // The held one was given back (kReset): D's load is cut short, so it
  // recomputes whatever its failure policy. The other one loads.
  for (int k : {held, running}) {
    EXPECT_EQ(c.dreqs[k].completions, 1);
    ASSERT_TRUE(c.dreqs[k].outcome.has_value());
    EXPECT_EQ(c.dreqs[k].outcome->ok, k == running);
    EXPECT_EQ(c.dreqs[k].outcome->cut_short, k == held);
    c.FinishD(k);
  }
  c.Step();
  EXPECT_EQ(c.preqs[running].sending_done, 1);
  EXPECT_DRAINED(c);
}

INSTANTIATE_TEST_SUITE_P(Tp, ConnectorAbortTransfers,
                         ::testing::Values(TpPair{1, 1}, TpPair{2, 1}, TpPair{1, 2}),
                         TpName);

// D abort_transfers while the write is in flight, then the write completes
// ok. The load was cut short, so per the contract (load_table.h: "its load
// is reported failed with `cut_short`"; lifecycle.md: "every D request whose
// load is cut short is kept, marked as a failed load") it must be reported
// failed, never ok=true with cut_short=true: an engine trusting `ok` would
// decode on KV that release_transfer_kv() meant to drop (e.g. computed under
// weights an update_weights is replacing). Regression test: an earlier
// LoadTable::FinishIfComplete reported ok = !failed and failed here.
TEST(ConnectorAbortTest, DAbortTransfersWithWriteInFlightReportsFailed) {
  Cluster c(Tp(1, 1));
  c.auto_write = false;
  const int k = c.NewRequest(Tid(1));
  c.Step();
  c.FinishPrefill(k);
  c.AllocateD(k);
  c.Step();
  ASSERT_EQ(c.writes.size(), 1u);
  c.d_sched.AbortTransfers();
  c.Step();  // the release reaches P; the write keeps the send's blocks
  EXPECT_EQ(c.dreqs[k].completions, 0);
  EXPECT_EQ(c.p_ranks[0]->send_table()->StateOf(Tid(1)), SendState::kDone);
  c.CompleteWrite(0, true);
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[k].sending_done, 1);
  EXPECT_EQ(c.dreqs[k].completions, 1);
  EXPECT_EQ(c.dreqs[k].released, 0);
  ASSERT_TRUE(c.dreqs[k].outcome.has_value());
  EXPECT_TRUE(c.dreqs[k].outcome->cut_short);
  EXPECT_FALSE(c.dreqs[k].outcome->ok) << "a cut-short load must be reported failed";
  c.FinishD(k);
  c.Step();
  EXPECT_DRAINED(c);
}

// ===========================================================================
// 6. Duplicate transfer_id.

TEST(ConnectorTest, DuplicateTransferIdRejectedFirstUnaffected) {
  Cluster c(Tp(1, 1));
  const int first = c.NewRequest(Tid(7));
  ASSERT_TRUE(c.preqs[first].admission.ok());
  const int dup_claimed = c.NewRequest(Tid(7), /*on_p=*/true, /*on_d=*/false);
  EXPECT_EQ(c.preqs[dup_claimed].admission.code(), StatusCode::kAlreadyExists);
  c.Step();
  c.FinishPrefill(first);
  c.Step();
  const int dup_held = c.NewRequest(Tid(7), /*on_p=*/true, /*on_d=*/false);
  EXPECT_EQ(c.preqs[dup_held].admission.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(c.p_sched.stats().duplicate_transfer_rejected, 2u);
  EXPECT_EQ(c.p_ranks[0]->send_table()->stats().claims, 1u)
      << "the rejected requests never reach the ranks";
  c.Step();
  EXPECT_EQ(c.p_ranks[0]->send_table()->StateOf(Tid(7)), SendState::kReady);
  c.AllocateD(first);
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.preqs[first].sending_done, 1);
  EXPECT_EQ(c.dreqs[first].completions, 1);
  ASSERT_TRUE(c.dreqs[first].outcome.has_value());
  EXPECT_TRUE(c.dreqs[first].outcome->ok);
  c.FinishD(first);
  c.Step();
  EXPECT_DRAINED(c);
}

// The same on D: a second D request naming a transfer_id that a live D
// load already uses must not disturb the first (lifecycle.md P rule 9 in
// spirit: "it never overwrites the first"). Here the first request's pull is
// still waiting at P for the prefill when the duplicate allocates.
// (Found by this test: D once admitted the duplicate and its rank, on the
// failed Start, released the *shared* transfer on P. Now D rejects it at
// admission, and a rank releases on a failed Start only for an unknown
// producer.)
TEST(ConnectorTest, DuplicateTransferIdOnDDoesNotDisturbFirstLoad) {
  Cluster c(Tp(1, 1));
  const int first = c.NewRequest(Tid(9));
  const int dup = c.NewRequest(Tid(9), /*on_p=*/false, /*on_d=*/true);
  c.Step();
  ASSERT_TRUE(c.AllocateD(first));
  c.Step();  // the first pull waits at P for the prefill
  if (c.dreqs[dup].admission.ok()) {
    ASSERT_TRUE(c.AllocateD(dup));
    c.Step();
    EXPECT_EQ(c.dreqs[dup].completions, 1);
    ASSERT_TRUE(c.dreqs[dup].outcome.has_value());
    EXPECT_FALSE(c.dreqs[dup].outcome->ok) << "the duplicate cannot load";
  } else {
    EXPECT_EQ(c.dreqs[dup].admission.code(), StatusCode::kAlreadyExists);
  }
  EXPECT_EQ(c.p_ranks[0]->send_table()->StateOf(Tid(9)), SendState::kWaiting)
      << "P's send for the first request must survive the duplicate";
  EXPECT_EQ(c.dreqs[first].completions, 0) << "the first load is still waiting";
  c.FinishPrefill(first);
  c.Step();
  EXPECT_CLEAN(c);
  EXPECT_EQ(c.dreqs[first].completions, 1);
  ASSERT_TRUE(c.dreqs[first].outcome.has_value());
  EXPECT_TRUE(c.dreqs[first].outcome->ok) << "the first load must be unaffected";
  EXPECT_EQ(c.preqs[first].sending_done, 1);
  for (int k : {first, dup}) {
    if (c.dreqs[k].state == DState::kDecoding) c.FinishD(k);
  }
  c.Step();
  EXPECT_DRAINED(c);
}

// ===========================================================================
// 7. Property: random interleavings over the whole connector drain.

enum CmdKind : int {
  kStepCmd, kNewCmd, kFinishPrefillCmd, kAllocCmd, kAbortPCmd, kAbortDCmd,
  kFinishDCmd, kCompleteWriteCmd, kDeliverOneCmd, kDeliverAllCmd, kAdvanceCmd,
  kAbortAllPCmd, kAbortAllDCmd, kWriteModeCmd, kDeliverModeCmd, kAdmitPCmd,
  kNumCmdKinds
};

// Relative frequency of each kind (index = CmdKind).
constexpr int kCmdWeight[kNumCmdKinds] = {6, 4, 3, 3, 2, 2, 3, 5, 8, 2, 5, 1, 1, 1, 1, 2};

const char* CmdName(int kind) {
  static const char* const kNames[kNumCmdKinds] = {
      "Step", "New", "FinishPrefill", "AllocateD", "AbortP", "AbortD",
      "FinishD", "CompleteWrite", "DeliverOne", "DeliverAll", "Advance",
      "AbortTransfersP", "AbortTransfersD", "WriteMode", "DeliverMode",
      "AdmitP"};
  return kind >= 0 && kind < kNumCmdKinds ? kNames[kind] : "?";
}

struct Cmd {
  int kind = 0;
  uint32_t a = 0;
  uint32_t b = 0;
};

std::ostream& operator<<(std::ostream& os, const Cmd& c) {
  return os << CmdName(c.kind) << "(" << c.a << "," << c.b << ")";
}

int KindFromRoll(int roll) {
  for (int k = 0; k < kNumCmdKinds; ++k) {
    if (roll < kCmdWeight[k]) return k;
    roll -= kCmdWeight[k];
  }
  return kStepCmd;
}

constexpr int kTotalWeight = [] {
  int n = 0;
  for (int w : kCmdWeight) n += w;
  return n;
}();

constexpr size_t kMaxRequests = 10;

void Apply(Cluster& c, const Cmd& cmd, uint64_t& next_tid) {
  const int n = static_cast<int>(c.preqs.size());
  const int k = n == 0 ? -1 : static_cast<int>(cmd.a % static_cast<uint32_t>(n));
  switch (cmd.kind) {
    case kStepCmd:
      c.Step();
      break;
    case kNewCmd: {
      if (c.preqs.size() >= kMaxRequests) break;
      // b % 4 == 3: the router reached D first; P admits later (AdmitP).
      const int r = c.NewRequest(Tid(next_tid++), /*on_p=*/cmd.b % 4 != 3);
      switch (cmd.b % 4) {
        case 1:
          c.FinishPrefill(r);
          c.AllocateD(r);
          break;
        case 2:
          c.AllocateD(r);
          c.FinishPrefill(r);
          break;
        default:
          break;
      }
      break;
    }
    case kFinishPrefillCmd:
      if (k >= 0 && c.preqs[k].state == PState::kRunning) c.FinishPrefill(k);
      break;
    case kAllocCmd:
      // Sometimes D holds a prefix already and loads only the tail.
      if (k >= 0) c.AllocateD(k, cmd.b % 3 == 0 ? 1 + cmd.b % c.opt.blocks_per_request : 0);
      break;
    case kAbortPCmd:
      if (k >= 0) c.AbortP(k);
      break;
    case kAbortDCmd:
      if (k >= 0) c.AbortD(k);
      break;
    case kFinishDCmd:
      if (k >= 0 && c.dreqs[k].state == DState::kDecoding) c.FinishD(k);
      break;
    case kCompleteWriteCmd:
      if (!c.writes.empty()) c.CompleteWrite(cmd.a % c.writes.size(), cmd.b % 4 != 0);
      break;
    case kDeliverOneCmd:
      if (!c.msgs.empty()) {
        const HeldMessage& m = c.msgs[cmd.a % c.msgs.size()];
        c.DeliverPath(m.from, m.to);  // the oldest on that path
      }
      break;
    case kDeliverAllCmd: {
      size_t count = c.msgs.size();
      while (count-- > 0 && !c.msgs.empty()) c.DeliverAt(0);
      break;
    }
    case kAdvanceCmd: {
      Duration dt;
      switch (cmd.b % 3) {
        case 0: dt = Duration::Milliseconds(100) * (1 + cmd.a % 10); break;
        case 1: dt = Duration::Seconds(1) * (1 + cmd.a % 5); break;
        default: dt = kTimeout + Duration::Milliseconds(cmd.a % 4000); break;
      }
      c.AdvanceTo(c.now + dt);
      break;
    }
    case kAbortAllPCmd:
      c.p_sched.AbortTransfers();
      break;
    case kAbortAllDCmd:
      c.d_sched.AbortTransfers();
      break;
    case kWriteModeCmd:
      // auto ok, held, held, auto failing
      c.auto_write = cmd.a % 4 == 0 || cmd.a % 4 == 3;
      c.write_ok = cmd.a % 4 != 3;
      break;
    case kAdmitPCmd:
      if (k >= 0) c.AdmitP(k);
      break;
    case kDeliverModeCmd:
      c.auto_deliver = cmd.a % 2 == 0;
      break;
    default:
      break;
  }
}

constexpr TpPair kPropertyTps[] = {{1, 1}, {2, 1}, {1, 2}};
constexpr TpPair kSoakTps[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}, {4, 2}, {2, 4}};

// Runs one scenario: the commands, then the drain. Returns "" on success,
// else what went wrong (and after which command).
std::string RunScenario(TpPair tp, uint32_t workers, const std::vector<Cmd>& cmds) {
  ClusterOptions o = Tp(tp.first, tp.second, workers);
  o.blocks_per_request = 3;
  o.pool_capacity = 64;
  Cluster c(o);
  c.bounded_lag = true;
  c.auto_deliver = false;
  c.auto_write = false;
  uint64_t next_tid = 1;
  for (size_t i = 0; i < cmds.size(); ++i) {
    Apply(c, cmds[i], next_tid);
    c.CheckAll();
    if (!c.errors.empty()) {
      std::ostringstream os;
      os << "after command #" << i << " " << cmds[i] << ":\n" << c.Summary();
      return os.str();
    }
  }

  // Faults stop: every write completes, every message is delivered, every
  // request P has not admitted yet is admitted, every running prefill
  // finishes and every waiting D request allocates; then time runs well
  // past every timeout (3 × (abort_timeout + giveup_grace)), firing every
  // timer at its time and stepping after each.
  c.auto_deliver = true;
  c.auto_write = true;
  c.write_ok = true;
  c.CompleteAllWrites(true);
  c.DeliverAll();
  c.Step();
  for (int k = 0; k < static_cast<int>(c.preqs.size()); ++k) {
    c.AdmitP(k);
    if (c.preqs[k].state == PState::kRunning) c.FinishPrefill(k);
    if (c.dreqs[k].state == DState::kAwaitingAlloc) c.AllocateD(k);
  }
  c.Step();
  c.AdvanceTo(c.now + (kTimeout + kGrace) * 3);
  // Every D request decodes (or recomputes) to its end.
  for (int k = 0; k < static_cast<int>(c.dreqs.size()); ++k) {
    if (c.dreqs[k].state == DState::kDecoding) c.FinishD(k);
  }
  c.Step();
  if (std::getenv("CONNECTOR_TEST_COVERAGE") != nullptr) {
    std::printf("cmds=%zu ", cmds.size());
    c.PrintCoverage();
  }
  std::vector<std::string> left = c.Leftovers();
  if (c.p_pool.num_free() != c.p_pool.capacity()) left.push_back("P pool not fully free");
  if (c.d_pool.num_free() != c.d_pool.capacity()) left.push_back("D pool not fully free");
  if (left.empty()) return "";
  std::ostringstream os;
  os << "not drained:\n";
  for (const std::string& e : left) os << "  " << e << "\n";
  return os.str();
}

std::string Describe(TpPair tp, uint32_t workers, const std::vector<Cmd>& cmds) {
  std::ostringstream os;
  os << "P tp=" << tp.first << " D tp=" << tp.second << " num_workers=" << workers
     << " commands:";
  for (const Cmd& cmd : cmds) os << " " << cmd;
  return os.str();
}

RC_GTEST_PROP(ConnectorProperty, RandomInterleavingsDrainCleanly, ()) {
  const TpPair tp = kPropertyTps[*rc::gen::element(0, 1, 2)];
  const uint32_t workers = *rc::gen::inRange<uint32_t>(1, 3);
  const auto cmds = *rc::gen::resize(
      120, rc::gen::container<std::vector<Cmd>>(rc::gen::map(
               rc::gen::tuple(rc::gen::inRange(0, kTotalWeight),
                              rc::gen::inRange<uint32_t>(0, 1000),
                              rc::gen::inRange<uint32_t>(0, 1000)),
               [](const std::tuple<int, uint32_t, uint32_t>& t) {
                 return Cmd{KindFromRoll(std::get<0>(t)), std::get<1>(t), std::get<2>(t)};
               })));
  RC_TAG(tp.first, tp.second);
  const std::string failure = RunScenario(tp, workers, cmds);
  if (!failure.empty()) RC_FAIL(failure);
}

// The same scenarios from a seeded Prng, many more of them (rapidcheck runs
// 100 cases by default); a failure names its seed and its commands.
TEST(ConnectorSoak, SeededScenariosDrainCleanly) {
  // CONNECTOR_SOAK_SEEDS=N overrides the count for a longer hunt.
  uint64_t seeds = 3000;
  if (const char* env = std::getenv("CONNECTOR_SOAK_SEEDS")) {
    seeds = std::strtoull(env, nullptr, 10);
  }
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    Prng rng(seed);
    const TpPair tp = kSoakTps[rng.Uniform(std::size(kSoakTps))];
    const uint32_t workers = 1 + static_cast<uint32_t>(rng.Uniform(2));
    std::vector<Cmd> cmds(rng.Uniform(160));
    for (Cmd& cmd : cmds) {
      cmd.kind = KindFromRoll(static_cast<int>(rng.Uniform(kTotalWeight)));
      cmd.a = static_cast<uint32_t>(rng.Uniform(1000));
      cmd.b = static_cast<uint32_t>(rng.Uniform(1000));
    }
    const std::string failure = RunScenario(tp, workers, cmds);
    if (!failure.empty()) {
      ADD_FAILURE() << "seed " << seed << ": " << Describe(tp, workers, cmds) << "\n"
                    << failure;
      return;
    }
  }
}

}  // namespace
}  // namespace kvrelay
