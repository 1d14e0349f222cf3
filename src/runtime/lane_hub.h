// lane_hub.h — LaneHub: a P rank's end of the local lanes, the Unix sockets
// that carry control frames from the same host's D ranks without ZeroMQ
// (runtime/local_lane.h; docs/wire.md, "The local lane").
//
// Why a class: the P side of a lane is a small state machine of its own —
// accepted (bounded), then attached by its first frame to a D rank's
// routing identity (a newer lane of the same identity replaces the older),
// broken by a fault, by its D, or for not attaching in time — and the rank's
// loop only needs its fds, its frames and a lane to answer on.
//
// Ownership: one per P RankActor. Threading: the rank's thread only.
// Invariant: an identity maps to at most one lane, and that lane is one of
// lanes() and attached to that identity.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/time.h"
#include "runtime/local_lane.h"
#include "runtime/rank_state.h"

namespace kvrelay::runtime {

class LaneHub {
 public:
  // `counters`: lanes opened and broken, and malformed attaches, are counted
  // there. A lane must attach within `attach_within` of its accept.
  LaneHub(uint32_t rank, LaneLimits limits, Duration attach_within, RankCounters* counters,
          uint64_t* malformed);

  // Binds the listener; logs and returns false if it cannot (D ranks then
  // use ZeroMQ).
  bool Listen(const std::string& address);
  int listener_fd() const { return listener_ == nullptr ? -1 : listener_->fd(); }
  // Takes the connections waiting (a bounded number open at once).
  void Accept(Instant now);
  const std::vector<std::unique_ptr<LocalLane>>& lanes() const { return lanes_; }
  // Reads `lane`: its first frame must attach it to a D rank; every later
  // frame goes to `fn(identity, data, size)`.
  void Read(LocalLane& lane,
            const std::function<void(const std::string&, const uint8_t*, size_t)>& fn);
  // The lane attached for `identity` (not yet swept), or null.
  LocalLane* LaneOf(const std::string& identity) const;
  void CloseUnattached(Instant now);
  // Drops the broken lanes (logging those their D did not close).
  void Sweep();
  void Clear();

 private:
  static constexpr size_t kMaxLanes = 1024;
  const uint32_t rank_;
  const LaneLimits limits_;
  const Duration attach_within_;
  RankCounters* const counters_;
  uint64_t* const malformed_;
  std::unique_ptr<LaneListener> listener_;
  std::vector<std::unique_ptr<LocalLane>> lanes_;
  std::unordered_map<std::string, LocalLane*> of_identity_;
};

}  // namespace kvrelay::runtime
