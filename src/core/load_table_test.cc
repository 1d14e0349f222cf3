// load_table_test.cc — tests of LoadTable, D's side of every KV hand-off.
//
// Every test drives a LoadTable through a Harness that drains PollAction()
// after every input, sorts the actions (pulls, releases, LoadDone,
// LoadReleased), checks their shape (a pull has dst and an even seq, a
// release has no dst and an odd seq, seqs are never reused) and runs
// CheckInvariants().
#include "core/load_table.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "base/status.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/request_id.h"
#include "core/transfer_result.h"

namespace kvrelay {

// gtest printers (found by ADL, so they live in kvrelay, not the anonymous
// namespace).
static void PrintTo(TransferResult r, std::ostream* os) {
  *os << TransferResultName(r);
}
static void PrintTo(StatusCode c, std::ostream* os) {
  *os << StatusCodeName(c);
}

namespace {

constexpr Duration kAbortTimeout = Duration::Seconds(10);
constexpr Duration kGrace = Duration::Seconds(2);
constexpr Duration kGiveUp = kAbortTimeout + kGrace;
constexpr Duration kNs = Duration::Nanoseconds(1);
// What PeerGone records for each unanswered pull of the dead peer.
constexpr TransferResult kPeerGoneResult = TransferResult::kUnreachable;

LoadTableOptions TestOptions() {
  LoadTableOptions o;
  o.abort_timeout = kAbortTimeout;
  o.giveup_grace = kGrace;
  return o;
}

TransferId Tid(uint64_t n) { return TransferId{0x5eed5eed5eed5eedull, n}; }
RequestId Rid(uint32_t n, uint32_t gen = 1) { return RequestId{n, gen}; }
PeerId Peer(uint32_t n, uint32_t gen = 1) { return PeerId{n, gen}; }
std::vector<BlockId> Dst() { return {BlockId{3, 1}, BlockId{4, 1}}; }

std::string Describe(const SendPull& p) {
  return "SendPull{peer=" + p.peer.ToString() +
         " seq=" + std::to_string(p.pull_seq) +
         " transfer=" + p.transfer.ToString() +
         " dst=" + std::to_string(p.dst.size()) + "}";
}

// The actions one drain produced, by kind.
struct Batch {
  std::vector<SendPull> pulls;     // non-empty dst
  std::vector<SendPull> releases;  // empty dst
  std::vector<LoadDone> done;
  std::vector<LoadReleased> released;

  size_t completions() const { return done.size() + released.size(); }
  bool empty() const {
    return pulls.empty() && releases.empty() && completions() == 0;
  }
  std::vector<PeerId> ReleasePeers() const {
    std::vector<PeerId> v;
    for (const SendPull& r : releases) v.push_back(r.peer);
    std::sort(v.begin(), v.end());
    return v;
  }
  void Append(const Batch& o) {
    pulls.insert(pulls.end(), o.pulls.begin(), o.pulls.end());
    releases.insert(releases.end(), o.releases.begin(), o.releases.end());
    done.insert(done.end(), o.done.begin(), o.done.end());
    released.insert(released.end(), o.released.begin(), o.released.end());
  }
};

class Harness {
 public:
  // gtest_mode: shape violations fail the current gtest test at once.
  // Otherwise they are collected in `violations` (for rapidcheck, which
  // asserts on them with RC_ASSERT).
  explicit Harness(bool gtest_mode = true,
                   const LoadTableOptions& o = TestOptions())
      : options(o), table(o), gtest_mode_(gtest_mode) {}

  Status Start(RequestId r, TransferId t, const std::vector<PeerId>& producers,
               std::vector<BlockId> dst = Dst()) {
    return table.Start(r, t, producers, std::move(dst), now);
  }
  void Answer(const SendPull& pull, TransferResult result) {
    table.OnAnswer(pull.peer, pull.pull_seq, pull.transfer, result, now);
  }
  void AdvanceTo(Instant t) {
    now = t;
    table.OnTimer(now);
  }

  // Drains every pending action, checks its shape, then the invariants.
  Batch Drain() {
    Batch b;
    while (std::optional<LoadAction> a = table.PollAction()) {
      if (const SendPull* sp = std::get_if<SendPull>(&*a)) {
        if (!seqs_.insert(sp->pull_seq).second) {
          Violation("pull_seq reused: " + Describe(*sp));
        }
        if (sp->dst.empty()) {
          if (!LoadTable::IsReleaseSeq(sp->pull_seq)) {
            Violation("release with an even seq: " + Describe(*sp));
          }
          b.releases.push_back(*sp);
        } else {
          if (LoadTable::IsReleaseSeq(sp->pull_seq)) {
            Violation("pull with an odd seq: " + Describe(*sp));
          }
          b.pulls.push_back(*sp);
        }
      } else if (const LoadDone* d = std::get_if<LoadDone>(&*a)) {
        if (d->ok && d->first_error != TransferResult::kOk) {
          Violation("ok LoadDone with a first_error");
        }
        if (!d->ok && d->first_error == TransferResult::kOk && !d->cut_short) {
          Violation("failed LoadDone without a first_error");
        }
        b.done.push_back(*d);
      } else {
        b.released.push_back(std::get<LoadReleased>(*a));
      }
    }
    table.CheckInvariants();  // aborts the process on a broken invariant
    total.Append(b);
    return b;
  }

  LoadTableOptions options;
  LoadTable table;
  Instant now = Instant::FromNanos(1'000'000'007);  // not the epoch
  Batch total;
  std::vector<std::string> violations;

 private:
  void Violation(const std::string& what) {
    if (gtest_mode_) {
      ADD_FAILURE() << what;
    } else {
      violations.push_back(what);
    }
  }

  bool gtest_mode_;
  std::set<uint64_t> seqs_;
};

std::vector<PeerId> Producers(size_t n) {
  std::vector<PeerId> v;
  for (size_t i = 0; i < n; ++i) v.push_back(Peer(10 + static_cast<uint32_t>(i)));
  return v;
}

// Starts a load and returns its pulls, one per producer in producer order.
std::vector<SendPull> StartLoad(Harness& h, RequestId r, TransferId t,
                                const std::vector<PeerId>& producers) {
  Status s = h.Start(r, t, producers);
  EXPECT_TRUE(s.ok()) << s.ToString();
  Batch b = h.Drain();
  EXPECT_EQ(b.pulls.size(), producers.size());
  EXPECT_TRUE(b.releases.empty());
  EXPECT_EQ(b.completions(), 0u);
  std::vector<SendPull> pulls;
  for (const PeerId& p : producers) {
    for (const SendPull& sp : b.pulls) {
      if (sp.peer == p) pulls.push_back(sp);
    }
  }
  EXPECT_EQ(pulls.size(), producers.size());
  for (const SendPull& sp : pulls) {
    EXPECT_EQ(sp.transfer, t);
    EXPECT_EQ(sp.dst, Dst());
  }
  return pulls;
}

// ---------------------------------------------------------------------------
// 1. The matrix: every order of answers from N producers × answer kind ×
//    release mode.

enum class Kind { kOk, kError, kGone, kGiveUpRest };
enum class Mode { kLive, kReleasedMidway, kReleasedBefore };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kOk: return "ok";
    case Kind::kError: return "error";
    case Kind::kGone: return "peer_gone";
    case Kind::kGiveUpRest: return "give_up";
  }
  return "?";
}
const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kLive: return "live";
    case Mode::kReleasedMidway: return "released_midway";
    case Mode::kReleasedBefore: return "released_before";
  }
  return "?";
}

