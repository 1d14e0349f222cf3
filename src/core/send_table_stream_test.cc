// send_table_stream_test.cc — SendTable's chunk-wise hand-off (Progress):
// cases for each rule, then a rapidcheck run of random interleavings.
//
// The Harness drives one SendTable and checks every action as it comes:
//   * StartWrite names a live, unanswered item with no write in flight,
//     starts before the item's deadline, copies exactly the prompt blocks
//     that belong in the destination blocks it names (D asks for the tail
//     of the prompt: dst[k] is prompt block total - want + k), only blocks
//     P handed over, and never more than num_workers at once;
//   * an item is answered at most once, never while its write is in
//     flight, and kOk only when every one of its destination blocks has
//     landed (a completed write) and P's Ready() was accepted — with the
//     first token Ready() named;
//   * SendFinished comes once per transfer whose Progress or Ready was
//     accepted, never while a write of it is in flight, never otherwise.
// CheckInvariants() runs after every input; Quiesce() requires every item
// answered once and every hold finished.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "base/time.h"
#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/send_table.h"
#include "core/transfer_result.h"

namespace kvrelay {
namespace {

constexpr Duration kTimeout = Duration::Seconds(10);
constexpr uint32_t kToken = 77;

Instant Ms(int64_t ms) { return Instant::Epoch() + Duration::Milliseconds(ms); }
TransferId Tid(uint64_t n) { return TransferId{0x57eaULL, n}; }
PeerId Peer(uint32_t n) { return PeerId{n, 1}; }
// P's block k of transfer t (distinct per transfer).
BlockId PBlock(TransferId t, uint32_t k) {
  return BlockId{static_cast<uint32_t>(t.lo * 100 + k), 1};
}
BlockId DBlock(uint32_t peer, uint64_t seq, uint32_t k) {
  return BlockId{static_cast<uint32_t>(peer * 100000 + seq * 100 + k), 7};
}

SendTableOptions Opts(uint32_t workers) {
  SendTableOptions o;
  o.abort_timeout = kTimeout;
  o.giveup_grace = Duration::Seconds(6);
  o.num_workers = workers;
  return o;
}

class Harness {
 public:
  struct Item {
    TransferId t;
    std::vector<BlockId> dst;
    std::vector<bool> landed;
    uint32_t total = 0;  // the prompt's blocks, as the test defines it
    Instant deadline;
    int answers = 0;
    TransferResult result = TransferResult::kOk;
    uint32_t token = kNoFirstToken;
    std::optional<WriteId> write;
    std::vector<uint32_t> writing;  // positions in dst the write covers
  };

  explicit Harness(uint32_t workers = 4) : table_(Opts(workers)), workers_(workers) {}

  SendTable& table() { return table_; }
  Instant now = Ms(0);

