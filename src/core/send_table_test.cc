// send_table_test.cc — table-driven tests of SendTable, P's side of every
// KV hand-off.
//
// A Harness drives one SendTable, drains every action after each input and
// checks the universal properties on the fly:
//   * every (peer, pull_seq, transfer) item is answered at most once, and
//     never while its own write is in flight;
//   * kOk answers a non-release item only in the input that completed its
//     write successfully (kOk means "the KV landed");
//   * StartWrite names a known, unanswered, not-yet-started item, copies the
//     blocks Ready() handed over into the item's destination, carries the
//     item's deadline (arrival + abort_timeout), never starts at or after
//     that deadline, and never exceeds num_workers writes in flight;
//   * SendFinished is emitted at most once per accepted Ready(), never for a
//     transfer whose Ready() was refused, and never while a write of that
//     transfer is in flight;
//   * CheckInvariants() holds after every input and writes_in_flight()
//     agrees with the harness.
// At the end of each case the harness requires quiescence: every item
// answered exactly once, SendFinished exactly once per accepted Ready(), no
// write in flight.
//
// The cases are a table of steps (inputs and expectations) covering every
// ordering the Mooncake "answer every pull" PR names, plus a cross-product
// test over all permutations of a small event set.
#include "core/send_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <ostream>
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

// Printers so gtest messages are readable.
inline void PrintTo(TransferResult r, std::ostream* os) {
  *os << TransferResultName(r);
}
inline void PrintTo(StatusCode c, std::ostream* os) {
  *os << StatusCodeName(c);
}
inline void PrintTo(SendState s, std::ostream* os) {
  *os << SendStateName(s);
}
inline void PrintTo(const Instant& t, std::ostream* os) {
  *os << t.ns() << "ns";
}

namespace {

constexpr Duration kTimeout = Duration::Seconds(10);  // abort_timeout
constexpr Duration kGrace = Duration::Seconds(6);     // giveup_grace
constexpr Duration kNs = Duration::Nanoseconds(1);

Instant S(int64_t seconds) { return Instant::Epoch() + Duration::Seconds(seconds); }
Instant Ms(int64_t millis) {
  return Instant::Epoch() + Duration::Milliseconds(millis);
}

TransferId Tid(uint64_t n) { return TransferId{0x5eedULL, n}; }
PeerId Peer(uint32_t n) { return PeerId{n, 1}; }

const TransferId A = Tid(1);
const TransferId B = Tid(2);
const TransferId C = Tid(3);
const TransferId D = Tid(4);
const TransferId E = Tid(5);
const PeerId P1 = Peer(1);
const PeerId P2 = Peer(2);

std::string Name(TransferId t) { return "T" + std::to_string(t.lo); }
std::string Name(TransferResult r) { return std::string(TransferResultName(r)); }

SendTableOptions Opts(uint32_t workers = 4) {
  SendTableOptions o;
  o.abort_timeout = kTimeout;
  o.giveup_grace = kGrace;
  o.num_workers = workers;
  return o;
}

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

// One transfer named in a Pull: nblocks == 0 is a release.
struct Spec {
  TransferId t;
  int nblocks = 2;
  uint64_t prompt_hash = 0;  // 0: not checked
};
Spec Pi(TransferId t, int n = 2) { return Spec{t, n, 0}; }
Spec PiH(TransferId t, uint64_t hash) { return Spec{t, 2, hash}; }
Spec Rel(TransferId t) { return Spec{t, 0, 0}; }

// ---------------------------------------------------------------------------
// The harness.

class Harness {
 public:
  struct ItemRec {
    bool release = false;
    std::vector<BlockId> dst;
    Instant arrived;
    int answers = 0;
    TransferResult result = TransferResult::kOk;
    int answered_input = -1;
    bool started = false;  // a StartWrite was issued for it
    bool writing = false;  // ... and its WriteDone was not delivered yet
    WriteId write;
    int started_input = -1;
  };
  struct XferRec {
    int ready_ok = 0;   // accepted Ready() calls
    int finished = 0;   // SendFinished actions seen
    std::vector<BlockId> blocks;
    int writes = 0;     // writes in flight
    TransferResult reason = TransferResult::kOk;
    int finished_input = -1;
  };

  explicit Harness(const SendTableOptions& o) : opts_(o), table_(o) {}

  SendTable& table() { return table_; }
  Instant now() const { return now_; }
  int input() const { return input_; }
  const std::vector<SendAction>& last() const { return last_; }
  const std::map<Key, ItemRec>& items() const { return items_; }
  const std::map<TransferId, XferRec>& xfers() const { return xfers_; }
  const std::map<WriteId, Key>& writes() const { return writes_; }

  bool HasItem(const Key& k) const { return items_.count(k) != 0; }
  const ItemRec& item(const Key& k) const {
    static const ItemRec kNone;
    auto it = items_.find(k);
    if (it == items_.end()) {
      ADD_FAILURE() << "test bug: no item " << Name(k);
      return kNone;
    }
    return it->second;
  }
  const XferRec& xfer(TransferId t) { return xfers_[t]; }

  void SetTime(Instant t) {
    EXPECT_GE(t.ns(), now_.ns()) << "test bug: time goes backwards";
    now_ = t;
  }
  void Timer() {
    table_.OnTimer(now_);
    AfterInput();
  }
  Status Claim(TransferId t, uint32_t need, uint64_t prompt_hash = 0) {
    Status s = table_.Claim(t, need, now_, prompt_hash);
    AfterInput();
    return s;
  }
  Status Ready(TransferId t, int nblocks) {
    std::vector<BlockId> blocks;
    for (int i = 0; i < nblocks; ++i) blocks.push_back(BlockId{next_src_++, 1});
    // Record before draining: StartWrite may be emitted by this very input.
    XferRec& x = xfers_[t];
    std::vector<BlockId> old = x.blocks;
    x.blocks = blocks;
    x.ready_ok++;
    Status s = table_.Ready(t, blocks, now_);
    if (!s.ok()) {
      x.ready_ok--;
      x.blocks = old;
    }
    AfterInput();
    return s;
  }
  void Pull(PeerId peer, uint64_t seq, const std::vector<Spec>& specs) {
    std::vector<PullItem> items;
    for (const Spec& sp : specs) {
      PullItem pi;
      pi.transfer = sp.t;
      pi.prompt_hash = sp.prompt_hash;
      for (int i = 0; i < sp.nblocks; ++i) {
        pi.dst.push_back(BlockId{next_dst_++, 7});
      }
      Key k{peer, seq, sp.t};
      if (items_.count(k) != 0) ADD_FAILURE() << "test bug: reused " << Name(k);
      ItemRec rec;
      rec.release = pi.dst.empty();
      rec.dst = pi.dst;
      rec.arrived = now_;
      items_[k] = rec;
      items.push_back(std::move(pi));
    }
    table_.Pull(peer, seq, items, now_);
    AfterInput();
  }
  void Abort(TransferId t) {
    table_.Abort(t, now_);
    AfterInput();
  }
  void ReleaseHeld() {
    table_.ReleaseHeld(now_);
    AfterInput();
  }
  // Completes the write serving item `k`.
  void Done(Key k, bool ok) {  // by value: k may live in writes_
    auto it = items_.find(k);
    if (it == items_.end() || !it->second.writing) {
      ADD_FAILURE() << "test bug or missing StartWrite: " << Name(k)
                    << " has no write in flight";
      return;
    }
    ItemRec& r = it->second;
    r.writing = false;
    xfers_[k.t].writes--;
    writes_.erase(r.write);
    completed_ok_ = ok ? std::optional<Key>(k) : std::nullopt;
    table_.WriteDone(r.write, ok, now_);
    AfterInput();
  }
  // Delivers a WriteDone without any bookkeeping (stale ids).
  void RawWriteDone(WriteId w, bool ok) {
    table_.WriteDone(w, ok, now_);
    AfterInput();
  }

  // Universal end-of-case checks.
  void ExpectQuiescent() {
    EXPECT_TRUE(writes_.empty()) << "case left writes in flight";
    for (const auto& [k, r] : items_) {
      EXPECT_EQ(r.answers, 1) << Name(k) << " answered " << r.answers
                              << " times";
    }
    for (const auto& [t, x] : xfers_) {
      EXPECT_EQ(x.finished, x.ready_ok)
          << Name(t) << ": SendFinished " << x.finished << " times for "
          << x.ready_ok << " accepted Ready()";
    }
  }

