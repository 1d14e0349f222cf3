// send_table_invariants.cc — SendTable's observers and its O(n) structural
// check (for tests, /debug/state and the simulator), apart from the
// transitions in send_table.cc.
#include "base/check.h"
#include "core/send_table.h"

namespace kvrelay {

void SendTable::CheckInvariants() const {
  expiry_.CheckInvariants();
  deadlines_.CheckInvariants();
  KV_CHECK_LE(writes_in_flight_, options_.num_workers);
  KV_CHECK_EQ(tombstones_.size(), tombstone_fifo_.size());
  size_t items_seen = 0, queued_seen = 0;
  uint32_t writes_seen = 0;
  // Every entry's tag is its record's transfer id's, and a lookup of that
  // id finds the entry.
  index_.CheckInvariants(SendKeyOf{&sends_});
  index_.ForEach([&](uint32_t s) {
    const Send& send = sends_[s];
    KV_CHECK(send.used);
    // A DONE record lingers only while a write reads its blocks.
    if (send.state == SendState::kDone) {
      KV_CHECK_GT(send.writes_in_flight, 0u);
      KV_CHECK(!expiry_.IsArmed(s));
    }
    // Every READY send and every unclaimed placeholder can expire; a
    // running request never does.
    if (send.state == SendState::kReady) KV_CHECK(expiry_.IsArmed(s));
    if (send.state == SendState::kWaiting) {
      KV_CHECK_EQ(expiry_.IsArmed(s), !send.claimed);
      KV_CHECK(!send.holds_blocks);
    }
    // A streamed send's request is still running: it holds a prefix of
    // its prompt's blocks and does not expire.
    if (send.state == SendState::kStreaming) {
      KV_CHECK(send.claimed && send.holds_blocks && !send.readied);
      KV_CHECK(!expiry_.IsArmed(s));
    }
    if (send.state == SendState::kReady) KV_CHECK(send.readied);
    if (send.readied) KV_CHECK_EQ(send.blocks.size(), send.total_blocks);
    KV_CHECK_LE(send.blocks.size(), send.total_blocks);
    KV_CHECK_EQ(send.holds_blocks, !send.blocks.empty());
    uint32_t writing = 0;
    uint32_t n = 0;
    for (uint32_t i = send.items.head; i != kNil; i = items_[i].in_send.next) {
      const Item& item = items_[i];
      KV_CHECK_EQ(item.send, s);
      KV_CHECK_LE(item.sent, item.want);
      if (send.holds_blocks) KV_CHECK_LE(item.want, send.total_blocks);
      ++n;
      switch (item.state) {
        case ItemState::kWaiting:
          // For its prefill, or (streaming) for the next chunk: an item with
          // blocks to write never waits outside the admission queue.
          KV_CHECK(send.state == SendState::kWaiting ||
                   send.state == SendState::kStreaming);
          KV_CHECK(deadlines_.IsArmed(i));
          KV_CHECK_LE(Available(i), item.sent);
          break;
        case ItemState::kQueued:
          KV_CHECK(send.state == SendState::kReady ||
                   send.state == SendState::kStreaming);
          KV_CHECK(deadlines_.IsArmed(i));
          KV_CHECK_GT(Available(i), item.sent);
          ++queued_seen;
          break;
        case ItemState::kWriting:
          KV_CHECK(!deadlines_.IsArmed(i));
          KV_CHECK_GT(item.writing_to, item.sent);
          KV_CHECK_LE(item.writing_to, item.want);
          ++writing;
          break;
        case ItemState::kFree:
          KV_CHECK_MSG(false, "free item linked to a send");
      }
    }
    KV_CHECK_EQ(n, send.items.size);
    KV_CHECK_EQ(writing, send.writes_in_flight);
    writes_seen += writing;
    items_seen += n;
  });
  KV_CHECK_EQ(items_seen, live_items_);
  KV_CHECK_EQ(live_keys_.size(), live_items_);
  KV_CHECK_EQ(answered_.size(), answered_fifo_.size());
  // Both memories evict before they insert: never bound + 1 entries, so
  // never a capacity doubled for one entry.
  KV_CHECK_LE(answered_.capacity(), decltype(answered_)::CapacityFor(options_.max_tombstones));
  KV_CHECK_LE(tombstones_.capacity(),
              decltype(tombstones_)::CapacityFor(options_.max_tombstones));
  KV_CHECK_EQ(queued_seen, admission_.size);
  KV_CHECK_EQ(writes_seen, writes_in_flight_);
  KV_CHECK_EQ(deadlines_.size() + writes_in_flight_, live_items_);
  // A sender is idle only when nothing waits for one.
  if (admission_.size > 0) KV_CHECK_EQ(writes_in_flight_, options_.num_workers);
  for (const auto& [t, r] : tombstones_) KV_CHECK(r != TransferResult::kOk);
}


const char* SendStateName(SendState state) {
  switch (state) {
    case SendState::kWaiting: return "WAITING";
    case SendState::kStreaming: return "STREAMING";
    case SendState::kReady: return "READY";
    case SendState::kDone: return "DONE";
  }
  return "?";
}

std::vector<SendView> SendTable::Sends() const {
  std::vector<SendView> out;
  out.reserve(index_.size());
  for (const Send& s : sends_) {
    if (!s.used) continue;
    out.push_back(SendView{s.transfer, s.state, s.created, s.need, s.pulled,
                           s.writes_in_flight, static_cast<uint32_t>(s.blocks.size()),
                           s.items.size});
  }
  return out;
}

}  // namespace kvrelay