TransferResult ErrorFor(size_t pos) {
  static constexpr TransferResult kErrors[] = {TransferResult::kAborted,
                                               TransferResult::kWriteFailed,
                                               TransferResult::kReleased};
  return kErrors[pos % 3];
}

// kinds[pos] is what happens to the producer order[pos]. A kGiveUp at pos
// gives up every producer still unanswered, so kinds from there on are all
// kGiveUp.
void RunMatrixCase(size_t n, const std::vector<size_t>& order,
                   const std::vector<Kind>& kinds, Mode mode) {
  std::string desc = "n=" + std::to_string(n) + " mode=" + ModeName(mode) +
                     " events:";
  for (size_t pos = 0; pos < n; ++pos) {
    desc += " P" + std::to_string(order[pos]) + "=" + KindName(kinds[pos]);
  }
  SCOPED_TRACE(desc);

  Harness h;
  const RequestId req = Rid(7);
  const TransferId tid = Tid(7);
  const std::vector<PeerId> producers = Producers(n);
  const Instant start = h.now;
  const std::vector<SendPull> pulls = StartLoad(h, req, tid, producers);
  ASSERT_EQ(pulls.size(), n);
  EXPECT_EQ(h.table.NextDeadline(), start + kGiveUp);
  EXPECT_TRUE(h.table.IsLoading(req));

  std::vector<bool> answered(n, false);
  bool released = false;
  std::vector<SendPull> release_pulls;
  auto release = [&](bool expect_live) {
    const bool live = h.table.Release(req, h.now);
    EXPECT_EQ(live, expect_live);
    Batch b = h.Drain();
    EXPECT_EQ(b.completions(), 0u) << "a release never completes by itself";
    EXPECT_TRUE(b.pulls.empty());
    std::vector<PeerId> expected;
    for (size_t i = 0; i < n; ++i) {
      if (!answered[i]) expected.push_back(producers[i]);
    }
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(b.ReleasePeers(), expected)
        << "releases go exactly to the producers that have not answered";
    for (const SendPull& r : b.releases) {
      EXPECT_EQ(r.transfer, tid);
      release_pulls.push_back(r);
    }
    if (live) released = true;
  };
  if (mode == Mode::kReleasedBefore) release(true);

  bool expect_ok = true;
  TransferResult first_error = TransferResult::kOk;
  auto note = [&](TransferResult r) {
    if (r != TransferResult::kOk && expect_ok) {
      expect_ok = false;
      first_error = r;
    }
  };
  std::optional<Batch> completion;
  for (size_t pos = 0; pos < n && !completion.has_value(); ++pos) {
    const size_t p = order[pos];
    switch (kinds[pos]) {
      case Kind::kOk:
        h.Answer(pulls[p], TransferResult::kOk);
        answered[p] = true;
        note(TransferResult::kOk);
        break;
      case Kind::kError:
        h.Answer(pulls[p], ErrorFor(pos));
        answered[p] = true;
        note(ErrorFor(pos));
        break;
      case Kind::kGone:
        h.table.PeerGone(producers[p], h.now);
        answered[p] = true;
        note(kPeerGoneResult);
        break;
      case Kind::kGiveUpRest: {
        // One tick before give-up: nothing may happen.
        h.AdvanceTo(start + kGiveUp - kNs);
        Batch early = h.Drain();
        EXPECT_TRUE(early.empty()) << "completion before give-up time";
        // Giving up releases the producers that never answered (best
        // effort, so P frees before expiry) — unless the load was released
        // already and they were told then.
        std::vector<PeerId> expected;
        for (size_t i = 0; i < n; ++i) {
          if (!answered[i] && !released) expected.push_back(producers[i]);
        }
        std::sort(expected.begin(), expected.end());
        h.AdvanceTo(start + kGiveUp + Duration::Seconds(1));
        for (size_t i = 0; i < n; ++i) answered[i] = true;
        note(TransferResult::kDeadline);
        Batch b = h.Drain();
        EXPECT_TRUE(b.pulls.empty());
        EXPECT_EQ(b.ReleasePeers(), expected);
        release_pulls.insert(release_pulls.end(), b.releases.begin(), b.releases.end());
        EXPECT_EQ(b.completions(), 1u) << "no completion at give-up";
        completion = b;
        continue;
      }
    }
    Batch b = h.Drain();
    EXPECT_TRUE(b.pulls.empty());
    EXPECT_TRUE(b.releases.empty());
    const bool all = std::all_of(answered.begin(), answered.end(),
                                 [](bool a) { return a; });
    if (!all) {
      EXPECT_EQ(b.completions(), 0u)
          << "completion before the last producer answered (after event "
          << pos << ")";
      EXPECT_TRUE(h.table.IsLoading(req));
      EXPECT_EQ(h.table.live_loads(), 1u);
    } else {
      EXPECT_EQ(b.completions(), 1u) << "no completion after the last answer";
      completion = b;
    }
    if (pos == 0 && mode == Mode::kReleasedMidway) release(!all);
  }
  ASSERT_TRUE(completion.has_value());

  if (released) {
    ASSERT_EQ(completion->released.size(), 1u);
    EXPECT_TRUE(completion->done.empty()) << "a released load reported LoadDone";
    EXPECT_EQ(completion->released[0].request, req);
    EXPECT_EQ(completion->released[0].transfer, tid);
  } else {
    ASSERT_EQ(completion->done.size(), 1u);
    EXPECT_TRUE(completion->released.empty());
    const LoadDone& d = completion->done[0];
    EXPECT_EQ(d.request, req);
    EXPECT_EQ(d.transfer, tid);
    EXPECT_EQ(d.ok, expect_ok);
    EXPECT_FALSE(d.cut_short);
    EXPECT_EQ(d.first_error, first_error);
  }
  EXPECT_EQ(h.total.completions(), 1u);
  EXPECT_EQ(h.table.live_loads(), 0u);
  EXPECT_FALSE(h.table.IsLoading(req));
  EXPECT_FALSE(h.table.NextDeadline().has_value());
  EXPECT_FALSE(h.table.Release(req, h.now)) << "the load was already reported";

  // P answers the releases (and, being late, everything once more): all
  // dropped, nothing completes twice.
  for (const SendPull& r : release_pulls) h.Answer(r, TransferResult::kReleased);
  for (const SendPull& p : pulls) h.Answer(p, TransferResult::kOk);
  h.AdvanceTo(h.now + kGiveUp * 2);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().release_answers, release_pulls.size());
  EXPECT_EQ(h.total.completions(), 1u);

  const LoadTableStats& s = h.table.stats();
  EXPECT_EQ(s.loads_started, 1u);
  EXPECT_EQ(s.loads_released, released ? 1u : 0u);
  EXPECT_EQ(s.loads_ok, !released && expect_ok ? 1u : 0u);
  EXPECT_EQ(s.loads_failed, !released && !expect_ok ? 1u : 0u);
  EXPECT_EQ(s.releases_sent, release_pulls.size());
}