  // Completes every write in flight (ok), repeatedly, then lets every timer
  // fire; used by tests that only check universal properties.
  void Drain() {
    for (int round = 0; round < 4; ++round) {
      while (!writes_.empty()) Done(writes_.begin()->second, true);
      SetTime(now_ + (kTimeout + kGrace) * 2);
      Timer();
    }
    while (!writes_.empty()) Done(writes_.begin()->second, true);
    EXPECT_EQ(table_.live_sends(), 0u);
    EXPECT_EQ(table_.live_pull_items(), 0u);
    EXPECT_EQ(table_.writes_in_flight(), 0u);
    EXPECT_EQ(table_.queued_for_sender(), 0u);
  }

 private:
  void AfterInput() {
    ++input_;
    last_.clear();
    while (std::optional<SendAction> a = table_.PollAction()) {
      last_.push_back(*a);
      std::visit([&](const auto& act) { Handle(act); }, *a);
    }
    completed_ok_.reset();
    table_.CheckInvariants();
    EXPECT_EQ(table_.writes_in_flight(), writes_.size())
        << "writes_in_flight() disagrees with the StartWrites seen";
    EXPECT_LE(writes_.size(), opts_.num_workers);
  }

  void Handle(const AnswerPull& a) {
    Key k{a.peer, a.pull_seq, a.transfer};
    auto it = items_.find(k);
    if (it == items_.end()) {
      ADD_FAILURE() << "AnswerPull for an item never pulled: " << Name(k);
      return;
    }
    ItemRec& r = it->second;
    if (r.answers > 0) {
      ADD_FAILURE() << Name(k) << " answered twice: first "
                    << Name(r.result) << ", again " << Name(a.result);
    }
    if (r.writing) {
      ADD_FAILURE() << Name(k) << " answered " << Name(a.result)
                    << " while its write is still in flight";
    }
    if (a.result == TransferResult::kOk && !r.release &&
        completed_ok_ != k) {
      ADD_FAILURE() << Name(k)
                    << " answered ok without a successful write of it";
    }
    r.answers++;
    r.result = a.result;
    r.answered_input = input_ + 0;
  }

  void Handle(const StartWrite& w) {
    Key k{w.peer, w.pull_seq, w.transfer};
    auto it = items_.find(k);
    if (it == items_.end()) {
      ADD_FAILURE() << "StartWrite for an item never pulled: " << Name(k);
      return;
    }
    ItemRec& r = it->second;
    XferRec& x = xfers_[k.t];
    if (r.release) ADD_FAILURE() << "StartWrite for a release " << Name(k);
    if (r.answers > 0) {
      ADD_FAILURE() << "StartWrite for already answered " << Name(k);
    }
    if (r.started) ADD_FAILURE() << "second StartWrite for " << Name(k);
    if (x.ready_ok <= x.finished) {
      ADD_FAILURE() << "StartWrite for " << Name(k)
                    << " but P holds no blocks for it";
    }
    // D may already hold a prefix of the prompt and ask for the tail only:
    // the source is the last dst.size() blocks handed over by Ready().
    if (w.dst.size() > x.blocks.size()) {
      ADD_FAILURE() << "StartWrite for " << Name(k) << " has more dst blocks ("
                    << w.dst.size() << ") than P holds (" << x.blocks.size()
                    << ")";
    } else {
      std::vector<BlockId> tail(x.blocks.end() - static_cast<std::ptrdiff_t>(w.dst.size()),
                                x.blocks.end());
      EXPECT_EQ(w.src, tail) << "StartWrite src of " << Name(k);
    }
    EXPECT_EQ(w.dst, r.dst) << "StartWrite dst of " << Name(k);
    EXPECT_EQ(w.deadline, r.arrived + opts_.abort_timeout)
        << "StartWrite deadline of " << Name(k);
    if (!(now_ < r.arrived + opts_.abort_timeout)) {
      ADD_FAILURE() << "StartWrite for " << Name(k) << " at " << now_.ns()
                    << "ns, at/after its deadline "
                    << (r.arrived + opts_.abort_timeout).ns() << "ns";
    }
    if (writes_.size() >= opts_.num_workers) {
      ADD_FAILURE() << "StartWrite for " << Name(k) << " exceeds num_workers";
    }
    if (writes_.count(w.write) != 0) {
      ADD_FAILURE() << "StartWrite reuses a write id in flight";
    }
    r.started = true;
    r.writing = true;
    r.write = w.write;
    r.started_input = input_;
    x.writes++;
    writes_[w.write] = k;
  }

  void Handle(const SendFinished& f) {
    XferRec& x = xfers_[f.transfer];
    if (x.ready_ok <= x.finished) {
      ADD_FAILURE() << "SendFinished(" << Name(f.transfer) << ", "
                    << Name(f.reason) << ") but no accepted Ready() owes it"
                    << " (ready_ok=" << x.ready_ok
                    << " finished=" << x.finished << ")";
    }
    if (x.writes != 0) {
      ADD_FAILURE() << "SendFinished(" << Name(f.transfer) << ") while "
                    << x.writes << " write(s) still read its blocks";
    }
    x.finished++;
    x.reason = f.reason;
    x.finished_input = input_;
  }

