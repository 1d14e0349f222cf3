// send_table_property_test.cc — a rapidcheck stateful test of SendTable
// against a reference model of the lifecycle rules.
//
// The system under test (Sut) wraps one SendTable and a small, explicit
// model of the rules in docs/spec lifecycle.md ("P side") and send_table.h:
//
//   per transfer: claimed / placeholder, ready (holds blocks), pristine (no
//   pull attached since Ready), need, pulled, done + end reason, writes in
//   flight; per pull item: waiting / writing, deadline; tombstones with
//   their reasons and creation time.
//
// Every input is checked in three steps:
//   1. the model predicts what the rules force: which items must be
//      answered in this input and with which results, which SendFinished
//      actions must appear, the returned Status;
//   2. timer-driven ends are the one place the rules leave freedom (a READY
//      send that some pull touched may or may not expire at ready+timeout;
//      when several timers are due at once either reason may win). For
//      those the model computes the allowed reasons, and whether the end is
//      mandatory (an OnTimer at/after a due placeholder expiry, a due
//      expiry of an untouched READY send, a due pull deadline), and takes
//      the table's choice from what it observes;
//   3. StartWrite actions are validated, not predicted: the item must be
//      waiting on a READY send, before its deadline, within num_workers, in
//      per-send arrival order; and no sender may stay idle while an
//      admissible item waits (work conservation).
// After each input the observable state (StateOf, HasTombstone, counts)
// must equal the model's. At the end the sequence is drained (P finishes
// every running request, every write completes, time passes) and every item
// must have been answered exactly once, SendFinished emitted exactly once
// per accepted Ready(), and the table must be empty.
//
// Bounded: 100 cases (rapidcheck's default), sequences of at most ~60
// commands, 4 transfer ids, 2 D peers, 1-2 workers. On failure rapidcheck
// prints the seed and the shrunk command sequence.
#include "core/send_table.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "base/status.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/transfer_result.h"

namespace kvrelay {
namespace {

using R = TransferResult;

constexpr Duration kTimeout = Duration::Seconds(10);
constexpr Duration kGrace = Duration::Seconds(6);
constexpr Duration kTombTtl = kTimeout + kGrace;
constexpr int kIds = 4;
constexpr int kPeers = 2;
constexpr int kBlocks = 2;  // every prompt and every pull has 2 blocks

TransferId Tid(int id) { return TransferId{0xfeedULL, static_cast<uint64_t>(id + 1)}; }
PeerId Peer(int p) { return PeerId{static_cast<uint32_t>(p + 1), 1}; }

std::string Name(TransferId t) { return "T" + std::to_string(t.lo - 1); }
std::string Name(R r) { return std::string(TransferResultName(r)); }
std::string Name(Instant t) { return std::to_string(t.ns()) + "ns"; }

struct Key {
  PeerId peer;
  uint64_t seq = 0;
  TransferId t;
  auto operator<=>(const Key&) const = default;
};
std::string Name(const Key& k) {
  return "(P" + std::to_string(k.peer.index) + ",#" + std::to_string(k.seq) +
         "," + Name(k.t) + ")";
}

std::string Names(const std::vector<R>& rs) {
  if (rs.empty()) return "{any}";
  std::string s = "{";
  for (R r : rs) s += Name(r) + " ";
  s.back() = '}';
  return s;
}

// A pull's prompt fingerprint agrees with the claim's (0: not checked).
bool PromptMatches(uint64_t send_hash, uint64_t item_hash) {
  return send_hash == 0 || item_hash == 0 || send_hash == item_hash;
}

R AnswerFor(R end_reason) {
  return end_reason == R::kOk ? R::kAlreadyPulled : end_reason;
}

// ---------------------------------------------------------------------------
// The model.

struct MItem {
  TransferId t;
  std::vector<BlockId> dst;
  uint64_t prompt_hash = 0;
  Instant deadline;
  uint64_t order = 0;  // arrival order
  bool writing = false;
  WriteId write;
};

struct MSend {
  bool claimed = false;       // else an unclaimed placeholder
  uint64_t prompt_hash = 0;   // set by the claim
  std::optional<Instant> placeholder_expiry;
  bool ready = false;         // Ready() accepted: holds blocks
  Instant ready_at;
  bool pristine = true;       // no pull attached since Ready()
  std::vector<BlockId> blocks;
  uint32_t need = 1;
  uint32_t pulled = 0;
  bool done = false;
  std::optional<R> reason;    // nullopt: ended, reason not observed
  int writes = 0;
};

struct MTomb {
  std::vector<R> reasons;     // empty: any
  Instant created;            // earliest possible creation
  Instant last_touch;         // latest possible (re)creation
};

// Optional (timer-driven) ends allowed in the current input.
struct OptEnd {
  std::set<R> allowed;
  bool must = false;
};

class Sut {
 public:
  explicit Sut(uint32_t workers) : table_(MakeOpts(workers)), workers_(workers) {}