TEST(LoadTableTest, EveryAnswerOrderKindAndReleaseMode) {
  size_t cases = 0;
  for (size_t n = 1; n <= 3; ++n) {
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    do {
      // The first k events are each ok/error/peer-gone; the rest are given up.
      for (size_t k = 0; k <= n; ++k) {
        size_t combos = 1;
        for (size_t i = 0; i < k; ++i) combos *= 3;
        for (size_t c = 0; c < combos; ++c) {
          std::vector<Kind> kinds(n, Kind::kGiveUpRest);
          size_t x = c;
          for (size_t i = 0; i < k; ++i, x /= 3) {
            kinds[i] = static_cast<Kind>(x % 3);
          }
          for (Mode mode : {Mode::kLive, Mode::kReleasedMidway,
                            Mode::kReleasedBefore}) {
            RunMatrixCase(n, order, kinds, mode);
            ++cases;
            if (HasFatalFailure()) return;
          }
        }
      }
    } while (std::next_permutation(order.begin(), order.end()));
  }
  EXPECT_EQ(cases, 12u + 78u + 720u);
}

// ---------------------------------------------------------------------------
// 2. Release before allocation.

TEST(LoadTableTest, ReleaseUnstartedSendsOneReleasePerProducerAndNoLoad) {
  Harness h;
  const TransferId tid = Tid(1);
  const std::vector<PeerId> producers = Producers(3);
  h.table.ReleaseUnstarted(tid, producers);
  Batch b = h.Drain();
  EXPECT_TRUE(b.pulls.empty());
  EXPECT_EQ(b.completions(), 0u);
  EXPECT_EQ(b.ReleasePeers(), producers);
  for (const SendPull& r : b.releases) {
    EXPECT_EQ(r.transfer, tid);
    EXPECT_TRUE(r.dst.empty());
    EXPECT_TRUE(LoadTable::IsReleaseSeq(r.pull_seq));
  }
  EXPECT_EQ(h.table.live_loads(), 0u);
  EXPECT_FALSE(h.table.NextDeadline().has_value());
  EXPECT_EQ(h.table.stats().releases_unstarted, 1u);
  EXPECT_EQ(h.table.stats().releases_sent, 3u);
  EXPECT_EQ(h.table.stats().loads_started, 0u);

  // P answers the releases: counted as release answers.
  for (const SendPull& r : b.releases) h.Answer(r, TransferResult::kReleased);
  // A pull-answer for that transfer (e.g. P's tombstone answering an old
  // pull): no live load, so late — not a crash.
  h.table.OnAnswer(producers[0], 2, tid, TransferResult::kReleased, h.now);
  h.table.OnAnswer(producers[1], 1000, tid, TransferResult::kOk, h.now);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().release_answers, 3u);
  EXPECT_EQ(h.table.stats().late_answers, 2u);
  EXPECT_EQ(h.table.live_loads(), 0u);

  // The table still works, and its seqs do not collide with the releases'.
  const std::vector<SendPull> pulls = StartLoad(h, Rid(1), Tid(2), producers);
  for (const SendPull& p : pulls) h.Answer(p, TransferResult::kOk);
  Batch done = h.Drain();
  ASSERT_EQ(done.done.size(), 1u);
  EXPECT_TRUE(done.done[0].ok);
}

// ---------------------------------------------------------------------------
// 3. Stray answers.

TEST(LoadTableTest, StrayAnswersAreCountedAndDropped) {
  Harness h;
  const RequestId req = Rid(1);
  const TransferId tid = Tid(1);
  const std::vector<PeerId> producers = Producers(2);
  const std::vector<SendPull> pulls = StartLoad(h, req, tid, producers);
  ASSERT_EQ(pulls.size(), 2u);
  ASSERT_TRUE(h.table.Release(Rid(99), h.now) == false);

  // P0 answers ok.
  h.Answer(pulls[0], TransferResult::kOk);
  EXPECT_TRUE(h.Drain().empty());
  // Duplicate (with a different result: it must not change the outcome).
  h.Answer(pulls[0], TransferResult::kWriteFailed);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().duplicate_answers, 1u);
  // Wrong seq from the right peer.
  h.table.OnAnswer(pulls[1].peer, pulls[1].pull_seq + 2, tid,
                   TransferResult::kAborted, h.now);
  // Right seq, wrong peer.
  h.table.OnAnswer(Peer(77), pulls[1].pull_seq, tid, TransferResult::kAborted,
                   h.now);
  // Right seq, the peer's previous incarnation.
  h.table.OnAnswer(Peer(11, 0), pulls[1].pull_seq, tid,
                   TransferResult::kAborted, h.now);
  // P0's seq claimed by P1.
  h.table.OnAnswer(pulls[1].peer, pulls[0].pull_seq, tid,
                   TransferResult::kAborted, h.now);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().mismatched_answers, 4u);
  // An answer to a release (odd seq), even one naming the live transfer.
  h.table.OnAnswer(pulls[1].peer, pulls[1].pull_seq + 1, tid,
                   TransferResult::kAborted, h.now);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().release_answers, 1u);
  // Unknown transfer.
  h.table.OnAnswer(pulls[1].peer, pulls[1].pull_seq, Tid(555),
                   TransferResult::kAborted, h.now);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().late_answers, 1u);
  EXPECT_TRUE(h.table.IsLoading(req));

  // The real last answer completes the load, ok: no stray changed it.
  h.Answer(pulls[1], TransferResult::kOk);
  Batch b = h.Drain();
  ASSERT_EQ(b.done.size(), 1u);
  EXPECT_TRUE(b.done[0].ok);
  EXPECT_EQ(b.done[0].first_error, TransferResult::kOk);

  // After completion: everything is late (or a release answer), never a
  // second completion.
  h.Answer(pulls[0], TransferResult::kOk);
  h.Answer(pulls[1], TransferResult::kAborted);
  h.table.OnAnswer(pulls[1].peer, pulls[1].pull_seq + 2, tid,
                   TransferResult::kOk, h.now);
  h.table.OnAnswer(pulls[1].peer, pulls[1].pull_seq + 1, tid,
                   TransferResult::kOk, h.now);
  h.table.PeerGone(pulls[0].peer, h.now);
  h.AdvanceTo(h.now + kGiveUp * 2);
  EXPECT_TRUE(h.Drain().empty());
  const LoadTableStats& s = h.table.stats();
  EXPECT_EQ(s.late_answers, 1u + 3u);
  EXPECT_EQ(s.release_answers, 2u);
  EXPECT_EQ(s.duplicate_answers, 1u);
  EXPECT_EQ(s.mismatched_answers, 4u);
  EXPECT_EQ(s.answers, 2u + 4u + 1u + 1u + 1u + 4u);
  EXPECT_EQ(s.loads_ok, 1u);
  EXPECT_EQ(s.loads_failed, 0u);
  EXPECT_EQ(h.total.completions(), 1u);
}