  SendTableOptions opts_;
  SendTable table_;
  Instant now_ = Instant::Epoch();
  int input_ = 0;
  uint32_t next_src_ = 1000;
  uint32_t next_dst_ = 5000;
  std::vector<SendAction> last_;
  std::optional<Key> completed_ok_;
  std::map<Key, ItemRec> items_;
  std::map<TransferId, XferRec> xfers_;
  std::map<WriteId, Key> writes_;
};

// ---------------------------------------------------------------------------
// Steps of a table case.

struct Step {
  std::string what;
  std::function<void(Harness&)> fn;
};

// --- inputs ---

Step At(Instant t) {
  return {"at " + std::to_string(t.ns()) + "ns", [t](Harness& h) { h.SetTime(t); }};
}
Step Timer() {
  return {"OnTimer", [](Harness& h) { h.Timer(); }};
}
Step TimerAt(Instant t) {
  return {"OnTimer at " + std::to_string(t.ns()) + "ns", [t](Harness& h) {
            h.SetTime(t);
            h.Timer();
          }};
}
Step ClaimH(TransferId t, uint32_t need, uint64_t prompt_hash,
            StatusCode want = StatusCode::kOk) {
  return {"Claim " + Name(t) + " need " + std::to_string(need) + " prompt " +
              std::to_string(prompt_hash),
          [=](Harness& h) {
            Status s = h.Claim(t, need, prompt_hash);
            EXPECT_EQ(s.code(), want) << "Claim(" << Name(t) << "): " << s.ToString();
          }};
}
Step Claim(TransferId t, uint32_t need = 1, StatusCode want = StatusCode::kOk) {
  return ClaimH(t, need, 0, want);
}
Step Ready(TransferId t, StatusCode want = StatusCode::kOk, int nblocks = 2) {
  return {"Ready " + Name(t), [=](Harness& h) {
            Status s = h.Ready(t, nblocks);
            EXPECT_EQ(s.code(), want) << "Ready(" << Name(t) << "): " << s.ToString();
          }};
}
Step Pull(PeerId p, uint64_t seq, std::vector<Spec> specs) {
  std::string what = "Pull P" + std::to_string(p.index) + " #" + std::to_string(seq);
  for (const Spec& s : specs) what += (s.nblocks == 0 ? " rel:" : " ") + Name(s.t);
  return {what, [=](Harness& h) { h.Pull(p, seq, specs); }};
}
Step Abort(TransferId t) {
  return {"Abort " + Name(t), [=](Harness& h) { h.Abort(t); }};
}
Step ReleaseHeld() {
  return {"ReleaseHeld", [](Harness& h) { h.ReleaseHeld(); }};
}
Step Done(PeerId p, uint64_t seq, TransferId t, bool ok = true) {
  Key k{p, seq, t};
  return {"WriteDone " + Name(k) + (ok ? " ok" : " FAILED"),
          [=](Harness& h) { h.Done(k, ok); }};
}
// A WriteDone naming the item's write with a wrong generation.
Step StaleWriteDone(PeerId p, uint64_t seq, TransferId t) {
  Key k{p, seq, t};
  return {"stale WriteDone " + Name(k), [=](Harness& h) {
            WriteId w = h.item(k).write;
            w.generation += 1;
            h.RawWriteDone(w, true);
          }};
}
// The item's own write id, delivered again after it completed.
Step DuplicateWriteDone(PeerId p, uint64_t seq, TransferId t) {
  Key k{p, seq, t};
  return {"duplicate WriteDone " + Name(k), [=](Harness& h) {
            ASSERT_TRUE(h.item(k).started);
            ASSERT_FALSE(h.item(k).writing);
            h.RawWriteDone(h.item(k).write, true);
          }};
}

// --- expectations ---

Step Answered(PeerId p, uint64_t seq, TransferId t,
              std::vector<TransferResult> allowed, bool now = false) {
  Key k{p, seq, t};
  std::string what = "expect " + Name(k) + " answered";
  for (TransferResult r : allowed) what += " " + Name(r);
  if (now) what += " in the last input";
  return {what, [=](Harness& h) {
            const Harness::ItemRec& r = h.item(k);
            ASSERT_EQ(r.answers, 1) << Name(k) << " not answered exactly once";
            if (!allowed.empty()) {
              EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), r.result) !=
                          allowed.end())
                  << Name(k) << " answered " << Name(r.result);
            }
            if (now) {
              EXPECT_EQ(r.answered_input, h.input())
                  << Name(k) << " was not answered by the last input";
            }
          }};
}
Step AnsweredNow(PeerId p, uint64_t seq, TransferId t, TransferResult r) {
  return Answered(p, seq, t, {r}, true);
}
Step AnsweredAnyNow(PeerId p, uint64_t seq, TransferId t) {
  return Answered(p, seq, t, {}, true);
}
Step Unanswered(PeerId p, uint64_t seq, TransferId t) {
  Key k{p, seq, t};
  return {"expect " + Name(k) + " unanswered", [=](Harness& h) {
            EXPECT_EQ(h.item(k).answers, 0)
                << Name(k) << " answered " << Name(h.item(k).result);
          }};
}
Step Writing(PeerId p, uint64_t seq, TransferId t) {
  Key k{p, seq, t};
  return {"expect " + Name(k) + " writing", [=](Harness& h) {
            EXPECT_TRUE(h.item(k).started) << Name(k) << " got no StartWrite";
            EXPECT_TRUE(h.item(k).writing) << Name(k) << " write not in flight";
          }};
}
Step NotStarted(PeerId p, uint64_t seq, TransferId t) {
  Key k{p, seq, t};
  return {"expect " + Name(k) + " no StartWrite", [=](Harness& h) {
            EXPECT_FALSE(h.item(k).started) << Name(k) << " got a StartWrite";
          }};
}
Step Finished(TransferId t, TransferResult reason, bool now = false) {
  return {"expect SendFinished " + Name(t) + " " + Name(reason) +
              (now ? " in the last input" : ""),
          [=](Harness& h) {
            const Harness::XferRec& x = h.xfer(t);
            ASSERT_EQ(x.finished, 1) << Name(t) << " SendFinished count";
            EXPECT_EQ(x.reason, reason);
            if (now) {
              EXPECT_EQ(x.finished_input, h.input())
                  << "SendFinished(" << Name(t) << ") not in the last input";
            }
          }};
}
Step FinishedOneOf(TransferId t, std::vector<TransferResult> reasons) {
  return {"expect SendFinished " + Name(t) + " once", [=](Harness& h) {
            const Harness::XferRec& x = h.xfer(t);
            ASSERT_EQ(x.finished, 1) << Name(t) << " SendFinished count";
            EXPECT_TRUE(std::find(reasons.begin(), reasons.end(), x.reason) !=
                        reasons.end())
                << Name(t) << " finished " << Name(x.reason);
          }};
}
Step FinishedNow(TransferId t, TransferResult reason) {
  return Finished(t, reason, true);
}
Step NotFinished(TransferId t) {
  return {"expect no SendFinished " + Name(t), [=](Harness& h) {
            EXPECT_EQ(h.xfer(t).finished, 0);
          }};
}
Step State(TransferId t, SendState s) {
  return {"expect state of " + Name(t), [=](Harness& h) {
            std::optional<SendState> got = h.table().StateOf(t);
            ASSERT_TRUE(got.has_value()) << Name(t) << " has no record";
            EXPECT_EQ(*got, s) << Name(t);
          }};
}
// Dropped: no record and no tombstone.
Step Gone(TransferId t) {
  return {"expect " + Name(t) + " dropped without tombstone", [=](Harness& h) {
            EXPECT_FALSE(h.table().StateOf(t).has_value()) << Name(t);
            EXPECT_FALSE(h.table().HasTombstone(t)) << Name(t);
          }};
}
// Ended: no live record, a tombstone.
Step Tomb(TransferId t) {
  return {"expect " + Name(t) + " tombstoned", [=](Harness& h) {
            EXPECT_FALSE(h.table().StateOf(t).has_value()) << Name(t);
            EXPECT_TRUE(h.table().HasTombstone(t)) << Name(t);
          }};
}
// Ended while a write is in flight: DONE record lingers, tombstone present.
Step DoneLingering(TransferId t) {
  return {"expect " + Name(t) + " DONE lingering + tombstone", [=](Harness& h) {
            std::optional<SendState> got = h.table().StateOf(t);
            EXPECT_TRUE(got.has_value() && *got == SendState::kDone) << Name(t);
            EXPECT_TRUE(h.table().HasTombstone(t)) << Name(t);
          }};
}
Step NoTomb(TransferId t) {
  return {"expect no tombstone " + Name(t), [=](Harness& h) {
            EXPECT_FALSE(h.table().HasTombstone(t)) << Name(t);
          }};
}
Step NoActions() {
  return {"expect no actions", [](Harness& h) {
            EXPECT_TRUE(h.last().empty())
                << h.last().size() << " action(s) from the last input";
          }};
}
Step Queued(size_t n) {
  return {"expect queued_for_sender " + std::to_string(n), [=](Harness& h) {
            EXPECT_EQ(h.table().queued_for_sender(), n);
          }};
}
Step InFlight(uint32_t n) {
  return {"expect writes_in_flight " + std::to_string(n), [=](Harness& h) {
            EXPECT_EQ(h.table().writes_in_flight(), n);
          }};
}
Step NextDeadline(std::optional<Instant> want) {
  return {"expect NextDeadline", [=](Harness& h) {
            std::optional<Instant> got = h.table().NextDeadline();
            ASSERT_EQ(got.has_value(), want.has_value());
            if (want) {
              EXPECT_EQ(got->ns(), want->ns());
            }
          }};
}
Step Stat(std::string name, uint64_t SendTableStats::*field, uint64_t want) {
  return {"expect stats." + name + " == " + std::to_string(want),
          [=](Harness& h) { EXPECT_EQ(h.table().stats().*field, want) << name; }};
}
Step Live(size_t sends, size_t items) {
  return {"expect live sends/items", [=](Harness& h) {
            EXPECT_EQ(h.table().live_sends(), sends);
            EXPECT_EQ(h.table().live_pull_items(), items);
          }};
}
// In the last input, the answers to `keys` all precede the first StartWrite.
Step AnsweredBeforeAnyWrite(std::vector<Key> keys) {
  return {"expect ended items answered before any write of the batch",
          [=](Harness& h) {
            size_t first_write = h.last().size();
            for (size_t i = 0; i < h.last().size(); ++i) {
              if (std::holds_alternative<StartWrite>(h.last()[i])) {
                first_write = i;
                break;
              }
            }
            EXPECT_LT(first_write, h.last().size()) << "no write in the batch";
            for (const Key& k : keys) {
              bool found = false;
              for (size_t i = 0; i < h.last().size(); ++i) {
                const auto* a = std::get_if<AnswerPull>(&h.last()[i]);
                if (a && Key{a->peer, a->pull_seq, a->transfer} == k) {
                  found = true;
                  EXPECT_LT(i, first_write)
                      << Name(k) << " answered after a StartWrite of its batch";
                }
              }
              EXPECT_TRUE(found) << Name(k) << " not answered in its batch";
            }
          }};
}

// ---------------------------------------------------------------------------
// The table.

using R = TransferResult;
using SC = StatusCode;

struct Case {
  std::string name;
  SendTableOptions opts;
  std::vector<Step> steps;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> v;