  static SendTableOptions MakeOpts(uint32_t workers) {
    SendTableOptions o;
    o.abort_timeout = kTimeout;
    o.giveup_grace = kGrace;
    o.num_workers = workers;
    return o;
  }

  // --- commands -----------------------------------------------------------

  void Claim(int id, uint32_t need, uint64_t prompt_hash) {
    const TransferId t = Tid(id);
    Begin("Claim " + Name(t) + " need " + std::to_string(need) + " prompt " +
              std::to_string(prompt_hash),
          false);
    Status st = table_.Claim(t, need, now_, prompt_hash);
    Collect();
    std::vector<StatusCode> want;
    auto it = sends_.find(t);
    if (it != sends_.end()) {
      MSend& s = it->second;
      if (s.done) {
        want = {StatusCode::kCancelled};
      } else if (s.claimed) {
        want = {StatusCode::kAlreadyExists};
      } else {
        want = {StatusCode::kOk};
        if (st.ok()) {
          s.claimed = true;
          s.need = need;
          s.prompt_hash = prompt_hash;
          s.placeholder_expiry.reset();  // a running request never expires
          pending_ready_[t] = true;
          // A pull that came first for another prompt under this id ends
          // the send: every waiting pull is answered kMismatch.
          bool mismatch = false;
          for (const auto& [k, item] : items_) {
            mismatch = mismatch ||
                       (item.t == t && !PromptMatches(prompt_hash, item.prompt_hash));
          }
          if (mismatch) End(t, R::kMismatch);
        }
      }
    } else if (auto tb = tombs_.find(t); tb != tombs_.end()) {
      if (TombCertain(tb->second)) {
        want = {StatusCode::kCancelled};
      } else {
        // Past its minimum age: the table may have dropped it.
        want = {StatusCode::kCancelled, StatusCode::kOk};
        if (st.ok()) {
          tombs_.erase(tb);
          NewClaimed(t, need, prompt_hash);
        }
      }
    } else {
      want = {StatusCode::kOk};
      if (st.ok()) NewClaimed(t, need, prompt_hash);
    }
    ExpectStatus(st, want);
    Match();
    Finish();
  }

  void Ready(int id, bool force, bool empty) {
    // Prefer a transfer whose claim awaits its Ready(), so that prefills
    // actually finish in most sequences.
    if (!force && !pending_ready_[Tid(id)]) {
      for (int d = 1; d < kIds; ++d) {
        if (pending_ready_[Tid((id + d) % kIds)]) {
          id = (id + d) % kIds;
          break;
        }
      }
    }
    const TransferId t = Tid(id);
    auto it = sends_.find(t);
    const bool pending = pending_ready_[t];
    const bool live_waiting_claimed = it != sends_.end() && !it->second.done &&
                                      it->second.claimed && !it->second.ready;
    if (empty) {
      if (!live_waiting_claimed) return;
      Begin("Ready " + Name(t) + " with no blocks", false);
      Status st = table_.Ready(t, {}, now_);
      Collect();
      ExpectStatus(st, {StatusCode::kInvalidArgument});
      Match();
      Finish();
      return;
    }
    // P's engine calls Ready() once per accepted claim; `force` also tries
    // it where no claim is pending (never on a send that already holds
    // blocks: a second hand-over is a caller bug the table may KV_CHECK).
    if (!pending && !(force && !(it != sends_.end() && it->second.ready))) return;
    std::vector<BlockId> blocks;
    for (int i = 0; i < kBlocks; ++i) blocks.push_back(BlockId{next_src_++, 1});
    Begin("Ready " + Name(t), false);
    Status st = table_.Ready(t, blocks, now_);
    Collect();
    pending_ready_[t] = false;
    std::vector<StatusCode> want;
    if (it != sends_.end()) {
      MSend& s = it->second;
      if (s.done) {
        want = {StatusCode::kCancelled};
      } else if (!s.claimed) {
        want = {StatusCode::kFailedPrecondition};
      } else {
        want = {StatusCode::kOk};
        if (st.ok()) {
          s.ready = true;
          s.ready_at = now_;
          s.blocks = blocks;
          s.pristine = !HasItems(t);
          ready_ok_[t]++;
        }
      }
    } else if (auto tb = tombs_.find(t); tb != tombs_.end()) {
      if (TombCertain(tb->second) && pending) {
        want = {StatusCode::kCancelled};
      } else {
        want = {StatusCode::kCancelled, StatusCode::kFailedPrecondition};
      }
    } else {
      want = {StatusCode::kFailedPrecondition};
      if (pending) want.push_back(StatusCode::kCancelled);  // tombstone aged out
    }
    ExpectStatus(st, want);
    Match();
    Finish();
  }

  struct PullSpec {
    int id = 0;
    bool release = false;
    uint64_t prompt_hash = 0;
  };