// D uses P's first token only if every producer's ok answer named the
// same one; a failed load names none whatever its answers said.
TEST(LoadTableTest, FirstTokenOnlyWhenEveryProducerNamedTheSame) {
  struct Case {
    std::vector<uint32_t> tokens;  // one per producer, answered in order, all ok
    uint32_t want;
  };
  const uint32_t kNone = kNoFirstToken;
  const std::vector<Case> cases = {
      {{5}, 5},          {{5, 5}, 5},          {{5, 6}, kNone},      {{kNone, 5}, kNone},
      {{5, kNone}, kNone}, {{5, 6, 5}, kNone}, {{kNone, kNone}, kNone}, {{5, 5, 5, 5}, 5},
  };
  uint32_t n = 0;
  for (const Case& c : cases) {
    ++n;
    Harness h;
    const std::vector<PeerId> producers = Producers(static_cast<uint32_t>(c.tokens.size()));
    const std::vector<SendPull> pulls = StartLoad(h, Rid(n), Tid(n), producers);
    ASSERT_EQ(pulls.size(), c.tokens.size());
    for (size_t i = 0; i < pulls.size(); ++i) {
      h.table.OnAnswer(pulls[i].peer, pulls[i].pull_seq, pulls[i].transfer,
                       TransferResult::kOk, h.now, c.tokens[i]);
    }
    Batch b = h.Drain();
    ASSERT_EQ(b.done.size(), 1u) << "case " << n;
    EXPECT_TRUE(b.done[0].ok) << "case " << n;
    EXPECT_EQ(b.done[0].first_token, c.want) << "case " << n;
  }
  // Two producers name the same token, one fails: no token on a failed load.
  Harness h;
  const std::vector<SendPull> pulls = StartLoad(h, Rid(99), Tid(99), Producers(2));
  h.table.OnAnswer(pulls[0].peer, pulls[0].pull_seq, pulls[0].transfer,
                   TransferResult::kOk, h.now, 5);
  h.table.OnAnswer(pulls[1].peer, pulls[1].pull_seq, pulls[1].transfer,
                   TransferResult::kWriteFailed, h.now);
  Batch b = h.Drain();
  ASSERT_EQ(b.done.size(), 1u);
  EXPECT_FALSE(b.done[0].ok);
  EXPECT_EQ(b.done[0].first_token, kNone);
}

TEST(LoadTableTest, AnswerForOldLoadOfSameTransferIsMismatched) {
  // The transfer is loaded again (e.g. a retry) after the first load ended:
  // answers to the first load's pulls must not count for the second.
  Harness h;
  const std::vector<PeerId> producers = Producers(1);
  const std::vector<SendPull> first = StartLoad(h, Rid(1), Tid(1), producers);
  h.Answer(first[0], TransferResult::kAborted);
  ASSERT_EQ(h.Drain().done.size(), 1u);
  const std::vector<SendPull> second = StartLoad(h, Rid(1, 2), Tid(1), producers);
  h.Answer(first[0], TransferResult::kOk);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().mismatched_answers, 1u);
  EXPECT_TRUE(h.table.IsLoading(Rid(1, 2)));
  h.Answer(second[0], TransferResult::kOk);
  Batch b = h.Drain();
  ASSERT_EQ(b.done.size(), 1u);
  EXPECT_EQ(b.done[0].request, Rid(1, 2));
  EXPECT_TRUE(b.done[0].ok);
}

// ---------------------------------------------------------------------------
// 4. AbortAll.

TEST(LoadTableTest, AbortAllReleasesUnansweredAndEndsCutShort) {
  Harness h;
  const RequestId req = Rid(1);
  const TransferId tid = Tid(1);
  const std::vector<PeerId> producers = Producers(3);
  const std::vector<SendPull> pulls = StartLoad(h, req, tid, producers);
  h.Answer(pulls[1], TransferResult::kOk);
  EXPECT_TRUE(h.Drain().empty());

  h.table.AbortAll(h.now);
  Batch b = h.Drain();
  EXPECT_EQ(b.completions(), 0u) << "AbortAll must wait for the answers";
  EXPECT_EQ(b.ReleasePeers(), (std::vector<PeerId>{producers[0], producers[2]}));
  EXPECT_TRUE(h.table.IsLoading(req));
  // A second AbortAll sends nothing more.
  h.table.AbortAll(h.now);
  EXPECT_TRUE(h.Drain().empty());

  // P answers the original pulls kReleased (and the releases).
  h.Answer(pulls[0], TransferResult::kReleased);
  EXPECT_TRUE(h.Drain().empty());
  for (const SendPull& r : b.releases) h.Answer(r, TransferResult::kReleased);
  EXPECT_TRUE(h.Drain().empty());
  h.Answer(pulls[2], TransferResult::kReleased);
  Batch end = h.Drain();
  ASSERT_EQ(end.done.size(), 1u);
  EXPECT_TRUE(end.released.empty());
  EXPECT_EQ(end.done[0].request, req);
  EXPECT_FALSE(end.done[0].ok);
  EXPECT_TRUE(end.done[0].cut_short);
  EXPECT_EQ(end.done[0].first_error, TransferResult::kReleased);
  EXPECT_EQ(h.table.stats().loads_cut_short, 1u);
  EXPECT_EQ(h.table.stats().loads_failed, 1u);
  EXPECT_EQ(h.table.live_loads(), 0u);
}

// A producer's own cache reset (kReset) or a KV that is not this request's
// (kMismatch, e.g. computed under the weights before an update) cuts the
// load short: the engine recomputes whatever its failure policy. Any other
// failed answer is a failed load, left to the policy.
TEST(LoadTableTest, AProducersResetOrMismatchCutsTheLoadShort) {
  for (TransferResult r : {TransferResult::kReset, TransferResult::kMismatch,
                           TransferResult::kAborted, TransferResult::kWriteFailed}) {
    SCOPED_TRACE(std::string(TransferResultName(r)));
    Harness h;
    const std::vector<PeerId> producers = Producers(2);
    const std::vector<SendPull> pulls = StartLoad(h, Rid(1), Tid(1), producers);
    h.Answer(pulls[0], TransferResult::kOk);
    h.Answer(pulls[1], r);
    Batch end = h.Drain();
    ASSERT_EQ(end.done.size(), 1u);
    EXPECT_FALSE(end.done[0].ok);
    EXPECT_EQ(end.done[0].cut_short, RecomputeAnyway(r));
    EXPECT_EQ(end.done[0].first_error, r);
    EXPECT_EQ(h.table.stats().loads_cut_short, RecomputeAnyway(r) ? 1u : 0u);
  }
}

TEST(LoadTableTest, AbortAllAfterEveryAnswerOkFindsLoadAlreadyDone) {
  Harness h;
  const std::vector<PeerId> producers = Producers(2);
  const std::vector<SendPull> pulls = StartLoad(h, Rid(1), Tid(1), producers);
  h.Answer(pulls[0], TransferResult::kOk);
  h.Answer(pulls[1], TransferResult::kOk);
  Batch b = h.Drain();
  ASSERT_EQ(b.done.size(), 1u);
  EXPECT_TRUE(b.done[0].ok);
  EXPECT_FALSE(b.done[0].cut_short);
  h.table.AbortAll(h.now);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().loads_cut_short, 0u);
  EXPECT_EQ(h.table.stats().releases_sent, 0u);
}