  // --- claim / ready / pull in each order -------------------------------
  v.push_back({"ClaimReadyPull", Opts(),
               {At(S(0)), Claim(A), At(S(1)), Ready(A), State(A, SendState::kReady),
                NoActions(), At(S(2)), Pull(P1, 1, {Pi(A)}), Writing(P1, 1, A),
                Unanswered(P1, 1, A), InFlight(1), At(S(3)), Done(P1, 1, A),
                AnsweredNow(P1, 1, A, R::kOk), FinishedNow(A, R::kOk), Gone(A),
                Live(0, 0)}});
  v.push_back({"ClaimPullReady", Opts(),
               {At(S(0)), Claim(A), At(S(1)), Pull(P1, 1, {Pi(A)}),
                Unanswered(P1, 1, A), NotStarted(P1, 1, A),
                State(A, SendState::kWaiting), At(S(2)), Ready(A),
                Writing(P1, 1, A), At(S(3)), Done(P1, 1, A),
                AnsweredNow(P1, 1, A, R::kOk), FinishedNow(A, R::kOk), Gone(A)}});
  v.push_back({"PullClaimReady_Placeholder", Opts(),
               {At(S(0)), Pull(P1, 1, {Pi(A)}), State(A, SendState::kWaiting),
                Unanswered(P1, 1, A), Stat("placeholders", &SendTableStats::placeholders, 1),
                At(S(1)), Claim(A), State(A, SendState::kWaiting),
                Unanswered(P1, 1, A), At(S(2)), Ready(A), Writing(P1, 1, A),
                At(S(3)), Done(P1, 1, A), AnsweredNow(P1, 1, A, R::kOk),
                FinishedNow(A, R::kOk), Gone(A)}});
  v.push_back({"ReadyBeforeClaimRefused", Opts(),
               {At(S(0)), Ready(A, SC::kFailedPrecondition), Gone(A),
                Claim(A), Pull(P1, 1, {Pi(A)}), Ready(A), Writing(P1, 1, A),
                Done(P1, 1, A), AnsweredNow(P1, 1, A, R::kOk),
                FinishedNow(A, R::kOk), Gone(A)}});
  v.push_back({"ReadyEmptyBlocksInvalid", Opts(),
               {Claim(A), Ready(A, SC::kInvalidArgument, 0),
                State(A, SendState::kWaiting), Ready(A), Pull(P1, 1, {Pi(A)}),
                Done(P1, 1, A), FinishedNow(A, R::kOk), Gone(A)}});

  // --- abort ----------------------------------------------------------
  v.push_back({"AbortBeforeClaim", Opts(),
               {At(S(0)), Abort(A), Tomb(A),
                Stat("aborts_unknown", &SendTableStats::aborts_unknown, 1),
                Claim(A, 1, SC::kCancelled), Tomb(A), At(S(1)),
                Pull(P1, 1, {Pi(A)}), AnsweredNow(P1, 1, A, R::kAborted), Tomb(A),
                Live(0, 0)}});
  v.push_back({"AbortPlaceholder", Opts(),
               {At(S(0)), Pull(P1, 1, {Pi(A)}), At(S(1)), Abort(A),
                AnsweredNow(P1, 1, A, R::kAborted), Tomb(A),
                Claim(A, 1, SC::kCancelled), Live(0, 0)}});
  v.push_back({"AbortWhileWaiting", Opts(),
               {At(S(0)), Claim(A), At(S(1)), Pull(P1, 1, {Pi(A)}), At(S(2)),
                Abort(A), AnsweredNow(P1, 1, A, R::kAborted), Tomb(A),
                At(S(3)), Ready(A, SC::kCancelled), NotFinished(A), Tomb(A),
                Live(0, 0)}});
  v.push_back({"AbortAfterReady", Opts(),
               {At(S(0)), Claim(A), At(S(1)), Ready(A), At(S(2)), Abort(A),
                FinishedNow(A, R::kAborted), Tomb(A), At(S(3)),
                Pull(P1, 1, {Pi(A)}), AnsweredNow(P1, 1, A, R::kAborted)}});
  v.push_back({"AbortDuringWrite", Opts(1),
               {At(S(0)), Claim(A, 2), Ready(A), At(S(1)), Pull(P1, 1, {Pi(A)}),
                Writing(P1, 1, A), Pull(P2, 1, {Pi(A)}), NotStarted(P2, 1, A),
                Queued(1), At(S(2)), Abort(A), AnsweredNow(P2, 1, A, R::kAborted),
                Unanswered(P1, 1, A), NotFinished(A), DoneLingering(A), Queued(0),
                At(S(3)), Done(P1, 1, A),
                Answered(P1, 1, A, {R::kOk, R::kAborted}, true),
                FinishedNow(A, R::kAborted), Tomb(A), Live(0, 0)}});

  // --- release (empty pull) --------------------------------------------
  v.push_back({"ReleaseBeforeClaim", Opts(),
               {At(S(0)), Pull(P1, 1, {Rel(A)}), AnsweredAnyNow(P1, 1, A), Tomb(A),
                Stat("releases", &SendTableStats::releases, 1), At(S(1)),
                Claim(A, 1, SC::kCancelled),
                Stat("claims_after_end", &SendTableStats::claims_after_end, 1),
                Pull(P1, 2, {Pi(A)}), AnsweredNow(P1, 2, A, R::kReleased),
                Live(0, 0)}});
  v.push_back({"ReleaseWhileWaiting", Opts(),
               {At(S(0)), Claim(A), At(S(1)), Pull(P1, 1, {Pi(A)}), At(S(2)),
                Pull(P1, 2, {Rel(A)}), AnsweredNow(P1, 1, A, R::kReleased),
                AnsweredAnyNow(P1, 2, A), Tomb(A), At(S(3)),
                Ready(A, SC::kCancelled), NotFinished(A)}});
  v.push_back({"ReleaseAfterReady", Opts(),
               {At(S(0)), Claim(A), Ready(A), At(S(1)), Pull(P1, 1, {Rel(A)}),
                AnsweredAnyNow(P1, 1, A), FinishedNow(A, R::kReleased), Tomb(A)}});
  v.push_back({"ReleaseDuringWrite", Opts(),
               {At(S(0)), Claim(A), Ready(A), At(S(1)), Pull(P1, 1, {Pi(A)}),
                Writing(P1, 1, A), At(S(2)), Pull(P1, 2, {Rel(A)}),
                AnsweredAnyNow(P1, 2, A), Unanswered(P1, 1, A), NotFinished(A),
                DoneLingering(A), At(S(3)), Done(P1, 1, A),
                Answered(P1, 1, A, {R::kOk, R::kReleased}, true),
                FinishedNow(A, R::kReleased), Tomb(A)}});

  // --- expiry -----------------------------------------------------------
  v.push_back({"ReadyExpiresOneTimeoutAfterReadyNotClaim", Opts(),
               {At(S(0)), Claim(A), At(S(5)), Ready(A), NextDeadline(S(15)),
                TimerAt(S(10)), NoActions(), State(A, SendState::kReady),
                TimerAt(S(15) - kNs), NoActions(), State(A, SendState::kReady),
                TimerAt(S(15)), FinishedNow(A, R::kExpired), Tomb(A),
                At(S(16)), Pull(P1, 1, {Pi(A)}), AnsweredNow(P1, 1, A, R::kExpired)}});
  v.push_back({"ClaimedWaitingNeverExpires", Opts(),
               {At(S(0)), Claim(A), TimerAt(S(10)), TimerAt(S(20)),
                TimerAt(S(1000)), NoActions(), State(A, SendState::kWaiting),
                NoTomb(A), Ready(A), TimerAt(S(1010) - kNs),
                State(A, SendState::kReady), TimerAt(S(1010)),
                FinishedNow(A, R::kExpired), Tomb(A)}});
  v.push_back({"PlaceholderExpiresOneTimeoutAfterPull", Opts(),
               {At(S(3)), Pull(P1, 1, {Pi(A)}), NextDeadline(S(13)),
                TimerAt(S(13) - kNs), Unanswered(P1, 1, A),
                State(A, SendState::kWaiting), TimerAt(S(13)),
                Answered(P1, 1, A, {R::kExpired, R::kDeadline}, true), Tomb(A),
                Claim(A, 1, SC::kCancelled), Live(0, 0)}});
  v.push_back({"NextDeadlineTracksEarliest", Opts(),
               {At(S(0)), NextDeadline(std::nullopt), Claim(A), At(S(5)), Ready(A),
                NextDeadline(S(15)), At(S(7)), Pull(P1, 1, {Pi(B)}),
                NextDeadline(S(15)), Abort(A), FinishedNow(A, R::kAborted),
                NextDeadline(S(17)), TimerAt(S(17)),
                Answered(P1, 1, B, {R::kExpired, R::kDeadline}, true)}});
  v.push_back({"TombstoneAgesOut", Opts(),
               {At(S(0)), Abort(A), Tomb(A), TimerAt(S(16) - kNs), Tomb(A),
                TimerAt(S(17)), Gone(A), Claim(A), State(A, SendState::kWaiting),
                Abort(A)}});
  {
    SendTableOptions o = Opts();
    o.max_tombstones = 2;
    v.push_back({"TombstonesBoundedByCount", o,
                 {Abort(A), Abort(B), Abort(C), NoTomb(A), Tomb(B), Tomb(C),
                  Stat("tombstones_evicted", &SendTableStats::tombstones_evicted, 1)}});
  }