  void Pull(int peer_index, const std::vector<PullSpec>& specs) {
    const PeerId peer = Peer(peer_index);
    const uint64_t seq = ++next_seq_[peer_index];
    std::vector<PullItem> items;
    std::set<TransferId> seen;
    std::string what = "Pull P" + std::to_string(peer.index) + " #" + std::to_string(seq);
    for (const PullSpec& sp : specs) {
      const TransferId t = Tid(sp.id);
      const bool release = sp.release;
      if (!seen.insert(t).second) continue;  // one item per transfer
      PullItem pi;
      pi.transfer = t;
      if (!release) pi.prompt_hash = sp.prompt_hash;
      if (!release) {
        for (int i = 0; i < kBlocks; ++i) pi.dst.push_back(BlockId{next_dst_++, 3});
      }
      what += (release ? " rel:" : " ") + Name(t) +
              (release ? "" : "/" + std::to_string(sp.prompt_hash));
      items.push_back(std::move(pi));
    }
    Begin(what, false);
    table_.Pull(peer, seq, items, now_);
    Collect();
    std::set<Key> ended_keys;  // answered at arrival: must precede any write
    for (const PullItem& pi : items) {
      const TransferId t = pi.transfer;
      const Key k{peer, seq, t};
      issued_[k] = 0;
      auto it = sends_.find(t);
      if (pi.dst.empty()) {  // release
        exp_ans_[k] = {};  // answered now; its result is not specified
        if (it != sends_.end()) {
          if (!it->second.done) End(t, R::kReleased);
        } else if (auto tb = tombs_.find(t); tb != tombs_.end()) {
          TouchTomb(tb->second, R::kReleased);
        } else {
          AddTomb(t, R::kReleased);
        }
        continue;
      }
      if (it != sends_.end()) {
        if (it->second.done) {
          exp_ans_[k] = it->second.reason ? std::vector<R>{AnswerFor(*it->second.reason)}
                                          : std::vector<R>{};
          ended_keys.insert(k);
        } else if (it->second.claimed &&
                   !PromptMatches(it->second.prompt_hash, pi.prompt_hash)) {
          // Another prompt's transfer, for its only consumer: it ends.
          exp_ans_[k] = {R::kMismatch};
          ended_keys.insert(k);
          End(t, R::kMismatch);
        } else {
          Attach(k, pi.dst, pi.prompt_hash);
        }
        continue;
      }
      if (auto tb = tombs_.find(t); tb != tombs_.end()) {
        if (TombCertain(tb->second) || AnsweredIn(k)) {
          exp_ans_[k] = tb->second.reasons;
          ended_keys.insert(k);
          continue;
        }
        tombs_.erase(tb);  // aged out: the pull starts afresh
      }
      // Unknown: a placeholder that expires one timeout after this pull.
      MSend s;
      s.placeholder_expiry = now_ + kTimeout;
      sends_[t] = s;
      Attach(k, pi.dst, pi.prompt_hash);
    }
    // Ended transfers are answered before any write of this batch.
    bool write_seen = false;
    for (const SendAction& a : acts_) {
      if (std::holds_alternative<StartWrite>(a)) write_seen = true;
      if (const auto* ap = std::get_if<AnswerPull>(&a)) {
        Key k{ap->peer, ap->pull_seq, ap->transfer};
        if (write_seen && ended_keys.count(k)) {
          Fail("ended item " + Name(k) + " answered after a write of its batch");
        }
      }
    }
    Match();
    Finish();
  }

  void Abort(int id) {
    const TransferId t = Tid(id);
    Begin("Abort " + Name(t), false);
    table_.Abort(t, now_);
    Collect();
    auto it = sends_.find(t);
    if (it != sends_.end()) {
      if (!it->second.done) End(t, R::kAborted);
    } else if (auto tb = tombs_.find(t); tb != tombs_.end()) {
      TouchTomb(tb->second, R::kAborted);
    } else {
      AddTomb(t, R::kAborted);
    }
    Match();
    Finish();
  }

  void ReleaseHeld() {
    Begin("ReleaseHeld", false);
    table_.ReleaseHeld(now_);
    Collect();
    std::vector<TransferId> held;
    for (const auto& [t, s] : sends_) {
      if (!s.done && s.ready) held.push_back(t);
    }
    for (TransferId t : held) End(t, R::kReset);
    Match();
    Finish();
  }

  void CompleteWrite(size_t pick, bool ok) {
    if (writes_.empty()) return;
    auto wit = writes_.begin();
    std::advance(wit, static_cast<std::ptrdiff_t>(pick % writes_.size()));
    const WriteId w = wit->first;
    const Key k = wit->second;
    Begin("WriteDone " + Name(k) + (ok ? " ok" : " FAILED"), false);
    // Bookkeeping first: the write no longer reads the blocks.
    writes_.erase(wit);
    done_writes_.push_back(w);
    if (!items_.at(k).writing) Fail("model: completing a write not in flight");
    items_.erase(k);
    MSend& s = sends_.at(k.t);
    s.writes--;
    table_.WriteDone(w, ok, now_);
    Collect();
    const R own = ok ? R::kOk : R::kWriteFailed;
    if (s.done) {
      std::vector<R> allowed = {own};
      if (s.reason) {
        allowed.push_back(AnswerFor(*s.reason));
      } else {
        allowed.clear();
      }
      exp_ans_[k] = allowed;
      MaybeRelease(k.t);
    } else if (!ok) {
      exp_ans_[k] = {R::kWriteFailed};
      End(k.t, R::kWriteFailed);
    } else {
      exp_ans_[k] = {R::kOk};
      ok_answer_ = k;
      if (++s.pulled >= s.need) End(k.t, R::kOk);
    }
    Match();
    Finish();
  }