TEST(LoadTableTest, AbortAllCutsEveryLiveLoadButNotReleasedOnes) {
  Harness h;
  const std::vector<PeerId> producers = Producers(2);
  const std::vector<SendPull> a = StartLoad(h, Rid(1), Tid(1), producers);
  const std::vector<SendPull> b = StartLoad(h, Rid(2), Tid(2), producers);
  const std::vector<SendPull> c = StartLoad(h, Rid(3), Tid(3), producers);
  ASSERT_TRUE(h.table.Release(Rid(3), h.now));
  EXPECT_EQ(h.Drain().releases.size(), 2u);

  h.table.AbortAll(h.now);
  Batch r = h.Drain();
  EXPECT_EQ(r.completions(), 0u);
  EXPECT_EQ(r.releases.size(), 4u) << "2 loads × 2 producers; load 3 was "
                                      "already released";
  for (const SendPull& x : r.releases) EXPECT_NE(x.transfer, Tid(3));

  // Load 1 gets its answers; load 2 is given up; load 3 answers.
  h.Answer(a[0], TransferResult::kReleased);
  h.Answer(a[1], TransferResult::kReleased);
  h.Answer(c[0], TransferResult::kReleased);
  h.Answer(c[1], TransferResult::kOk);
  Batch mid = h.Drain();
  ASSERT_EQ(mid.done.size(), 1u);
  EXPECT_EQ(mid.done[0].request, Rid(1));
  EXPECT_TRUE(mid.done[0].cut_short);
  ASSERT_EQ(mid.released.size(), 1u);
  EXPECT_EQ(mid.released[0].request, Rid(3));
  h.AdvanceTo(h.now + kGiveUp);
  Batch late = h.Drain();
  ASSERT_EQ(late.done.size(), 1u);
  EXPECT_EQ(late.done[0].request, Rid(2));
  EXPECT_TRUE(late.done[0].cut_short);
  EXPECT_FALSE(late.done[0].ok);
  EXPECT_EQ(late.done[0].first_error, TransferResult::kDeadline);
  EXPECT_EQ(h.table.live_loads(), 0u);
  EXPECT_EQ(h.table.stats().loads_cut_short, 2u);
  (void)b;
}

TEST(LoadTableTest, ReleaseAfterAbortAllReportsReleasedNotDone) {
  // The request goes away after abort_transfers() cut its load short: the
  // request is gone, so LoadReleased, never LoadDone.
  Harness h;
  const std::vector<PeerId> producers = Producers(2);
  const std::vector<SendPull> pulls = StartLoad(h, Rid(1), Tid(1), producers);
  h.table.AbortAll(h.now);
  EXPECT_EQ(h.Drain().releases.size(), 2u);
  h.Answer(pulls[0], TransferResult::kReleased);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_TRUE(h.table.Release(Rid(1), h.now));
  Batch r = h.Drain();
  EXPECT_EQ(r.completions(), 0u);
  // Releases (if any are re-sent) only go to the unanswered producer.
  for (const SendPull& x : r.releases) EXPECT_EQ(x.peer, producers[1]);
  h.Answer(pulls[1], TransferResult::kReleased);
  Batch end = h.Drain();
  EXPECT_TRUE(end.done.empty());
  ASSERT_EQ(end.released.size(), 1u);
  EXPECT_EQ(end.released[0].request, Rid(1));
}

// After AbortAll, a producer whose write had already finished answers the
// original pull kOk (its answer crossed the release). The load must still be
// reported failed: the cache reset that cut it short wipes those blocks, so
// the request recomputes (lifecycle.md: "a failed load with 0 computed
// tokens").
TEST(LoadTableTest, CutShortLoadIsReportedFailedEvenIfAnswersAreOk) {
  Harness h;
  const std::vector<PeerId> producers = Producers(2);
  const std::vector<SendPull> pulls = StartLoad(h, Rid(1), Tid(1), producers);
  h.Answer(pulls[0], TransferResult::kOk);
  EXPECT_TRUE(h.Drain().empty());
  h.table.AbortAll(h.now);
  Batch r = h.Drain();
  EXPECT_EQ(r.ReleasePeers(), (std::vector<PeerId>{producers[1]}));
  h.Answer(pulls[1], TransferResult::kOk);  // the write beat the release
  Batch end = h.Drain();
  ASSERT_EQ(end.done.size(), 1u);
  EXPECT_TRUE(end.done[0].cut_short);
  EXPECT_FALSE(end.done[0].ok)
      << "a cut-short load must be reported failed (recompute)";
  EXPECT_EQ(h.table.stats().loads_ok, 0u);
  EXPECT_EQ(h.table.stats().loads_failed, 1u);
}

// ---------------------------------------------------------------------------
// 5. Give-up timing.

TEST(LoadTableTest, GiveUpAtExactlyAbortTimeoutPlusGrace) {
  Harness h;
  h.now = Instant::FromNanos(0) + Duration::Seconds(100);
  const Instant start = h.now;
  const std::vector<PeerId> producers = Producers(2);
  const std::vector<SendPull> pulls = StartLoad(h, Rid(1), Tid(1), producers);
  ASSERT_TRUE(h.table.NextDeadline().has_value());
  EXPECT_EQ(*h.table.NextDeadline(), start + kAbortTimeout + kGrace);

  // A second load, later: the next deadline stays the first one's.
  h.now = start + Duration::Seconds(1);
  const std::vector<SendPull> later = StartLoad(h, Rid(2), Tid(2), producers);
  EXPECT_EQ(*h.table.NextDeadline(), start + kGiveUp);

  h.Answer(pulls[0], TransferResult::kOk);
  EXPECT_TRUE(h.Drain().empty());
  h.AdvanceTo(start + kAbortTimeout);  // P's deadline: D still waits
  EXPECT_TRUE(h.Drain().empty());
  h.AdvanceTo(start + kGiveUp - kNs);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_TRUE(h.table.IsLoading(Rid(1)));

  h.AdvanceTo(start + kGiveUp);
  Batch b = h.Drain();
  ASSERT_EQ(b.done.size(), 1u);
  EXPECT_EQ(b.done[0].request, Rid(1));
  EXPECT_FALSE(b.done[0].ok);
  EXPECT_FALSE(b.done[0].cut_short);
  EXPECT_EQ(b.done[0].first_error, TransferResult::kDeadline);
  EXPECT_EQ(h.table.stats().producers_given_up, 1u);
  EXPECT_EQ(*h.table.NextDeadline(), start + Duration::Seconds(1) + kGiveUp);

  // The given-up producer answers at last: late.
  h.Answer(pulls[1], TransferResult::kOk);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.table.stats().late_answers, 1u);

  // Load 2: an error first, then give-up: first_error stays the error.
  h.Answer(later[1], TransferResult::kWriteFailed);
  EXPECT_TRUE(h.Drain().empty());
  h.AdvanceTo(start + Duration::Seconds(1) + kGiveUp);
  Batch b2 = h.Drain();
  ASSERT_EQ(b2.done.size(), 1u);
  EXPECT_EQ(b2.done[0].first_error, TransferResult::kWriteFailed);
  EXPECT_FALSE(h.table.NextDeadline().has_value());
  EXPECT_EQ(h.table.stats().producers_given_up, 2u);
}