  // --- release_held (a cache reset on P) --------------------------------
  // Only KV that finished requests hold for D is given back (kReset); the
  // transfers of requests P has not finished go on (lifecycle.md, rule 7).
  v.push_back({"ReleaseHeldEndsReadySendsOnly", Opts(),
               {At(S(0)), Pull(P1, 1, {Pi(A)}),            // A placeholder
                Claim(B), Pull(P1, 2, {Pi(B)}),              // B waiting + pull
                Claim(C), Ready(C),                          // C ready, unpulled
                Claim(D), Ready(D), Pull(P1, 3, {Pi(D)}),    // D write in flight
                Writing(P1, 3, D), At(S(1)), ReleaseHeld(),
                Unanswered(P1, 1, A), Unanswered(P1, 2, B),
                FinishedNow(C, R::kReset), NotFinished(D), Unanswered(P1, 3, D),
                NoTomb(A), NoTomb(B), Tomb(C), DoneLingering(D),
                State(A, SendState::kWaiting), State(B, SendState::kWaiting), At(S(2)),
                Ready(B), Writing(P1, 2, B), Done(P1, 3, D),
                Answered(P1, 3, D, {R::kOk, R::kReset}, true),
                FinishedNow(D, R::kReset), Tomb(D), Done(P1, 2, B),
                AnsweredNow(P1, 2, B, R::kOk), FinishedNow(B, R::kOk),
                Claim(A), Ready(A), Writing(P1, 1, A), Done(P1, 1, A),
                AnsweredNow(P1, 1, A, R::kOk), FinishedNow(A, R::kOk)}});
  v.push_back({"PullAfterReleaseHeldIsAnsweredReset", Opts(),
               {Claim(A), Ready(A), ReleaseHeld(), FinishedNow(A, R::kReset),
                Pull(P1, 1, {Pi(A)}), AnsweredNow(P1, 1, A, R::kReset)}});

  // --- failed writes ----------------------------------------------------
  v.push_back({"FailedWriteEndsTransferAnswersWaiters", Opts(1),
               {At(S(0)), Claim(A, 2), Ready(A), Pull(P1, 1, {Pi(A)}),
                Writing(P1, 1, A), Pull(P2, 1, {Pi(A)}), Queued(1), At(S(1)),
                Done(P1, 1, A, false), AnsweredNow(P1, 1, A, R::kWriteFailed),
                AnsweredNow(P2, 1, A, R::kWriteFailed), NotStarted(P2, 1, A),
                FinishedNow(A, R::kWriteFailed), Tomb(A),
                Stat("writes_failed", &SendTableStats::writes_failed, 1),
                Live(0, 0)}});
  v.push_back({"FailedWriteFreesWhenLastWriteCompletes", Opts(2),
               {At(S(0)), Claim(A, 2), Ready(A), Pull(P1, 1, {Pi(A)}),
                Pull(P2, 1, {Pi(A)}), Writing(P1, 1, A), Writing(P2, 1, A),
                Pull(P2, 2, {Pi(A)}), NotStarted(P2, 2, A), At(S(1)),
                Done(P1, 1, A, false), AnsweredNow(P1, 1, A, R::kWriteFailed),
                AnsweredNow(P2, 2, A, R::kWriteFailed), Unanswered(P2, 1, A),
                NotFinished(A), DoneLingering(A), At(S(2)), Done(P2, 1, A),
                Answered(P2, 1, A, {R::kOk, R::kWriteFailed}, true),
                FinishedNow(A, R::kWriteFailed), Tomb(A), Live(0, 0)}});

  // --- busy sender pool -------------------------------------------------
  v.push_back({"BusyPoolQueuedPullAdmittedOnWriteDone", Opts(1),
               {At(S(0)), Claim(A), Ready(A), Claim(B), Ready(B), At(S(1)),
                Pull(P1, 1, {Pi(A)}), Writing(P1, 1, A), At(S(2)),
                Pull(P1, 2, {Pi(B)}), NotStarted(P1, 2, B), Queued(1), At(S(3)),
                Done(P1, 1, A), AnsweredNow(P1, 1, A, R::kOk),
                FinishedNow(A, R::kOk), Writing(P1, 2, B), Queued(0), At(S(4)),
                Done(P1, 2, B), AnsweredNow(P1, 2, B, R::kOk),
                FinishedNow(B, R::kOk), Gone(A), Gone(B)}});
  v.push_back({"WaitingPullHoldsNoSender", Opts(1),
               {At(S(0)), Claim(A), Pull(P1, 1, {Pi(A)}), Claim(B), Ready(B),
                Pull(P1, 2, {Pi(B)}), Writing(P1, 2, B), At(S(1)),
                Done(P1, 2, B), FinishedNow(B, R::kOk), Ready(A),
                Writing(P1, 1, A), Done(P1, 1, A), FinishedNow(A, R::kOk)}});
  v.push_back({"BusyPoolQueuedPullAborted", Opts(1),
               {At(S(0)), Claim(A), Ready(A), Claim(B), Ready(B),
                Pull(P1, 1, {Pi(A)}), Pull(P1, 2, {Pi(B)}), Queued(1), At(S(1)),
                Abort(B), AnsweredNow(P1, 2, B, R::kAborted),
                FinishedNow(B, R::kAborted), Queued(0), At(S(2)), Done(P1, 1, A),
                NotStarted(P1, 2, B), FinishedNow(A, R::kOk), Tomb(B), Gone(A)}});
  v.push_back({"BusyPoolQueuedPullReleased", Opts(1),
               {At(S(0)), Claim(A), Ready(A), Claim(B), Ready(B),
                Pull(P1, 1, {Pi(A)}), Pull(P2, 1, {Pi(B)}), Queued(1), At(S(1)),
                Pull(P2, 2, {Rel(B)}), AnsweredNow(P2, 1, B, R::kReleased),
                FinishedNow(B, R::kReleased), Queued(0), Done(P1, 1, A),
                NotStarted(P2, 1, B), FinishedNow(A, R::kOk)}});
  v.push_back({"BusyPoolQueuedPullDeadline", Opts(1),
               {At(S(0)), Claim(B), At(S(1)), Pull(P1, 1, {Pi(B)}), At(S(2)),
                Claim(A), Ready(A), Pull(P2, 1, {Pi(A)}), Writing(P2, 1, A),
                At(S(3)), Ready(B), NotStarted(P1, 1, B), Queued(1),
                TimerAt(S(11) - kNs), Unanswered(P1, 1, B),
                TimerAt(S(11)), AnsweredNow(P1, 1, B, R::kDeadline),
                FinishedNow(B, R::kDeadline), Tomb(B), Queued(0),
                Writing(P2, 1, A), Unanswered(P2, 1, A),
                Stat("deadline_timer", &SendTableStats::deadline_timer, 1),
                Done(P2, 1, A), AnsweredNow(P2, 1, A, R::kOk),
                FinishedNow(A, R::kOk), Gone(A)}});

  // A pull queued behind a busy sender on a READY send that reaches its
  // expiry (ready + timeout) before the pull's own deadline. Whether the
  // send's expiry may cut the queued pull short is not pinned down by the
  // spec (rule 4 "nobody pulls" vs rule 5 "until then it can still
  // expire"), so either end is accepted — but by the pull's deadline it
  // must be answered, and the blocks freed exactly once.
  v.push_back({"BusyPoolQueuedPullOnExpiringSend", Opts(1),
               {At(S(0)), Claim(A), Ready(A), Claim(B), Ready(B),
                Pull(P1, 1, {Pi(B)}), Writing(P1, 1, B), At(S(5)),
                Pull(P2, 1, {Pi(A)}), NotStarted(P2, 1, A), Queued(1),
                TimerAt(S(15)), NotStarted(P2, 1, A),
                Answered(P2, 1, A, {R::kExpired, R::kDeadline}),
                FinishedOneOf(A, {R::kExpired, R::kDeadline}), Tomb(A),
                Done(P1, 1, B), Answered(P1, 1, B, {R::kOk, R::kExpired}, true),
                FinishedOneOf(B, {R::kOk, R::kExpired})}});