  void StaleWriteDone(size_t pick, bool in_flight) {
    WriteId w;
    if (in_flight && !writes_.empty()) {
      auto wit = writes_.begin();
      std::advance(wit, static_cast<std::ptrdiff_t>(pick % writes_.size()));
      w = wit->first;
      w.generation += 1000;  // right slot, wrong generation
    } else if (!done_writes_.empty()) {
      w = done_writes_[pick % done_writes_.size()];  // already completed
    } else {
      return;
    }
    Begin("stale WriteDone " + w.ToString(), false);
    const uint64_t before = table_.stats().stale_write_done;
    table_.WriteDone(w, true, now_);
    Collect();
    if (!acts_.empty()) Fail("a stale WriteDone produced actions");
    if (table_.stats().stale_write_done != before + 1) {
      Fail("stale WriteDone not counted in stats().stale_write_done");
    }
    Match();
    Finish();
  }

  void Advance(Duration d, bool timer) {
    now_ = now_ + d;
    if (!timer) return;  // the clock moved; the table is not told yet
    last_timer_ = now_;
    Begin("OnTimer +" + std::to_string(d.ns()) + "ns", true);
    table_.OnTimer(now_);
    Collect();
    Match();
    Finish();
  }

  // P finishes every running request, every write completes, time passes:
  // everything must drain.
  void DrainAndCheckFinal() {
    for (int id = 0; id < kIds; ++id) {
      if (pending_ready_[Tid(id)]) Ready(id, false, false);
    }
    for (int round = 0; round < 4; ++round) {
      while (!writes_.empty()) CompleteWrite(0, true);
      Advance((kTimeout + kGrace) * 2, true);
    }
    for (const auto& [k, n] : issued_) {
      if (n != 1) {
        Fail("item " + Name(k) + " answered " + std::to_string(n) + " times");
      }
    }
    for (int id = 0; id < kIds; ++id) {
      const TransferId t = Tid(id);
      if (finished_[t] != ready_ok_[t]) {
        Fail(Name(t) + ": SendFinished " + std::to_string(finished_[t]) +
             " times for " + std::to_string(ready_ok_[t]) + " accepted Ready()");
      }
    }
    RC_ASSERT(items_.empty());
    RC_ASSERT(sends_.empty());
    RC_ASSERT(table_.live_sends() == 0u);
    RC_ASSERT(table_.live_pull_items() == 0u);
    RC_ASSERT(table_.writes_in_flight() == 0u);
    RC_ASSERT(table_.queued_for_sender() == 0u);
  }

 private:
  // --- model transitions ----------------------------------------------------

  void NewClaimed(TransferId t, uint32_t need, uint64_t prompt_hash) {
    MSend s;
    s.claimed = true;
    s.need = need;
    s.prompt_hash = prompt_hash;
    sends_[t] = s;
    pending_ready_[t] = true;
  }

  void Attach(const Key& k, const std::vector<BlockId>& dst, uint64_t prompt_hash) {
    MItem item;
    item.t = k.t;
    item.dst = dst;
    item.prompt_hash = prompt_hash;
    item.deadline = now_ + kTimeout;
    item.order = next_order_++;
    items_[k] = item;
    MSend& s = sends_.at(k.t);
    if (s.ready) s.pristine = false;
  }

  bool HasItems(TransferId t) const {
    for (const auto& [k, item] : items_) {
      if (item.t == t) return true;
    }
    return false;
  }

  // The one place the model ends a send (cf. EndSend).
  void End(TransferId t, std::optional<R> reason) {
    MSend& s = sends_.at(t);
    if (s.done) Fail("model: " + Name(t) + " ended twice");
    s.done = true;
    s.reason = reason;
    ++model_ends_;
    if (reason) model_end_reasons_.push_back(*reason);
    std::vector<R> ans;
    if (reason) ans = {AnswerFor(*reason)};
    for (auto it = items_.begin(); it != items_.end();) {
      if (it->second.t == t && !it->second.writing) {
        exp_ans_[it->first] = ans;
        it = items_.erase(it);
      } else {
        ++it;
      }
    }
    if (!reason || *reason != R::kOk) {
      MTomb tb;
      if (reason) tb.reasons = {*reason};
      tb.created = now_;
      tb.last_touch = now_;
      tombs_[t] = tb;
    }
    MaybeRelease(t);
  }

  void MaybeRelease(TransferId t) {
    MSend& s = sends_.at(t);
    if (!s.done || s.writes > 0) return;
    if (s.ready) exp_fin_.push_back({t, s.reason});
    sends_.erase(t);
  }