TEST(LoadTableTest, NextDeadlineFollowsDefaultOptions) {
  LoadTableOptions o;  // defaults: 480 s + 60 s
  Harness h(true, o);
  const Instant start = h.now;
  StartLoad(h, Rid(1), Tid(1), Producers(1));
  EXPECT_EQ(h.table.NextDeadline(),
            start + Duration::Seconds(480) + Duration::Seconds(60));
  h.AdvanceTo(start + Duration::Seconds(539));
  EXPECT_TRUE(h.Drain().empty());
  h.AdvanceTo(start + Duration::Seconds(540));
  EXPECT_EQ(h.Drain().done.size(), 1u);
}

// ---------------------------------------------------------------------------
// 6. Start errors.

TEST(LoadTableTest, StartErrorsEmitNothing) {
  LoadTableOptions o = TestOptions();
  o.max_loads = 2;
  o.max_producers = 3;
  Harness h(true, o);
  const std::vector<PeerId> two = Producers(2);
  auto expect_error = [&](Status s, StatusCode code, const char* what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_TRUE(h.Drain().empty());
  };
  expect_error(h.Start(Rid(1), Tid(1), {}), StatusCode::kInvalidArgument,
               "no producers");
  expect_error(h.Start(Rid(1), Tid(1), two, {}), StatusCode::kInvalidArgument,
               "no dst");
  expect_error(h.Start(Rid(1), Tid(1), {Peer(1), Peer(2), Peer(1)}),
               StatusCode::kInvalidArgument, "duplicate producer");
  expect_error(h.Start(Rid(1), Tid(1), Producers(4)),
               StatusCode::kInvalidArgument, "over max_producers");
  EXPECT_EQ(h.table.live_loads(), 0u);
  EXPECT_EQ(h.table.stats().loads_started, 0u);
  EXPECT_FALSE(h.table.NextDeadline().has_value());

  const std::vector<SendPull> pulls = StartLoad(h, Rid(1), Tid(1), two);
  expect_error(h.Start(Rid(2), Tid(1), two), StatusCode::kAlreadyExists,
               "same transfer twice");
  expect_error(h.Start(Rid(1), Tid(2), two), StatusCode::kAlreadyExists,
               "same request twice");
  expect_error(h.Start(Rid(1), Tid(1), two), StatusCode::kAlreadyExists,
               "same request and transfer twice");
  StartLoad(h, Rid(2), Tid(2), two);
  expect_error(h.Start(Rid(3), Tid(3), two), StatusCode::kResourceExhausted,
               "over max_loads");
  EXPECT_EQ(h.table.live_loads(), 2u);
  EXPECT_EQ(h.table.stats().loads_started, 2u);
  EXPECT_EQ(h.table.stats().releases_sent, 0u);

  // The rejected Starts did not disturb load 1.
  h.Answer(pulls[0], TransferResult::kOk);
  h.Answer(pulls[1], TransferResult::kOk);
  Batch b = h.Drain();
  ASSERT_EQ(b.done.size(), 1u);
  EXPECT_EQ(b.done[0].request, Rid(1));
  EXPECT_TRUE(b.done[0].ok);
  // Once it ended, the request and the transfer may load again.
  StartLoad(h, Rid(1), Tid(1), two);
  EXPECT_EQ(h.table.live_loads(), 2u);
}

// ---------------------------------------------------------------------------
// 7. The two-path release race (vllm-ascend Mooncake double release), D side.

struct RaceCase {
  size_t producers;
  bool release_first;
  bool drain_between;
  TransferResult last_answer;
};

void RunRace(const RaceCase& c) {
  SCOPED_TRACE("producers=" + std::to_string(c.producers) +
               " release_first=" + std::to_string(c.release_first) +
               " drain_between=" + std::to_string(c.drain_between) +
               " last_answer=" + std::string(TransferResultName(c.last_answer)));
  Harness h;
  const RequestId req = Rid(4);
  const TransferId tid = Tid(4);
  const std::vector<PeerId> producers = Producers(c.producers);
  const std::vector<SendPull> pulls = StartLoad(h, req, tid, producers);
  for (size_t i = 0; i + 1 < pulls.size(); ++i) {
    h.Answer(pulls[i], TransferResult::kOk);
  }
  EXPECT_TRUE(h.Drain().empty());
  h.now = h.now + Duration::Milliseconds(5);  // both paths at this instant

  Batch all;
  bool live = false;
  if (c.release_first) {
    live = h.table.Release(req, h.now);
    if (c.drain_between) all.Append(h.Drain());
    h.Answer(pulls.back(), c.last_answer);
  } else {
    h.Answer(pulls.back(), c.last_answer);
    if (c.drain_between) all.Append(h.Drain());
    live = h.table.Release(req, h.now);
  }
  all.Append(h.Drain());
  EXPECT_EQ(all.completions(), 1u);
  if (c.release_first) {
    EXPECT_TRUE(live);
    ASSERT_EQ(all.released.size(), 1u);
    EXPECT_TRUE(all.done.empty());
    EXPECT_EQ(all.released[0].request, req);
    EXPECT_EQ(all.ReleasePeers(), (std::vector<PeerId>{producers.back()}));
  } else {
    EXPECT_FALSE(live) << "the answer already completed the load";
    ASSERT_EQ(all.done.size(), 1u);
    EXPECT_TRUE(all.released.empty());
    EXPECT_EQ(all.done[0].ok, c.last_answer == TransferResult::kOk);
    EXPECT_TRUE(all.releases.empty()) << "nothing to release after the end";
  }
  // The second path arrives again (the seed's double release): no-op.
  EXPECT_FALSE(h.table.Release(req, h.now));
  for (const SendPull& r : all.releases) h.Answer(r, TransferResult::kReleased);
  h.Answer(pulls.back(), c.last_answer);
  h.AdvanceTo(h.now + kGiveUp * 2);
  EXPECT_TRUE(h.Drain().empty());
  EXPECT_EQ(h.total.completions(), 1u);
  EXPECT_EQ(h.table.live_loads(), 0u);
}

TEST(LoadTableTest, ReleaseRacesLastAnswerInBothOrders) {
  for (size_t n : {1u, 2u, 3u}) {
    for (bool release_first : {true, false}) {
      for (bool drain_between : {true, false}) {
        for (TransferResult r :
             {TransferResult::kOk, TransferResult::kReleased,
              TransferResult::kAborted}) {
          RunRace({n, release_first, drain_between, r});
        }
      }
    }
  }
}

TEST(LoadTableTest, ReleaseTwiceIsIdempotent) {
  Harness h;
  const std::vector<PeerId> producers = Producers(2);
  const std::vector<SendPull> pulls = StartLoad(h, Rid(1), Tid(1), producers);
  EXPECT_TRUE(h.table.Release(Rid(1), h.now));
  EXPECT_TRUE(h.table.Release(Rid(1), h.now));  // still live, no new releases
  Batch b = h.Drain();
  EXPECT_EQ(b.releases.size(), 2u);
  EXPECT_EQ(h.table.stats().releases_sent, 2u);
  h.Answer(pulls[0], TransferResult::kReleased);
  h.Answer(pulls[1], TransferResult::kReleased);
  Batch end = h.Drain();
  EXPECT_EQ(end.released.size(), 1u);
  EXPECT_TRUE(end.done.empty());
  EXPECT_FALSE(h.table.Release(Rid(1), h.now));
}