  // --- deadlines --------------------------------------------------------
  v.push_back({"DeadlineWhileWaitingForPrefill", Opts(),
               {At(S(0)), Claim(A), At(S(1)), Pull(P1, 1, {Pi(A)}),
                NextDeadline(S(11)), TimerAt(S(11) - kNs), Unanswered(P1, 1, A),
                State(A, SendState::kWaiting), TimerAt(S(11)),
                AnsweredNow(P1, 1, A, R::kDeadline), Tomb(A),
                Stat("deadline_timer", &SendTableStats::deadline_timer, 1),
                At(S(12)), Ready(A, SC::kCancelled), NotFinished(A), Live(0, 0)}});
  // The queued pull's deadline passes while the sender is busy, and the
  // sender frees at/after that deadline before any OnTimer: no StartWrite.
  for (int64_t delta_ns : {0, 1, 1000}) {
    const Instant deadline = Ms(500) + kTimeout;  // B's pull arrives at 0.5 s
    v.push_back(
        {"DeadlineRecheckedAtAdmission_plus" + std::to_string(delta_ns) + "ns",
         Opts(1),
         {At(S(0)), Claim(A), Ready(A), Pull(P1, 1, {Pi(A)}), Writing(P1, 1, A),
          Claim(B), At(Ms(500)), Pull(P2, 1, {Pi(B)}), At(S(1)), Ready(B),
          Queued(1), NotStarted(P2, 1, B),
          At(deadline + Duration::Nanoseconds(delta_ns)), Done(P1, 1, A),
          AnsweredNow(P1, 1, A, R::kOk), FinishedNow(A, R::kOk),
          NotStarted(P2, 1, B), InFlight(0), Timer(), NotStarted(P2, 1, B),
          Answered(P2, 1, B, {R::kDeadline}), Finished(B, R::kDeadline),
          Tomb(B), Live(0, 0)}});
  }
  // Control: the sender frees 1 ns before the deadline: the write starts.
  v.push_back({"AdmissionJustBeforeDeadlineStartsWrite", Opts(1),
               {At(S(0)), Claim(A), Ready(A), Pull(P1, 1, {Pi(A)}), Claim(B),
                At(Ms(500)), Pull(P2, 1, {Pi(B)}), At(S(1)), Ready(B),
                At(Ms(500) + kTimeout - kNs), Done(P1, 1, A), Writing(P2, 1, B),
                At(Ms(500) + kTimeout), Done(P2, 1, B),
                AnsweredNow(P2, 1, B, R::kOk), FinishedNow(B, R::kOk), Gone(B),
                TimerAt(S(20)), NoActions()}});

  // --- mixed batch ------------------------------------------------------
  v.push_back({"MixedBatchEndedAnsweredFirst", Opts(),
               {At(S(0)), Claim(A), Abort(A),                 // A tombstoned
                Claim(D), Ready(D), Pull(P2, 1, {Rel(D)}),    // D released
                FinishedNow(D, R::kReleased), Claim(B), Ready(B),  // B ready
                Claim(C), Ready(C),                           // C ready, released below
                Claim(E), Ready(E),                           // E ready
                At(S(1)),
                Pull(P1, 1, {Pi(B), Pi(A), Rel(C), Pi(D), Pi(E)}),
                AnsweredBeforeAnyWrite({Key{P1, 1, A}, Key{P1, 1, D}}),
                AnsweredNow(P1, 1, A, R::kAborted),
                AnsweredNow(P1, 1, D, R::kReleased), AnsweredAnyNow(P1, 1, C),
                FinishedNow(C, R::kReleased), Writing(P1, 1, B),
                Writing(P1, 1, E),
                Stat("answered_from_tombstone", &SendTableStats::answered_from_tombstone, 2),
                Done(P1, 1, B), Done(P1, 1, E), FinishedNow(E, R::kOk),
                Finished(B, R::kOk), Gone(B), Gone(E), Tomb(A), Tomb(C), Tomb(D)}});

  // --- need = 2 ---------------------------------------------------------
  v.push_back({"NeedTwoDroppedAfterBothPulled", Opts(),
               {At(S(0)), Claim(A, 2), Ready(A), At(S(1)), Pull(P1, 1, {Pi(A)}),
                Writing(P1, 1, A), Done(P1, 1, A), AnsweredNow(P1, 1, A, R::kOk),
                NotFinished(A), State(A, SendState::kReady), NoTomb(A), At(S(2)),
                Pull(P2, 1, {Pi(A)}), Writing(P2, 1, A), Done(P2, 1, A),
                AnsweredNow(P2, 1, A, R::kOk), FinishedNow(A, R::kOk), Gone(A),
                Live(0, 0)}});
  v.push_back({"NeedTwoConcurrentPulls", Opts(),
               {At(S(0)), Claim(A, 2), Pull(P1, 1, {Pi(A)}), Pull(P2, 1, {Pi(A)}),
                Ready(A), Writing(P1, 1, A), Writing(P2, 1, A), Done(P2, 1, A),
                NotFinished(A), Done(P1, 1, A), FinishedNow(A, R::kOk), Gone(A)}});
  v.push_back({"SurplusPullAnsweredAlreadyPulled", Opts(1),
               {At(S(0)), Claim(A, 1), Ready(A), Pull(P1, 1, {Pi(A)}),
                Pull(P2, 1, {Pi(A)}), Writing(P1, 1, A), NotStarted(P2, 1, A),
                Done(P1, 1, A), AnsweredNow(P1, 1, A, R::kOk),
                AnsweredNow(P2, 1, A, R::kAlreadyPulled), NotStarted(P2, 1, A),
                FinishedNow(A, R::kOk), Gone(A), Live(0, 0)}});

  // --- duplicate claims -------------------------------------------------
  v.push_back({"DuplicateClaimWhileWaiting", Opts(),
               {At(S(0)), Claim(A, 1), Pull(P1, 1, {Pi(A)}),
                Claim(A, 2, SC::kAlreadyExists),
                Stat("claims_rejected_duplicate", &SendTableStats::claims_rejected_duplicate, 1),
                State(A, SendState::kWaiting), Unanswered(P1, 1, A), Ready(A),
                Writing(P1, 1, A), Done(P1, 1, A), AnsweredNow(P1, 1, A, R::kOk),
                FinishedNow(A, R::kOk), Gone(A)}});
  v.push_back({"DuplicateClaimWhileReady", Opts(),
               {At(S(0)), Claim(A, 1), Ready(A), Claim(A, 1, SC::kAlreadyExists),
                State(A, SendState::kReady), NoActions(), Pull(P1, 1, {Pi(A)}),
                Done(P1, 1, A), FinishedNow(A, R::kOk), Gone(A)}});

  // --- late pulls -------------------------------------------------------
  v.push_back({"LatePullAfterAbortFromTombstone", Opts(),
               {At(S(0)), Claim(A), Pull(P1, 1, {Pi(A)}), Abort(A),
                AnsweredNow(P1, 1, A, R::kAborted), At(S(5)), Pull(P2, 1, {Pi(A)}),
                AnsweredNow(P2, 1, A, R::kAborted),
                Stat("answered_from_tombstone", &SendTableStats::answered_from_tombstone, 1),
                Stat("placeholders", &SendTableStats::placeholders, 0), Tomb(A),
                Live(0, 0)}});