  void AddTomb(TransferId t, R reason) {
    MTomb tb;
    tb.reasons = {reason};
    tb.created = now_;
    tb.last_touch = now_;
    tombs_[t] = tb;
  }

  // An abort or release meets a tombstone: a no-op, unless the tombstone is
  // old enough to have been dropped, in which case it is made afresh.
  void TouchTomb(MTomb& tb, R reason) {
    if (TombCertain(tb)) return;
    if (!tb.reasons.empty() &&
        std::find(tb.reasons.begin(), tb.reasons.end(), reason) == tb.reasons.end()) {
      tb.reasons.push_back(reason);
    }
    tb.last_touch = now_;
  }

  // Within its guaranteed lifetime (abort_timeout + giveup_grace).
  bool TombCertain(const MTomb& tb) const { return now_ < tb.created + kTombTtl; }

  bool AnsweredIn(const Key& k) const {
    for (const SendAction& a : acts_) {
      if (const auto* ap = std::get_if<AnswerPull>(&a)) {
        if (Key{ap->peer, ap->pull_seq, ap->transfer} == k) return true;
      }
    }
    return false;
  }

  // --- the per-input machinery ---------------------------------------------

  void Begin(std::string what, bool on_timer) {
    what_ = std::move(what);
    ++input_;
    stats_before_ = table_.stats();
    exp_ans_.clear();
    exp_fin_.clear();
    opt_.clear();
    model_ends_ = 0;
    model_end_reasons_.clear();
    ok_answer_.reset();
    // Timer-driven ends that are due: allowed in any input (a table may
    // notice a passed deadline early), mandatory in OnTimer.
    for (const auto& [t, s] : sends_) {
      if (s.done) continue;
      OptEnd o;
      if (!s.claimed && s.placeholder_expiry && *s.placeholder_expiry <= now_) {
        o.allowed.insert(R::kExpired);
        o.must = on_timer;
      }
      if (s.ready && s.ready_at + kTimeout <= now_) {
        o.allowed.insert(R::kExpired);
        if (s.pristine) o.must = on_timer;  // nobody pulled: it must expire
      }
      for (const auto& [k, item] : items_) {
        if (item.t == t && !item.writing && item.deadline <= now_) {
          o.allowed.insert(R::kDeadline);
          o.must = on_timer;
        }
      }
      if (!o.allowed.empty()) opt_[t] = o;
    }
  }

  void Collect() {
    acts_.clear();
    while (std::optional<SendAction> a = table_.PollAction()) acts_.push_back(*a);
  }

  void ExpectStatus(const Status& st, const std::vector<StatusCode>& want) {
    if (std::find(want.begin(), want.end(), st.code()) == want.end()) {
      std::string w;
      for (StatusCode c : want) w += std::string(StatusCodeName(c)) + " ";
      Fail("returned " + st.ToString() + ", want one of: " + w);
    }
  }

  void Fail(const std::string& msg) const {
    RC_FAIL("input #" + std::to_string(input_) + " [" + what_ + "] at " +
            Name(now_) + ": " + msg);
  }

  // Applies an optional end the table chose, if the rules allow it.
  bool TryOptionalEnd(TransferId t, R reason) {
    auto o = opt_.find(t);
    auto s = sends_.find(t);
    if (o == opt_.end() || s == sends_.end() || s->second.done) return false;
    if (o->second.allowed.count(reason) == 0) return false;
    End(t, reason);
    return true;
  }

  void Match() {
    for (const SendAction& a : acts_) {
      if (const auto* ap = std::get_if<AnswerPull>(&a)) {
        OnAnswer(*ap);
      } else if (const auto* sw = std::get_if<StartWrite>(&a)) {
        OnStartWrite(*sw);
      } else {
        OnFinished(std::get<SendFinished>(a));
      }
    }
  }

  void OnAnswer(const AnswerPull& a) {
    const Key k{a.peer, a.pull_seq, a.transfer};
    auto is = issued_.find(k);
    if (is == issued_.end()) Fail("answer for an item never pulled: " + Name(k));
    if (is->second != 0) Fail(Name(k) + " answered twice (again " + Name(a.result) + ")");
    auto e = exp_ans_.find(k);
    if (e == exp_ans_.end()) {
      auto it = items_.find(k);
      if (it != items_.end() && it->second.writing) {
        Fail(Name(k) + " answered " + Name(a.result) + " while its write is in flight");
      }
      if (it != items_.end() && TryOptionalEnd(k.t, a.result)) e = exp_ans_.find(k);
    }
    if (e == exp_ans_.end()) {
      Fail("unexpected answer " + Name(k) + " " + Name(a.result));
    }
    const std::vector<R>& allowed = e->second;
    if (!allowed.empty() &&
        std::find(allowed.begin(), allowed.end(), a.result) == allowed.end()) {
      Fail(Name(k) + " answered " + Name(a.result) + ", want " + Names(allowed));
    }
    if (a.result == R::kOk && ok_answer_ != k && !allowed.empty() &&
        std::find(allowed.begin(), allowed.end(), R::kOk) == allowed.end()) {
      Fail(Name(k) + " answered ok without a successful write");
    }
    exp_ans_.erase(e);
    is->second++;
  }

