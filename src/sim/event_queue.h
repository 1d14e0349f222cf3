// event_queue.h — EventQueue: the simulator's clock and agenda.
//
// Events are ordered by (time, sequence number): ties break in the order
// they were scheduled, so a run is a pure function of its seed. Time jumps
// straight to the next event.
//
// Thread safety: none; the simulator is single-threaded.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

#include "base/time.h"

namespace kvrelay::sim {

enum class EventKind : uint8_t {
  kClientArrive,   // a = request: the client sends both legs
  kLegArrive,      // a = request, b = engine: a leg reaches its engine
  kClientAbort,    // a = request: the client disconnects
  kAbortArrive,    // a = request, b = engine: the abort reaches the engine
  kEngineStep,     // b = engine, x = incarnation
  kLifecycle,      // b = engine, x = incarnation: a lifecycle operation
  kLifecycleEnd,   // b = engine, x = incarnation: resume / wake_up
  kRankTimer,      // b = engine, c = rank, x = incarnation
  kDeliver,        // a = message slot
  kWriteDone,      // a = write slot
  kCrash,          // b = engine
  kHeal,           // b, c = engine pair
  kFaultsEnd,
  kReconnect,      // b = D engine, c = D rank, a = P engine, x = P rank
  kReadDone,       // a = read slot (read mode)
  kRankAbort,      // a = request, b = P engine, c = rank, x = incarnation:
                   // the server's fast abort reaches one of P's ranks
  kDrainCheck,     // a matrix case: every request ended a while ago
  kRestart,        // b = engine, x = incarnation: a crashed engine comes back
  kRelease,        // a = request, b = P engine, x = incarnation: the router's
                   // POST /kv_release reaches P's server
  kLaneClosed,     // b = D engine, c = D rank, a = P engine, x = P rank | P incarnation << 32: the
                   // lane to a P that exited closes (the kernel saw it go)
};

struct Event {
  Instant at;
  uint64_t seq = 0;
  EventKind kind = EventKind::kFaultsEnd;
  uint32_t a = 0, b = 0, c = 0;
  uint64_t x = 0;
};

class EventQueue {
 public:
  void Push(Event e) {
    e.seq = next_seq_++;
    heap_.push(e);
  }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  Event Pop() {
    Event e = heap_.top();
    heap_.pop();
    return e;
  }
  Instant PeekTime() const { return heap_.top().at; }

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.at > b.at || (a.at == b.at && a.seq > b.seq);
    }
  };
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  uint64_t next_seq_ = 0;
};

}  // namespace kvrelay::sim