  // --- release commutes with pulled / expire / abort --------------------
  v.push_back({"ReleaseAfterPulled", Opts(),
               {Claim(A), Ready(A), Pull(P1, 1, {Pi(A)}), Done(P1, 1, A),
                FinishedNow(A, R::kOk), Gone(A), Pull(P1, 2, {Rel(A)}),
                AnsweredAnyNow(P1, 2, A), Finished(A, R::kOk)}});
  v.push_back({"PulledAfterRelease", Opts(),
               {Claim(A), Ready(A), Pull(P1, 1, {Pi(A)}), Pull(P1, 2, {Rel(A)}),
                NotFinished(A), Done(P1, 1, A), FinishedNow(A, R::kReleased),
                Tomb(A)}});
  v.push_back({"ReleaseAfterExpire", Opts(),
               {At(S(0)), Claim(A), Ready(A), TimerAt(S(10)),
                FinishedNow(A, R::kExpired), At(S(11)), Pull(P1, 1, {Rel(A)}),
                AnsweredAnyNow(P1, 1, A), Finished(A, R::kExpired), Tomb(A)}});
  v.push_back({"ExpireAfterRelease", Opts(),
               {At(S(0)), Claim(A), Ready(A), At(S(1)), Pull(P1, 1, {Rel(A)}),
                FinishedNow(A, R::kReleased), TimerAt(S(10)), TimerAt(S(11)),
                NoActions(), Finished(A, R::kReleased), Tomb(A)}});
  v.push_back({"AbortAfterRelease", Opts(),
               {Claim(A), Ready(A), Pull(P1, 1, {Rel(A)}),
                FinishedNow(A, R::kReleased), Abort(A), NoActions(),
                Finished(A, R::kReleased), Tomb(A)}});
  v.push_back({"ReleaseAfterAbort", Opts(),
               {Claim(A), Ready(A), Abort(A), FinishedNow(A, R::kAborted),
                Pull(P1, 1, {Rel(A)}), AnsweredAnyNow(P1, 1, A),
                Finished(A, R::kAborted), Tomb(A)}});
  v.push_back({"AbortAndReleaseDuringWrite", Opts(),
               {Claim(A), Ready(A), Pull(P1, 1, {Pi(A)}), Abort(A),
                Pull(P1, 2, {Rel(A)}), AnsweredAnyNow(P1, 2, A), NotFinished(A),
                ReleaseHeld(), NotFinished(A), Done(P1, 1, A),
                FinishedNow(A, R::kAborted), Tomb(A)}});
  v.push_back({"ReleaseTwiceIdempotent", Opts(),
               {Claim(A), Ready(A), Pull(P1, 1, {Rel(A)}), Pull(P2, 1, {Rel(A)}),
                AnsweredAnyNow(P2, 1, A), Finished(A, R::kReleased), Tomb(A)}});

  // --- stale write completions ------------------------------------------
  v.push_back({"StaleWriteDoneIgnored", Opts(),
               {Claim(A), Ready(A), Pull(P1, 1, {Pi(A)}),
                StaleWriteDone(P1, 1, A), NoActions(),
                Stat("stale_write_done", &SendTableStats::stale_write_done, 1),
                Writing(P1, 1, A), InFlight(1), Done(P1, 1, A),
                AnsweredNow(P1, 1, A, R::kOk), FinishedNow(A, R::kOk),
                DuplicateWriteDone(P1, 1, A), NoActions(),
                Stat("stale_write_done", &SendTableStats::stale_write_done, 2),
                Gone(A)}});

  // --- prompt fingerprints (transfer_id collisions) ---------------------
  // A pull with another fingerprint comes from the transfer's only
  // consumer (the D engine bound to it), which recomputes on the answer:
  // nobody will pull this KV, so the send ends now instead of at expiry
  // (a weight update that reached D before P held P's blocks 480 s).
  v.push_back({"PromptMismatchEndsTheSend", Opts(),
               {At(S(0)), ClaimH(A, 1, 7), Ready(A), At(S(1)),
                Pull(P1, 1, {PiH(A, 8)}), AnsweredNow(P1, 1, A, R::kMismatch),
                NotStarted(P1, 1, A), FinishedNow(A, R::kMismatch), Tomb(A),
                Stat("prompt_mismatch", &SendTableStats::prompt_mismatch, 1),
                Pull(P1, 2, {PiH(A, 7)}), AnsweredNow(P1, 2, A, R::kMismatch)}});
  v.push_back({"PromptMismatchEndsTheSendWhileAWriteRuns", Opts(),
               {At(S(0)), ClaimH(A, 2, 7), Ready(A), Pull(P1, 1, {PiH(A, 7)}),
                Writing(P1, 1, A), Pull(P2, 1, {PiH(A, 8)}),
                AnsweredNow(P2, 1, A, R::kMismatch), NotFinished(A), DoneLingering(A),
                Done(P1, 1, A), Answered(P1, 1, A, {R::kOk, R::kMismatch}, true),
                FinishedNow(A, R::kMismatch), Tomb(A)}});
  v.push_back({"AReleaseWithAnotherFingerprintEndsTheSend", Opts(),
               {At(S(0)), ClaimH(A, 1, 7), Ready(A), At(S(1)),
                Pull(P1, 1, {Rel(A)}), FinishedNow(A, R::kReleased), Tomb(A)}});
  v.push_back({"PromptZeroIsNotChecked", Opts(),
               {At(S(0)), ClaimH(A, 1, 0), Pull(P1, 1, {PiH(A, 9)}),
                Unanswered(P1, 1, A), ClaimH(B, 1, 5), Pull(P1, 2, {PiH(B, 0)}),
                Unanswered(P1, 2, B), Ready(A), Ready(B), Done(P1, 1, A),
                Done(P1, 2, B), AnsweredNow(P1, 2, B, R::kOk),
                Answered(P1, 1, A, {R::kOk}), Finished(A, R::kOk),
                Finished(B, R::kOk),
                Stat("prompt_mismatch", &SendTableStats::prompt_mismatch, 0)}});
  v.push_back({"PlaceholderPullOfAnotherPromptEndsTheSendAtClaim", Opts(),
               {At(S(0)), Pull(P1, 1, {PiH(A, 8)}), Pull(P2, 1, {PiH(A, 7)}),
                At(S(1)), ClaimH(A, 2, 7), AnsweredNow(P1, 1, A, R::kMismatch),
                AnsweredNow(P2, 1, A, R::kMismatch), Tomb(A), At(S(2)),
                Ready(A, SC::kCancelled), NoActions()}});
  return v;
}

class SendTableCaseTest : public ::testing::TestWithParam<Case> {};

TEST_P(SendTableCaseTest, EveryPullAnsweredOnceBlocksFreedOnce) {
  const Case& c = GetParam();
  Harness h(c.opts);
  for (size_t i = 0; i < c.steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i) + ": " + c.steps[i].what);
    c.steps[i].fn(h);
    if (::testing::Test::HasFatalFailure()) return;
  }
  h.ExpectQuiescent();
}

INSTANTIATE_TEST_SUITE_P(
    Orders, SendTableCaseTest, ::testing::ValuesIn(Cases()),
    [](const ::testing::TestParamInfo<Case>& param_info) {
      return param_info.param.name;
    });

TEST(SendTableTest, CaseTableCoversTheSeed) {
  EXPECT_GE(Cases().size(), 18u);
}

// The remembered answers hold at most max_tombstones entries at every
// moment: the oldest is dropped before a new one goes in, so the map never
// grows for one entry past the bound (CheckInvariants checks its capacity).
// A resent pull still inside the memory gets its answer again; one dropped
// from it is not.
// Runs every write the table starts (each succeeds if `write_ok`) and
// returns the answers, in order.
std::vector<AnswerPull> DrainAnswers(SendTable& table, Instant now, bool write_ok = true) {
  std::vector<AnswerPull> answers;
  while (auto a = table.PollAction()) {
    if (auto* w = std::get_if<StartWrite>(&*a)) table.WriteDone(w->write, write_ok, now);
    if (auto* p = std::get_if<AnswerPull>(&*a)) answers.push_back(*p);
  }
  return answers;
}

TEST(SendTableTest, RememberedAnswersStayWithinTheirBound) {
  SendTableOptions o = Opts();
  o.max_tombstones = 16;
  SendTable table(o);
  const Instant now = Instant::Epoch();
  const std::vector<BlockId> blocks = {BlockId{1, 1}};
  auto drain = [&] { return DrainAnswers(table, now); };
  std::vector<PullItem> pull(1);
  pull[0].dst = {BlockId{9, 1}};
  for (uint64_t k = 1; k <= 40; ++k) {
    ASSERT_TRUE(table.Claim(Tid(k), 1, now).ok());
    ASSERT_TRUE(table.Ready(Tid(k), blocks, now).ok());
    pull[0].transfer = Tid(k);
    table.Pull(P1, k, pull, now);
    const std::vector<AnswerPull> answers = drain();
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].result, TransferResult::kOk);
    table.CheckInvariants();
  }
  EXPECT_EQ(table.live_sends(), 0u);
  // The last 16 are remembered: a resend of each is answered again, as before.
  for (uint64_t k = 25; k <= 40; ++k) {
    pull[0].transfer = Tid(k);
    table.Pull(P1, k, pull, now);
    const std::vector<AnswerPull> answers = drain();
    ASSERT_EQ(answers.size(), 1u) << k;
    EXPECT_EQ(answers[0].result, TransferResult::kOk) << k;
  }
  EXPECT_EQ(table.stats().reanswered, 16u);
  // The 17th newest was dropped: its resend is a new pull (a placeholder,
  // since a transfer everyone pulled leaves no tombstone).
  pull[0].transfer = Tid(24);
  table.Pull(P1, 24, pull, now);
  EXPECT_TRUE(drain().empty());
  EXPECT_EQ(table.stats().reanswered, 16u);
  EXPECT_EQ(table.live_sends(), 1u);
  table.CheckInvariants();
}