  void OnStartWrite(const StartWrite& w) {
    const Key k{w.peer, w.pull_seq, w.transfer};
    auto it = items_.find(k);
    if (it == items_.end()) Fail("StartWrite for an item not waiting: " + Name(k));
    MItem& item = it->second;
    if (item.writing) Fail("second StartWrite for " + Name(k));
    auto s = sends_.find(k.t);
    if (s == sends_.end() || s->second.done || !s->second.ready) {
      Fail("StartWrite for " + Name(k) + " but its send is not READY");
    }
    if (!(now_ < item.deadline)) {
      Fail("StartWrite for " + Name(k) + " at/after its deadline " + Name(item.deadline));
    }
    if (w.deadline != item.deadline) Fail("StartWrite deadline of " + Name(k));
    if (w.dst != item.dst) Fail("StartWrite dst of " + Name(k));
    if (w.src != s->second.blocks) Fail("StartWrite src of " + Name(k));
    if (writes_.size() >= workers_) Fail("StartWrite beyond num_workers");
    if (writes_.count(w.write)) Fail("StartWrite reuses a write id in flight");
    for (const auto& [k2, other] : items_) {
      if (other.t == k.t && !other.writing && other.order < item.order) {
        Fail("StartWrite for " + Name(k) + " ahead of earlier pull " + Name(k2));
      }
    }
    item.writing = true;
    item.write = w.write;
    s->second.writes++;
    writes_[w.write] = k;
  }

  void OnFinished(const SendFinished& f) {
    auto match = [&] {
      for (auto it = exp_fin_.begin(); it != exp_fin_.end(); ++it) {
        if (it->first == f.transfer && (!it->second || *it->second == f.reason)) {
          exp_fin_.erase(it);
          return true;
        }
      }
      return false;
    };
    if (!match()) {
      if (!TryOptionalEnd(f.transfer, f.reason) || !match()) {
        Fail("unexpected SendFinished(" + Name(f.transfer) + ", " + Name(f.reason) + ")");
      }
    }
    for (const auto& [w, k] : writes_) {
      if (k.t == f.transfer) Fail("SendFinished(" + Name(f.transfer) + ") while a write reads it");
    }
    if (++finished_[f.transfer] > ready_ok_[f.transfer]) {
      Fail("SendFinished(" + Name(f.transfer) + ") with no accepted Ready() owing it");
    }
  }

  void Finish() {
    // Ends the table made silently (no waiting item, a write in flight).
    std::vector<TransferId> silent;
    for (const auto& [t, o] : opt_) {
      auto s = sends_.find(t);
      if (s == sends_.end() || s->second.done) continue;
      std::optional<SendState> got = table_.StateOf(t);
      if (!got || *got == SendState::kDone) {
        silent.push_back(t);
      } else if (o.must) {
        std::string why;
        for (R r : o.allowed) why += Name(r) + " ";
        Fail(Name(t) + " should have ended by its timer (" + why + ")");
      }
    }
    if (!silent.empty()) {
      // Which reasons did the table record that the model has not seen?
      std::multiset<R> extra;
      for (int r = 0; r < kTransferResultCount; ++r) {
        uint64_t d = table_.stats().ends[r] - stats_before_.ends[r];
        for (uint64_t i = 0; i < d; ++i) extra.insert(static_cast<R>(r));
      }
      for (R r : model_end_reasons_) {
        auto it = extra.find(r);
        if (it != extra.end()) extra.erase(it);
      }
      for (TransferId t : silent) {
        std::optional<R> reason;
        if (silent.size() == 1 && extra.size() == 1) reason = *extra.begin();
        if (reason && opt_[t].allowed.count(*reason) == 0) {
          Fail(Name(t) + " ended " + Name(*reason) + ", not allowed now");
        }
        End(t, reason);
      }
    }
    if (!exp_ans_.empty()) {
      std::string m;
      for (const auto& [k, rs] : exp_ans_) m += Name(k) + Names(rs) + " ";
      Fail("items not answered: " + m);
    }
    if (!exp_fin_.empty()) {
      std::string m;
      for (const auto& [t, r] : exp_fin_) m += Name(t) + (r ? "/" + Name(*r) : "") + " ";
      Fail("SendFinished missing: " + m);
    }
    uint64_t ends = 0;
    for (int r = 0; r < kTransferResultCount; ++r) {
      ends += table_.stats().ends[r] - stats_before_.ends[r];
    }
    if (ends != model_ends_) {
      Fail("stats().ends grew by " + std::to_string(ends) + ", model ended " +
           std::to_string(model_ends_));
    }
    CompareObservables();
  }