  void Claim(TransferId t, uint32_t total, uint32_t need = 1, uint64_t hash = 0) {
    total_[t] = total;
    ASSERT_TRUE(table_.Claim(t, need, now, hash).ok());
    Drain();
  }
  // Hands over the first n blocks; returns the status.
  Status Progress(TransferId t, uint32_t n, uint64_t hash = 0) {
    std::vector<BlockId> prefix;
    for (uint32_t k = 0; k < n; ++k) prefix.push_back(PBlock(t, k));
    Status s = table_.Progress(t, prefix, total_[t], now, hash);
    if (s.ok()) {
      // The first accepted hand-over is the hold (a refused one after it
      // leaves the hold in place).
      holds_.emplace(t, 0);
      handed_[t] = std::max(handed_[t], n);
    }
    Drain();
    return s;
  }
  Status Ready(TransferId t, uint64_t hash = 0) {
    std::vector<BlockId> all;
    for (uint32_t k = 0; k < total_[t]; ++k) all.push_back(PBlock(t, k));
    Status s = table_.Ready(t, all, now, hash, kToken);
    if (s.ok()) {
      holds_.emplace(t, 0);
      handed_[t] = total_[t];
      readied_[t] = true;
    }
    Drain();
    return s;
  }
  // D peer `peer` pulls the last `want` blocks of t's prompt.
  void Pull(uint32_t peer, uint64_t seq, TransferId t, uint32_t want, uint64_t hash = 0) {
    PullItem pi;
    pi.transfer = t;
    pi.prompt_hash = hash;
    for (uint32_t k = 0; k < want; ++k) pi.dst.push_back(DBlock(peer, seq, k));
    Item item;
    item.t = t;
    item.dst = pi.dst;
    item.landed.assign(want, false);
    item.total = total_.count(t) ? total_[t] : want;
    item.deadline = now + kTimeout;
    items_[Key(peer, seq, t)] = item;
    table_.Pull(Peer(peer), seq, std::vector<PullItem>{pi}, now);
    Drain();
  }
  void Abort(TransferId t) {
    table_.Abort(t, now);
    Drain();
  }
  void ReleaseHeld() {
    table_.ReleaseHeld(now);
    Drain();
  }
  void AdvanceTo(Instant t) {
    now = t;
    table_.OnTimer(now);
    Drain();
  }
  // Completes the write in flight for (peer, seq, t).
  void Complete(uint32_t peer, uint64_t seq, TransferId t, bool ok = true) {
    Item& item = items_.at(Key(peer, seq, t));
    ASSERT_TRUE(item.write.has_value()) << "no write in flight";
    const WriteId w = *item.write;
    if (ok) {
      for (uint32_t k : item.writing) item.landed[k] = true;
    }
    item.write.reset();
    item.writing.clear();
    --in_flight_;
    --in_flight_of_[t];
    table_.WriteDone(w, ok, now);
    Drain();
  }
  // Any write in flight, oldest key first; false if none.
  bool CompleteAny(bool ok = true) {
    for (auto& [key, item] : items_) {
      if (item.write) {
        Complete(key.peer, key.seq, item.t, ok);
        return true;
      }
    }
    return false;
  }
  bool Writing(uint32_t peer, uint64_t seq, TransferId t) const {
    return items_.at(Key(peer, seq, t)).write.has_value();
  }
  // Destination positions the write in flight covers.
  std::vector<uint32_t> WritingPositions(uint32_t peer, uint64_t seq, TransferId t) const {
    return items_.at(Key(peer, seq, t)).writing;
  }
  const Item& item(uint32_t peer, uint64_t seq, TransferId t) const {
    return items_.at(Key(peer, seq, t));
  }
  int finished(TransferId t) const {
    auto it = holds_.find(t);
    return it == holds_.end() ? 0 : it->second;
  }
  // Everything answered once, every hold finished once, nothing writing.
  void Quiesce() {
    while (CompleteAny()) {
    }
    for (auto& [t, n] : total_) {
      if (table_.StateOf(t)) {
        table_.Abort(t, now);
        Drain();
      }
    }
    while (CompleteAny()) {
    }
    for (const auto& [key, item] : items_) {
      EXPECT_EQ(item.answers, 1) << "peer " << key.peer << " seq " << key.seq;
    }
    for (const auto& [t, n] : holds_) EXPECT_EQ(n, 1) << t.ToString();
    EXPECT_EQ(table_.live_sends(), 0u);
    EXPECT_EQ(table_.writes_in_flight(), 0u);
  }

 private:
  struct Key {
    uint32_t peer;
    uint64_t seq;
    TransferId t;
    Key(uint32_t p, uint64_t s, TransferId tt) : peer(p), seq(s), t(tt) {}
    bool operator<(const Key& o) const {
      if (peer != o.peer) return peer < o.peer;
      if (seq != o.seq) return seq < o.seq;
      return t < o.t;
    }
  };