TEST(LoadTableTest, ReleaseRacesGiveUpAtTheSameInstant) {
  for (bool release_first : {true, false}) {
    SCOPED_TRACE(release_first ? "release first" : "give-up first");
    Harness h;
    const Instant start = h.now;
    const std::vector<SendPull> pulls =
        StartLoad(h, Rid(1), Tid(1), Producers(2));
    h.Answer(pulls[0], TransferResult::kOk);
    EXPECT_TRUE(h.Drain().empty());
    h.now = start + kGiveUp;
    bool live = false;
    if (release_first) {
      live = h.table.Release(Rid(1), h.now);
      h.table.OnTimer(h.now);
    } else {
      h.table.OnTimer(h.now);
      live = h.table.Release(Rid(1), h.now);
    }
    Batch b = h.Drain();
    EXPECT_EQ(b.completions(), 1u);
    EXPECT_EQ(live, release_first);
    EXPECT_EQ(b.released.size(), release_first ? 1u : 0u);
    EXPECT_EQ(b.done.size(), release_first ? 0u : 1u);
    EXPECT_EQ(h.table.live_loads(), 0u);
  }
}

TEST(LoadTableTest, PeerGoneFailsOnlyThatPeersPulls) {
  Harness h;
  const std::vector<PeerId> producers = Producers(2);
  const std::vector<SendPull> a = StartLoad(h, Rid(1), Tid(1), producers);
  const std::vector<SendPull> b =
      StartLoad(h, Rid(2), Tid(2), {producers[1]});
  const std::vector<SendPull> c = StartLoad(h, Rid(3), Tid(3), {Peer(50)});
  h.Answer(a[1], TransferResult::kOk);
  EXPECT_TRUE(h.Drain().empty());
  // Another incarnation of producer 1 is gone: not ours.
  h.table.PeerGone(Peer(11, 7), h.now);
  EXPECT_TRUE(h.Drain().empty());
  h.table.PeerGone(producers[1], h.now);
  Batch x = h.Drain();
  ASSERT_EQ(x.done.size(), 1u) << "load 1's producer 1 had answered already";
  EXPECT_EQ(x.done[0].request, Rid(2));
  EXPECT_EQ(x.done[0].first_error, kPeerGoneResult);
  EXPECT_TRUE(h.table.IsLoading(Rid(1)));
  EXPECT_TRUE(h.table.IsLoading(Rid(3)));
  EXPECT_EQ(h.table.stats().producers_lost, 1u);
  h.table.PeerGone(producers[0], h.now);
  Batch y = h.Drain();
  ASSERT_EQ(y.done.size(), 1u);
  EXPECT_EQ(y.done[0].request, Rid(1));
  EXPECT_FALSE(y.done[0].ok);
  (void)c;
}

// ---------------------------------------------------------------------------
// 8. Property: random inputs; every started load completes exactly once, and
//    only when its model says every producer has answered or was given up.

struct MProducer {
  PeerId peer;
  uint64_t seq = 0;
  bool answered = false;
};
struct MLoad {
  RequestId request;
  std::vector<MProducer> producers;
  bool released = false;
  bool cut_short = false;
  bool failed = false;
  TransferResult first_error = TransferResult::kOk;
  Instant giveup;
  bool Complete() const {
    for (const MProducer& p : producers) {
      if (!p.answered) return false;
    }
    return true;
  }
  bool producer_cut_short = false;  // a producer answered kReset / kMismatch
  void Record(MProducer& p, TransferResult r) {
    p.answered = true;
    if (RecomputeAnyway(r)) producer_cut_short = true;
    if (r != TransferResult::kOk && !failed) {
      failed = true;
      first_error = r;
    }
  }
};

struct Model {
  std::map<TransferId, MLoad> live;
  std::map<RequestId, TransferId> by_request;
  // Releases expected from the current input: (transfer, peer).
  std::multiset<std::pair<TransferId, PeerId>> expected_releases;
  uint64_t late = 0, duplicate = 0, mismatched = 0, release_answers = 0;

  void SendReleases(TransferId t, const MLoad& m) {
    for (const MProducer& p : m.producers) {
      if (!p.answered) expected_releases.insert({t, p.peer});
    }
  }
};

constexpr uint32_t kPropRequests = 3;
constexpr uint32_t kPropPeers = 3;

// Compares one drained batch with the model, then retires completed loads.
void CheckStep(Model& m, const Batch& b, std::map<TransferId, int>& completions,
               const std::string& op) {
  RC_ASSERT(b.pulls.empty());  // only Start sends pulls; checked there
  std::multiset<std::pair<TransferId, PeerId>> got_releases;
  for (const SendPull& r : b.releases) got_releases.insert({r.transfer, r.peer});
  RC_ASSERT(got_releases == m.expected_releases);
  m.expected_releases.clear();

  std::set<TransferId> expected_done;
  for (const auto& [t, load] : m.live) {
    if (load.Complete()) expected_done.insert(t);
  }
  std::set<TransferId> got_done;
  for (const LoadDone& d : b.done) {
    RC_ASSERT(got_done.insert(d.transfer).second);
    ++completions[d.transfer];
    auto it = m.live.find(d.transfer);
    RC_ASSERT(it != m.live.end());
    const MLoad& load = it->second;
    RC_ASSERT(d.request == load.request);
    RC_ASSERT(!load.released);  // a released load never reports LoadDone
    RC_ASSERT(d.cut_short == (load.cut_short || load.producer_cut_short));
    if (d.ok) RC_ASSERT(!load.failed);  // never ok with an error answer
    if (!d.ok) RC_ASSERT(load.failed || load.cut_short);
    if (load.failed) RC_ASSERT(d.first_error == load.first_error);
  }
  for (const LoadReleased& r : b.released) {
    RC_ASSERT(got_done.insert(r.transfer).second);
    ++completions[r.transfer];
    auto it = m.live.find(r.transfer);
    RC_ASSERT(it != m.live.end());
    RC_ASSERT(r.request == it->second.request);
    RC_ASSERT(it->second.released);
  }
  if (got_done != expected_done) {
    RC_FAIL("after " + op + ": completions do not match the model (" +
            std::to_string(got_done.size()) + " vs " +
            std::to_string(expected_done.size()) + " expected)");
  }
  for (const TransferId& t : expected_done) {
    m.by_request.erase(m.live.at(t).request);
    m.live.erase(t);
  }
}