  void CompareObservables() {
    table_.CheckInvariants();
    for (int id = 0; id < kIds; ++id) {
      const TransferId t = Tid(id);
      std::optional<SendState> want;
      if (auto s = sends_.find(t); s != sends_.end()) {
        want = s->second.done    ? SendState::kDone
               : s->second.ready ? SendState::kReady
                                 : SendState::kWaiting;
      }
      std::optional<SendState> got = table_.StateOf(t);
      if (got != want) {
        Fail("StateOf(" + Name(t) + ") = " +
             (got ? std::to_string(static_cast<int>(*got)) : "none") + ", model " +
             (want ? std::to_string(static_cast<int>(*want)) : "none"));
      }
      const bool has = table_.HasTombstone(t);
      auto tb = tombs_.find(t);
      if (tb == tombs_.end()) {
        if (has) Fail(Name(t) + " has a tombstone the model does not");
      } else if (!has) {
        if (TombCertain(tb->second)) Fail(Name(t) + " lost its tombstone early");
        tombs_.erase(tb);  // aged out
      } else if (last_timer_ > tb->second.last_touch + kTombTtl) {
        Fail(Name(t) + " tombstone outlived abort_timeout + giveup_grace");
      }
    }
    size_t queued = 0;
    std::map<TransferId, int> admissible;
    for (const auto& [k, item] : items_) {
      const MSend& s = sends_.at(item.t);
      if (item.writing || !s.ready || s.done) continue;
      ++queued;
      if (item.deadline > now_ &&
          s.pulled + static_cast<uint32_t>(s.writes) < s.need) {
        admissible[item.t]++;
      }
    }
    if (table_.live_sends() != sends_.size()) {
      Fail("live_sends() " + std::to_string(table_.live_sends()) + ", model " +
           std::to_string(sends_.size()));
    }
    if (table_.live_pull_items() != items_.size()) {
      Fail("live_pull_items() " + std::to_string(table_.live_pull_items()) +
           ", model " + std::to_string(items_.size()));
    }
    if (table_.writes_in_flight() != writes_.size()) Fail("writes_in_flight() disagrees");
    if (table_.queued_for_sender() != queued) {
      Fail("queued_for_sender() " + std::to_string(table_.queued_for_sender()) +
           ", model " + std::to_string(queued));
    }
    if (writes_.size() < workers_ && !admissible.empty()) {
      Fail("a sender is idle while " + Name(admissible.begin()->first) +
           " has an admissible pull waiting");
    }
  }

  // --- state ----------------------------------------------------------------

  SendTable table_;
  const uint32_t workers_;
  Instant now_ = Instant::Epoch();
  Instant last_timer_ = Instant::Epoch();
  int input_ = 0;
  std::string what_;

  std::map<TransferId, MSend> sends_;  // live and DONE-lingering
  std::map<TransferId, MTomb> tombs_;
  std::map<Key, MItem> items_;         // unanswered items
  std::map<Key, int> issued_;          // every item ever pulled -> answers
  std::map<TransferId, bool> pending_ready_;  // claim accepted, Ready() owed
  std::map<TransferId, int> ready_ok_;
  std::map<TransferId, int> finished_;
  std::map<WriteId, Key> writes_;
  std::vector<WriteId> done_writes_;
  uint64_t next_seq_[kPeers] = {};
  uint64_t next_order_ = 0;
  uint32_t next_src_ = 100;
  uint32_t next_dst_ = 10000;