// The token Ready() names rides every ok answer of a live send — one pulled
// before Ready and one after — and no failed one; a repeated answer does
// not know it (D then computes the token itself).
TEST(SendTableTest, OkAnswersCarryTheFirstTokenReadyNamed) {
  SendTable table(Opts());
  const Instant now = Instant::Epoch();
  // Pulls `t` as `peer` (pull seq = t's number) and expects one answer.
  auto pull = [&](PeerId peer, uint64_t t, bool write_ok = true) {
    std::vector<PullItem> items(1);
    items[0].transfer = Tid(t);
    items[0].dst = {BlockId{9, 1}};
    table.Pull(peer, t, items, now);
    std::vector<AnswerPull> a = DrainAnswers(table, now, write_ok);
    EXPECT_EQ(a.size(), 1u);
    return a.empty() ? AnswerPull{} : a[0];
  };
  auto expect = [](const AnswerPull& a, TransferResult result, uint32_t token) {
    EXPECT_EQ(a.result, result);
    EXPECT_EQ(a.first_token, token);
  };
  // Two consumers: one pulls before Ready, one after.
  ASSERT_TRUE(table.Claim(Tid(1), 2, now).ok());
  std::vector<PullItem> early(1);
  early[0].transfer = Tid(1);
  early[0].dst = {BlockId{9, 1}};
  table.Pull(P1, 1, early, now);
  EXPECT_TRUE(DrainAnswers(table, now).empty());
  ASSERT_TRUE(table.Ready(Tid(1), {BlockId{1, 1}}, now, 0, 4242).ok());
  std::vector<AnswerPull> a = DrainAnswers(table, now);
  ASSERT_EQ(a.size(), 1u);
  expect(a[0], TransferResult::kOk, 4242);
  expect(pull(P2, 1), TransferResult::kOk, 4242);
  // Remembered and repeated: ok, without the token.
  expect(pull(P1, 1), TransferResult::kOk, kNoFirstToken);
  // A write that fails is answered without it.
  ASSERT_TRUE(table.Claim(Tid(2), 1, now).ok());
  ASSERT_TRUE(table.Ready(Tid(2), {BlockId{2, 1}}, now, 0, 77).ok());
  expect(pull(P1, 2, /*write_ok=*/false), TransferResult::kWriteFailed, kNoFirstToken);
  // Ready without a token: ok answers carry none.
  ASSERT_TRUE(table.Claim(Tid(3), 1, now).ok());
  ASSERT_TRUE(table.Ready(Tid(3), {BlockId{3, 1}}, now).ok());
  expect(pull(P1, 3), TransferResult::kOk, kNoFirstToken);
  table.CheckInvariants();
}

// ---------------------------------------------------------------------------
// Cross product: every order of a small event set on one transfer.

enum class Ev { kClaim, kReady, kPull, kAbort, kRelease, kExpire, kWriteDone };

const char* EvName(Ev e) {
  switch (e) {
    case Ev::kClaim: return "claim";
    case Ev::kReady: return "ready";
    case Ev::kPull: return "pull";
    case Ev::kAbort: return "abort";
    case Ev::kRelease: return "release";
    case Ev::kExpire: return "expire";
    case Ev::kWriteDone: return "write_done";
  }
  return "?";
}

// Runs one order; returns false (after reporting) on the first violation.
// A request P claimed and never handed over is still running when the order
// ends; P's engine then ends it: with Ready() (`finish_ready`) or Abort().
bool RunOrder(const std::vector<Ev>& order, uint32_t need, bool write_ok,
              bool finish_ready) {
  std::string desc = "need=" + std::to_string(need) +
                     (write_ok ? " write_ok" : " write_fails") +
                     (finish_ready ? " then-ready" : " then-abort") + ":";
  for (Ev e : order) desc += std::string(" ") + EvName(e);
  SCOPED_TRACE(desc);
  Harness h(Opts(1));
  bool claimed = false;
  bool running = false;  // claimed, Ready() not called yet
  uint64_t seq = 0;
  for (Ev e : order) {
    h.SetTime(h.now() + Duration::Seconds(1));
    switch (e) {
      case Ev::kClaim:
        claimed = h.Claim(A, need).ok();
        running = claimed;
        break;
      case Ev::kReady: {
        Status s = h.Ready(A, 2);
        if (!claimed) {
          EXPECT_FALSE(s.ok()) << "Ready accepted without a claim";
        }
        running = false;
        break;
      }
      case Ev::kPull: h.Pull(P1, ++seq, {Pi(A)}); break;
      case Ev::kAbort: h.Abort(A); break;
      case Ev::kRelease: h.Pull(P2, ++seq, {Rel(A)}); break;
      case Ev::kExpire:
        h.SetTime(h.now() + kTimeout);
        h.Timer();
        break;
      case Ev::kWriteDone:
        if (!h.writes().empty()) h.Done(h.writes().begin()->second, write_ok);
        break;
    }
  }
  if (running) {
    h.SetTime(h.now() + Duration::Seconds(1));
    if (finish_ready) {
      (void)h.Ready(A, 2);
    } else {
      h.Abort(A);
    }
  }
  h.Drain();
  h.ExpectQuiescent();
  EXPECT_FALSE(h.table().StateOf(A).has_value());
  return !::testing::Test::HasFailure();
}

TEST(SendTableCrossProductTest, AllOrdersOfClaimReadyPullAbortReleaseExpireWriteDone) {
  std::vector<Ev> events = {Ev::kClaim, Ev::kReady,  Ev::kPull,     Ev::kAbort,
                            Ev::kRelease, Ev::kExpire, Ev::kWriteDone};
  int runs = 0;
  for (uint32_t need : {1u, 2u}) {
    for (bool write_ok : {true, false}) {
      for (bool finish_ready : {true, false}) {
        std::vector<Ev> order = events;
        std::sort(order.begin(), order.end());
        do {
          ++runs;
          // Report the first failing order only.
          if (!RunOrder(order, need, write_ok, finish_ready)) return;
        } while (std::next_permutation(order.begin(), order.end()));
      }
    }
  }
  EXPECT_EQ(runs, 8 * 5040);
}

// Subsets: drop abort and release, so the transfer can complete normally;
// with two pulls from two ranks and need 2.
TEST(SendTableCrossProductTest, AllOrdersWithTwoRanks) {
  enum class E2 { kClaim, kReady, kPull1, kPull2, kDone1, kDone2, kExpire };
  std::vector<E2> order = {E2::kClaim, E2::kReady, E2::kPull1, E2::kPull2,
                           E2::kDone1, E2::kDone2, E2::kExpire};
  int runs = 0;
  do {
    ++runs;
    for (uint32_t workers : {1u, 2u}) {
      std::string desc = "workers=" + std::to_string(workers) + " order:";
      for (E2 e : order) desc += " " + std::to_string(static_cast<int>(e));
      SCOPED_TRACE(desc);
      Harness h(Opts(workers));
      bool claimed = false;
      for (E2 e : order) {
        h.SetTime(h.now() + Duration::Seconds(1));
        switch (e) {
          case E2::kClaim: claimed = h.Claim(A, 2).ok(); break;
          case E2::kReady: (void)h.Ready(A, 3); break;
          case E2::kPull1: h.Pull(P1, 1, {Pi(A, 3)}); break;
          case E2::kPull2: h.Pull(P2, 1, {Pi(A, 3)}); break;
          case E2::kDone1:
          case E2::kDone2:
            if (!h.writes().empty()) h.Done(h.writes().begin()->second, true);
            break;
          case E2::kExpire:
            h.SetTime(h.now() + kTimeout);
            h.Timer();
            break;
        }
      }
      (void)claimed;
      h.Drain();
      h.ExpectQuiescent();
      if (::testing::Test::HasFailure()) return;
    }
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(runs, 5040);
}

}  // namespace
}  // namespace kvrelay