RC_GTEST_PROP(LoadTableProperty, EveryStartedLoadCompletesExactlyOnce, ()) {
  Harness h(/*gtest_mode=*/false);
  Model m;
  std::map<TransferId, int> completions;
  std::vector<SendPull> sent;  // every pull and release, for answers
  uint64_t next_tid = 1;

  const int steps = *rc::gen::inRange(1, 80);
  for (int step = 0; step < steps; ++step) {
    const int op = *rc::gen::inRange(0, 100);
    std::string name;
    if (op < 20) {  // Start
      name = "Start";
      const uint32_t r = *rc::gen::inRange<uint32_t>(0, kPropRequests);
      const uint32_t mask = *rc::gen::inRange<uint32_t>(1, 1u << kPropPeers);
      std::vector<PeerId> producers;
      for (uint32_t i = 0; i < kPropPeers; ++i) {
        if (mask & (1u << i)) producers.push_back(Peer(i));
      }
      const bool reuse_live_transfer =
          !m.live.empty() && *rc::gen::inRange(0, 5) == 0;
      const TransferId t = reuse_live_transfer
                               ? m.live.begin()->first
                               : Tid(next_tid++);
      Status s = h.Start(Rid(r), t, producers);
      Batch b = h.Drain();
      if (m.by_request.count(Rid(r)) != 0 || m.live.count(t) != 0) {
        RC_ASSERT(s.code() == StatusCode::kAlreadyExists);
        RC_ASSERT(b.empty());
      } else {
        RC_ASSERT(s.ok());
        RC_ASSERT(b.releases.empty() && b.completions() == 0);
        RC_ASSERT(b.pulls.size() == producers.size());
        MLoad load;
        load.request = Rid(r);
        load.giveup = h.now + kGiveUp;
        for (size_t i = 0; i < producers.size(); ++i) {
          RC_ASSERT(b.pulls[i].peer == producers[i]);
          RC_ASSERT(b.pulls[i].transfer == t);
          load.producers.push_back({producers[i], b.pulls[i].pull_seq, false});
          sent.push_back(b.pulls[i]);
        }
        m.live.emplace(t, load);
        m.by_request.emplace(Rid(r), t);
        completions[t] = 0;
      }
      continue;
    }
    if (op < 55) {  // an answer, genuine or stray
      if (sent.empty()) continue;
      name = "Answer";
      SendPull a = sent[*rc::gen::inRange<size_t>(0, sent.size())];
      const TransferResult result = static_cast<TransferResult>(
          *rc::gen::inRange(0, kTransferResultCount));
      switch (*rc::gen::inRange(0, 10)) {
        case 0: a.pull_seq += 2; break;                       // wrong seq
        case 1: a.peer = Peer(a.peer.index, 9); break;        // old life
        case 2: a.transfer = Tid(1000 + a.transfer.lo); break;  // unknown
        default: break;
      }
      auto it = m.live.find(a.transfer);
      if (LoadTable::IsReleaseSeq(a.pull_seq)) {
        ++m.release_answers;
      } else if (it == m.live.end()) {
        ++m.late;
      } else {
        MProducer* hit = nullptr;
        for (MProducer& p : it->second.producers) {
          if (p.peer == a.peer && p.seq == a.pull_seq) hit = &p;
        }
        if (hit == nullptr) {
          ++m.mismatched;
        } else if (hit->answered) {
          ++m.duplicate;
        } else {
          it->second.Record(*hit, result);
        }
      }
      h.table.OnAnswer(a.peer, a.pull_seq, a.transfer, result, h.now);
    } else if (op < 65) {  // Release
      name = "Release";
      const RequestId r = Rid(*rc::gen::inRange<uint32_t>(0, kPropRequests));
      auto it = m.by_request.find(r);
      const bool live = h.table.Release(r, h.now);
      RC_ASSERT(live == (it != m.by_request.end()));
      if (it != m.by_request.end()) {
        MLoad& load = m.live.at(it->second);
        if (!load.released) {
          load.released = true;
          m.SendReleases(it->second, load);
        }
      }
    } else if (op < 68) {  // ReleaseUnstarted
      name = "ReleaseUnstarted";
      const TransferId t = Tid(next_tid++);
      std::vector<PeerId> producers = {Peer(0), Peer(2)};
      h.table.ReleaseUnstarted(t, producers);
      for (const PeerId& p : producers) m.expected_releases.insert({t, p});
    } else if (op < 74) {  // AbortAll
      name = "AbortAll";
      h.table.AbortAll(h.now);
      for (auto& [t, load] : m.live) {
        if (load.released || load.cut_short) continue;
        load.cut_short = true;
        m.SendReleases(t, load);
      }
    } else if (op < 80) {  // PeerGone
      name = "PeerGone";
      const PeerId peer = Peer(*rc::gen::inRange<uint32_t>(0, kPropPeers));
      h.table.PeerGone(peer, h.now);
      for (auto& [t, load] : m.live) {
        for (MProducer& p : load.producers) {
          if (p.peer == peer && !p.answered) load.Record(p, kPeerGoneResult);
        }
      }
    } else {  // AdvanceTime
      name = "AdvanceTime";
      const Duration d = *rc::gen::element(
          Duration::Zero(), kNs, Duration::Seconds(1), Duration::Seconds(5),
          kAbortTimeout, kGiveUp);
      h.AdvanceTo(h.now + d);
      for (auto& [t, load] : m.live) {
        if (load.giveup > h.now) continue;
        // Give-up releases the unanswered producers, unless a release or
        // cut-short already told them.
        if (!load.released && !load.cut_short) m.SendReleases(t, load);
        for (MProducer& p : load.producers) {
          if (!p.answered) load.Record(p, TransferResult::kDeadline);
        }
      }
    }
    Batch b = h.Drain();
    for (const SendPull& r : b.releases) sent.push_back(r);
    CheckStep(m, b, completions, name);
    RC_ASSERT(h.table.live_loads() == m.live.size());
    RC_ASSERT(h.violations.empty());
  }

  // The end: time passes beyond every give-up.
  h.AdvanceTo(h.now + kGiveUp + Duration::Seconds(1));
  for (auto& [t, load] : m.live) {
    if (!load.released && !load.cut_short) m.SendReleases(t, load);
    for (MProducer& p : load.producers) {
      if (!p.answered) load.Record(p, TransferResult::kDeadline);
    }
  }
  CheckStep(m, h.Drain(), completions, "final give-up");
  RC_ASSERT(h.violations.empty());

  for (const auto& [t, n] : completions) RC_ASSERT(n == 1);
  RC_ASSERT(h.table.live_loads() == 0u);
  RC_ASSERT(m.live.empty());
  RC_ASSERT(!h.table.NextDeadline().has_value());
  const LoadTableStats& s = h.table.stats();
  RC_CLASSIFY(s.loads_cut_short > 0, "cut short");
  RC_CLASSIFY(s.loads_released > 0, "released");
  RC_CLASSIFY(s.loads_ok > 0, "ok");
  RC_CLASSIFY(s.producers_given_up > 0, "given up");
  RC_CLASSIFY(s.producers_lost > 0, "peer gone");
  RC_CLASSIFY(s.duplicate_answers + s.mismatched_answers > 0, "stray");
  RC_ASSERT(s.loads_started == completions.size());
  RC_ASSERT(s.loads_ok + s.loads_failed + s.loads_released == s.loads_started);
  RC_ASSERT(s.late_answers == m.late);
  RC_ASSERT(s.duplicate_answers == m.duplicate);
  RC_ASSERT(s.mismatched_answers == m.mismatched);
  RC_ASSERT(s.release_answers == m.release_answers);
}

}  // namespace
}  // namespace kvrelay