  // Per input.
  std::vector<SendAction> acts_;
  SendTableStats stats_before_;
  std::map<Key, std::vector<R>> exp_ans_;  // empty vector: any result
  std::vector<std::pair<TransferId, std::optional<R>>> exp_fin_;
  std::map<TransferId, OptEnd> opt_;
  uint64_t model_ends_ = 0;
  std::vector<R> model_end_reasons_;
  std::optional<Key> ok_answer_;
};

// ---------------------------------------------------------------------------
// Commands. The rapidcheck model only drives generation; the reference
// model lives in the Sut because write ids come from the table.

struct GenModel {};
using Cmd = rc::state::Command<GenModel, Sut>;

rc::Gen<int> GenId() { return rc::gen::inRange(0, kIds); }

struct ClaimCmd : Cmd {
  int id = *GenId();
  uint32_t need = *rc::gen::inRange<uint32_t>(1, 3);
  uint64_t prompt = *rc::gen::weightedElement<uint64_t>({{1, 0}, {4, 1}, {2, 2}});
  void run(const GenModel&, Sut& sut) const override { sut.Claim(id, need, prompt); }
  void show(std::ostream& os) const override {
    os << "Claim(T" << id << ", need " << need << ", prompt " << prompt << ")";
  }
};

struct ReadyCmd : Cmd {
  int id = *GenId();
  bool force = *rc::gen::weightedElement<bool>({{1, true}, {7, false}});
  bool empty = *rc::gen::weightedElement<bool>({{1, true}, {15, false}});
  void run(const GenModel&, Sut& sut) const override { sut.Ready(id, force, empty); }
  void show(std::ostream& os) const override {
    os << "Ready(T" << id << (force ? ", force" : "") << (empty ? ", no blocks" : "")
       << ")";
  }
};

struct PullCmd : Cmd {
  int peer = *rc::gen::inRange(0, kPeers);
  std::vector<Sut::PullSpec> items = [] {
    const int n = *rc::gen::inRange(1, 4);
    std::vector<Sut::PullSpec> v;
    for (int i = 0; i < n; ++i) {
      Sut::PullSpec sp;
      sp.id = *GenId();
      sp.release = *rc::gen::weightedElement<bool>({{1, true}, {7, false}});
      sp.prompt_hash = *rc::gen::weightedElement<uint64_t>({{3, 0}, {4, 1}, {1, 2}});
      v.push_back(sp);
    }
    return v;
  }();
  void run(const GenModel&, Sut& sut) const override { sut.Pull(peer, items); }
  void show(std::ostream& os) const override {
    os << "Pull(P" << peer + 1 << ":";
    for (const Sut::PullSpec& sp : items) {
      if (sp.release) {
        os << " rel:T" << sp.id;
      } else {
        os << " T" << sp.id << "/" << sp.prompt_hash;
      }
    }
    os << ")";
  }
};

struct AbortCmd : Cmd {
  int id = *GenId();
  void run(const GenModel&, Sut& sut) const override { sut.Abort(id); }
  void show(std::ostream& os) const override { os << "Abort(T" << id << ")"; }
};

struct ReleaseHeldCmd : Cmd {
  void run(const GenModel&, Sut& sut) const override { sut.ReleaseHeld(); }
  void show(std::ostream& os) const override { os << "ReleaseHeld()"; }
};

struct CompleteWriteCmd : Cmd {
  size_t pick = *rc::gen::inRange<size_t>(0, 8);
  bool ok = *rc::gen::weightedElement<bool>({{3, true}, {1, false}});
  void run(const GenModel&, Sut& sut) const override { sut.CompleteWrite(pick, ok); }
  void show(std::ostream& os) const override {
    os << "CompleteWrite(#" << pick << (ok ? ", ok" : ", FAIL") << ")";
  }
};

struct StaleWriteDoneCmd : Cmd {
  size_t pick = *rc::gen::inRange<size_t>(0, 8);
  bool in_flight = *rc::gen::arbitrary<bool>();
  void run(const GenModel&, Sut& sut) const override { sut.StaleWriteDone(pick, in_flight); }
  void show(std::ostream& os) const override {
    os << "StaleWriteDone(#" << pick << (in_flight ? ", wrong generation" : ", repeat")
       << ")";
  }
};

struct AdvanceTimeCmd : Cmd {
  int64_t ns = *rc::gen::oneOf(
      rc::gen::element<int64_t>(0, 1, Duration::Seconds(1).ns(), Duration::Seconds(1).ns(),
                                Duration::Seconds(2).ns(), Duration::Seconds(3).ns(),
                                (kTimeout / 2).ns(),
                                (kTimeout - Duration::Nanoseconds(1)).ns(), kTimeout.ns(),
                                (kTimeout + Duration::Nanoseconds(1)).ns(), kTombTtl.ns()),
      rc::gen::inRange<int64_t>(0, kTimeout.ns()));
  bool timer = *rc::gen::weightedElement<bool>({{7, true}, {1, false}});
  void run(const GenModel&, Sut& sut) const override {
    sut.Advance(Duration::Nanoseconds(ns), timer);
  }
  void show(std::ostream& os) const override {
    os << "AdvanceTime(" << ns << "ns" << (timer ? ", OnTimer" : ", no timer") << ")";
  }
};

RC_GTEST_PROP(SendTableProperty, AgreesWithModelAndDrains, ()) {
  const uint32_t workers = *rc::gen::inRange<uint32_t>(1, 3);
  Sut sut(workers);
  // Weights by repetition: mostly claims, readies, pulls and completions,
  // so transfers live long enough to collide; aborts and ReleaseHeld are rare.
  const auto gen_command = rc::state::gen::execOneOfWithArgs<
      ClaimCmd, ClaimCmd, ClaimCmd, ClaimCmd, ReadyCmd, ReadyCmd, ReadyCmd, ReadyCmd,
      PullCmd, PullCmd, PullCmd, PullCmd, PullCmd, CompleteWriteCmd, CompleteWriteCmd,
      CompleteWriteCmd, CompleteWriteCmd, CompleteWriteCmd, AbortCmd, ReleaseHeldCmd,
      StaleWriteDoneCmd, AdvanceTimeCmd, AdvanceTimeCmd, AdvanceTimeCmd>();
  // Sequences of 1 to ~70 commands (about 35 on average).
  const auto commands = *rc::gen::withSize([&](int size) {
    return rc::gen::resize(std::clamp(size, 40, 70),
                           rc::state::gen::commands(GenModel{}, gen_command));
  });
  rc::state::runAll(commands, GenModel{}, sut);
  sut.DrainAndCheckFinal();
}

}  // namespace
}  // namespace kvrelay