  void Drain() {
    table_.CheckInvariants();
    while (auto a = table_.PollAction()) {
      if (auto* ans = std::get_if<AnswerPull>(&*a)) {
        auto it = items_.find(Key(ans->peer.index, ans->pull_seq, ans->transfer));
        ASSERT_NE(it, items_.end()) << "answer for an unknown item";
        Item& item = it->second;
        ++item.answers;
        EXPECT_EQ(item.answers, 1) << "answered twice";
        EXPECT_FALSE(item.write.has_value()) << "answered while its write is in flight";
        item.result = ans->result;
        item.token = ans->first_token;
        if (ans->result == TransferResult::kOk) {
          EXPECT_TRUE(readied_[item.t]) << "kOk before P's Ready";
          EXPECT_TRUE(std::all_of(item.landed.begin(), item.landed.end(),
                                  [](bool b) { return b; }))
              << "kOk on a partial transfer";
          EXPECT_EQ(ans->first_token, kToken);
        }
      } else if (auto* w = std::get_if<StartWrite>(&*a)) {
        auto it = items_.find(Key(w->peer.index, w->pull_seq, w->transfer));
        ASSERT_NE(it, items_.end()) << "write for an unknown item";
        Item& item = it->second;
        EXPECT_EQ(item.answers, 0) << "write for an answered item";
        EXPECT_FALSE(item.write.has_value()) << "two writes of one item at once";
        EXPECT_LT(now, w->deadline) << "a write started at or after its deadline";
        EXPECT_EQ(w->deadline, item.deadline);
        ASSERT_EQ(w->src.size(), w->dst.size());
        ASSERT_FALSE(w->dst.empty());
        const uint32_t total = total_[w->transfer];
        const uint32_t offset = total - static_cast<uint32_t>(item.dst.size());
        for (size_t j = 0; j < w->dst.size(); ++j) {
          auto pos = std::find(item.dst.begin(), item.dst.end(), w->dst[j]);
          ASSERT_NE(pos, item.dst.end()) << "a block D did not ask for";
          const auto k = static_cast<uint32_t>(pos - item.dst.begin());
          EXPECT_FALSE(item.landed[k]) << "a block written twice";
          EXPECT_EQ(w->src[j], PBlock(w->transfer, offset + k)) << "the wrong source block";
          EXPECT_LT(offset + k, handed_[w->transfer]) << "a block P has not handed over";
          item.writing.push_back(k);
        }
        item.write = w->write;
        ++in_flight_;
        ++in_flight_of_[w->transfer];
        EXPECT_LE(in_flight_, workers_);
      } else if (auto* f = std::get_if<SendFinished>(&*a)) {
        auto it = holds_.find(f->transfer);
        ASSERT_NE(it, holds_.end()) << "SendFinished for a transfer never held";
        ++it->second;
        EXPECT_EQ(it->second, 1) << "SendFinished twice";
        EXPECT_EQ(in_flight_of_[f->transfer], 0u) << "SendFinished while a write reads";
      }
    }
    table_.CheckInvariants();
  }

  SendTable table_;
  uint32_t workers_;
  uint32_t in_flight_ = 0;
  std::map<TransferId, uint32_t> in_flight_of_;
  std::map<Key, Item> items_;
  std::map<TransferId, uint32_t> total_;
  std::map<TransferId, uint32_t> handed_;
  std::map<TransferId, bool> readied_;
  std::map<TransferId, int> holds_;  // accepted hold → SendFinished count
};

const TransferId A = Tid(1);

TEST(SendTableStreamTest, AWaitingPullIsServedChunkByChunkAndAnsweredAfterTheLast) {
  Harness h;
  h.Claim(A, 4);
  h.Pull(1, 1, A, 4);
  EXPECT_FALSE(h.Writing(1, 1, A));
  ASSERT_TRUE(h.Progress(A, 2).ok());
  EXPECT_EQ(h.table().StateOf(A), SendState::kStreaming);
  ASSERT_TRUE(h.Writing(1, 1, A));
  EXPECT_EQ(h.WritingPositions(1, 1, A), (std::vector<uint32_t>{0, 1}));
  h.Complete(1, 1, A);
  EXPECT_EQ(h.item(1, 1, A).answers, 0);  // a chunk is not the transfer
  ASSERT_TRUE(h.Progress(A, 3).ok());
  EXPECT_EQ(h.WritingPositions(1, 1, A), (std::vector<uint32_t>{2}));
  // The last chunk is ready while the previous chunk's write is in flight.
  ASSERT_TRUE(h.Ready(A).ok());
  EXPECT_EQ(h.table().StateOf(A), SendState::kReady);
  h.Complete(1, 1, A);
  EXPECT_EQ(h.item(1, 1, A).answers, 0);
  EXPECT_EQ(h.WritingPositions(1, 1, A), (std::vector<uint32_t>{3}));
  h.Complete(1, 1, A);
  EXPECT_EQ(h.item(1, 1, A).answers, 1);
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kOk);
  EXPECT_EQ(h.finished(A), 1);
  EXPECT_EQ(h.table().stats().chunk_writes, 3u);
  h.Quiesce();
}

TEST(SendTableStreamTest, AnAbortBetweenChunksAnswersNowAndFreesOnlyAfterTheWriteInFlight) {
  Harness h;
  h.Claim(A, 4, /*need=*/2);
  h.Pull(1, 1, A, 4);
  h.Pull(2, 1, A, 4);
  ASSERT_TRUE(h.Progress(A, 1).ok());
  h.Complete(1, 1, A);  // peer 1's first chunk landed; peer 2's is writing
  ASSERT_TRUE(h.Writing(2, 1, A));
  h.Abort(A);
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kAborted);
  EXPECT_EQ(h.item(2, 1, A).answers, 0);  // its write still reads P's block
  EXPECT_EQ(h.finished(A), 0);
  h.Complete(2, 1, A);
  EXPECT_EQ(h.item(2, 1, A).result, TransferResult::kAborted);  // not kOk: a chunk
  EXPECT_EQ(h.finished(A), 1);
  // The request finishes later: its Ready is refused, no second hold.
  EXPECT_EQ(h.Ready(A).code(), StatusCode::kCancelled);
  EXPECT_EQ(h.Progress(A, 2).code(), StatusCode::kCancelled);
  h.Quiesce();
}

TEST(SendTableStreamTest, DAsksForTheTailOnlyAndWaitsForItsFirstBlock) {
  Harness h;
  h.Claim(A, 5);
  h.Pull(1, 1, A, 2);  // D had prompt blocks 0..2 cached: it wants 3 and 4
  ASSERT_TRUE(h.Progress(A, 3).ok());
  EXPECT_FALSE(h.Writing(1, 1, A));
  ASSERT_TRUE(h.Progress(A, 4).ok());
  EXPECT_EQ(h.WritingPositions(1, 1, A), (std::vector<uint32_t>{0}));
  h.Complete(1, 1, A);
  ASSERT_TRUE(h.Ready(A).ok());
  h.Complete(1, 1, A);
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kOk);
  h.Quiesce();
}

TEST(SendTableStreamTest, APullArrivingMidStreamGetsWhatIsThereAtOnce) {
  Harness h;
  h.Claim(A, 3);
  ASSERT_TRUE(h.Progress(A, 2).ok());
  EXPECT_EQ(h.finished(A), 0);
  h.Pull(1, 1, A, 3);
  EXPECT_EQ(h.WritingPositions(1, 1, A), (std::vector<uint32_t>{0, 1}));
  h.Complete(1, 1, A);
  ASSERT_TRUE(h.Ready(A).ok());
  h.Complete(1, 1, A);
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kOk);
  h.Quiesce();
}

TEST(SendTableStreamTest, AChunkUnderOtherWeightsEndsTheSendAndNeverMeetsTheFirst) {
  Harness h;
  h.Claim(A, 4, 1, /*hash=*/11);
  h.Pull(1, 1, A, 4, 11);
  ASSERT_TRUE(h.Progress(A, 2, 11).ok());
  h.Complete(1, 1, A);
  // A weights update between chunks: the next chunk's fingerprint differs.
  EXPECT_EQ(h.Progress(A, 3, 12).code(), StatusCode::kCancelled);
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kMismatch);
  EXPECT_EQ(h.finished(A), 1);
  EXPECT_EQ(h.Ready(A, 12).code(), StatusCode::kCancelled);
  h.Quiesce();
}

TEST(SendTableStreamTest, AReadyUnderOtherWeightsThanTheChunksEndsTheSend) {
  Harness h;
  h.Claim(A, 2, 1, 11);
  h.Pull(1, 1, A, 2, 11);
  ASSERT_TRUE(h.Progress(A, 1, 11).ok());
  EXPECT_EQ(h.Ready(A, 12).code(), StatusCode::kCancelled);
  EXPECT_EQ(h.finished(A), 0);  // the chunk's write still reads
  h.Complete(1, 1, A);
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kMismatch);
  EXPECT_EQ(h.finished(A), 1);
  h.Quiesce();
}

TEST(SendTableStreamTest, ADeadlineBetweenChunksEndsTheSend) {
  Harness h;
  h.Claim(A, 4);
  h.Pull(1, 1, A, 4);
  ASSERT_TRUE(h.Progress(A, 1).ok());
  h.Complete(1, 1, A);
  h.AdvanceTo(Ms(0) + kTimeout);
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kDeadline);
  EXPECT_EQ(h.finished(A), 1);
  EXPECT_EQ(h.Progress(A, 2).code(), StatusCode::kCancelled);
  h.Quiesce();
}

TEST(SendTableStreamTest, AChunkLandingAfterTheDeadlineStartsNoFurtherWrite) {
  Harness h;
  h.Claim(A, 4);
  h.Pull(1, 1, A, 4);
  ASSERT_TRUE(h.Progress(A, 2).ok());
  ASSERT_TRUE(h.Progress(A, 3).ok());  // block 2 is there while 0-1 write
  h.now = Ms(0) + kTimeout;            // the write ends at the deadline
  h.Complete(1, 1, A);
  EXPECT_FALSE(h.Writing(1, 1, A));
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kDeadline);
  EXPECT_EQ(h.finished(A), 1);
  h.Quiesce();
}

TEST(SendTableStreamTest, ACacheResetEndsAStreamedSendLikeAHeldOne) {
  Harness h;
  h.Claim(A, 4);
  h.Pull(1, 1, A, 4);
  ASSERT_TRUE(h.Progress(A, 2).ok());
  h.Complete(1, 1, A);
  h.ReleaseHeld();
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kReset);
  EXPECT_EQ(h.finished(A), 1);
  h.Quiesce();
}

TEST(SendTableStreamTest, AllBlocksStreamedBeforeReadyAreAnsweredAtReadyWithoutAnotherWrite) {
  Harness h;
  h.Claim(A, 2);
  h.Pull(1, 1, A, 2);
  ASSERT_TRUE(h.Progress(A, 2).ok());
  h.Complete(1, 1, A);
  EXPECT_EQ(h.item(1, 1, A).answers, 0);  // no kOk before Ready: no first token yet
  ASSERT_TRUE(h.Ready(A).ok());
  EXPECT_FALSE(h.Writing(1, 1, A));
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kOk);
  EXPECT_EQ(h.item(1, 1, A).token, kToken);
  EXPECT_EQ(h.finished(A), 1);
  h.Quiesce();
}

TEST(SendTableStreamTest, AFailedChunkWriteEndsTheSend) {
  Harness h;
  h.Claim(A, 4, 2);
  h.Pull(1, 1, A, 4);
  h.Pull(2, 1, A, 4);
  ASSERT_TRUE(h.Progress(A, 2).ok());
  h.Complete(1, 1, A, /*ok=*/false);
  EXPECT_EQ(h.item(1, 1, A).result, TransferResult::kWriteFailed);
  h.Complete(2, 1, A);
  EXPECT_EQ(h.item(2, 1, A).result, TransferResult::kWriteFailed);
  EXPECT_EQ(h.finished(A), 1);
  h.Quiesce();
}

TEST(SendTableStreamTest, ChunkWritesShareTheBoundedSenderPool) {
  Harness h(/*workers=*/1);
  h.Claim(A, 3);
  h.Pull(1, 1, A, 3);
  h.Pull(2, 1, A, 3);
  ASSERT_TRUE(h.Progress(A, 1).ok());
  EXPECT_TRUE(h.Writing(1, 1, A));
  EXPECT_FALSE(h.Writing(2, 1, A));
  EXPECT_EQ(h.table().queued_for_sender(), 1u);
  h.Complete(1, 1, A);  // the sender goes to peer 2, the oldest queued
  EXPECT_TRUE(h.Writing(2, 1, A));
  h.Quiesce();
}

TEST(SendTableStreamTest, BadProgressIsRefusedAndHoldsNothing) {
  Harness h;
  h.Claim(A, 2);
  std::vector<BlockId> none;
  EXPECT_EQ(h.table().Progress(A, none, 2, h.now).code(), StatusCode::kInvalidArgument);
  std::vector<BlockId> three{PBlock(A, 0), PBlock(A, 1), PBlock(A, 2)};
  EXPECT_EQ(h.table().Progress(A, three, 2, h.now).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h.table().Progress(Tid(9), three, 3, h.now).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.table().StateOf(A), SendState::kWaiting);
  h.Quiesce();
}

// Random interleavings of every input of a streamed transfer; the harness
// checks every rule on the fly and at quiescence.
RC_GTEST_PROP(SendTableStreamProperty, EveryInterleavingKeepsTheRules, ()) {
  const uint32_t workers = *rc::gen::inRange<uint32_t>(1, 3);
  const uint32_t total = *rc::gen::inRange<uint32_t>(1, 6);
  const uint32_t need = *rc::gen::inRange<uint32_t>(1, 3);
  const auto ops = *rc::gen::container<std::vector<uint8_t>>(rc::gen::inRange<uint8_t>(0, 9));
  Harness h(workers);
  h.Claim(A, total, need);
  uint32_t handed = 0;
  uint64_t seq = 0;
  bool ready = false;
  for (uint8_t op : ops) {
    switch (op) {
      case 0:
      case 1:
        if (!ready && handed < total) (void)h.Progress(A, ++handed);
        break;
      case 2:
        if (!ready) {
          ready = true;
          (void)h.Ready(A);
        }
        break;
      case 3:
        if (seq < 4) {
          const uint32_t peer = 1 + static_cast<uint32_t>(seq % 2);
          h.Pull(peer, ++seq, A, *rc::gen::inRange<uint32_t>(1, total + 1));
        }
        break;
      case 4:
      case 5:
        h.CompleteAny(true);
        break;
      case 6:
        h.CompleteAny(false);
        break;
      case 7:
        h.AdvanceTo(h.now + Duration::Seconds(3));
        break;
      case 8:
        if (*rc::gen::inRange(0, 4) == 0) h.Abort(A);
        break;
    }
  }
  h.Quiesce();
}

}  // namespace
}  // namespace kvrelay
