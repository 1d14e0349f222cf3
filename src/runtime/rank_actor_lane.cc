// rank_actor_lane.cc — RankActor's local lanes: P's listener and the
// lanes it accepted, D's lane to each P rank, and the two send paths that
// prefer a lane to ZeroMQ.
//
// Why a file of its own: rank_actor.cc is the loop and the frames; this is
// the one place that decides which path a control frame takes and when a
// lane opens, attaches or is dropped. The rules (docs/wire.md, "The local
// lane"): D opens a lane only before a P incarnation is known, so frames on
// the two paths never pass each other; a broken lane sends D back to
// ZeroMQ; P answers a routing id on its lane while it has one.
//
// Thread safety: the rank's thread only, as every RankActor handler.
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "os/clock.h"
#include "os/log.h"
#include "runtime/local_host.h"
#include "runtime/rank_actor.h"

namespace kvrelay::runtime {

bool RankActor::SameHost(const std::string& host) const {
  // shm maps P's region, so its P is on this host whatever the name says.
  return transport_->kind() == net::TransportKind::kShm || IsLocalHost(host);
}

std::string RankActor::RoutingId() const {
  return std::to_string(options_.engine_id) + ":" + std::to_string(options_.rank) + ":" +
         std::to_string(options_.incarnation);
}

bool RankActor::ConnectLane(Conn& c) {
  if (!c.same_host) return false;
  if (c.lane != nullptr) {
    // A new P incarnation: the old process's lane is dead or dying.
    c.lane->Break("P restarted");
    ++counters_.lanes_broken;
    retired_lanes_.push_back(std::move(c.lane));
  }
  auto lane = LocalLane::Connect(LaneAddress(c.engine, c.rank, c.port), LaneLimitsFor(options_));
  if (!lane.ok()) return false;  // P not up yet, another host, or no lane: ZeroMQ
  c.lane = std::move(*lane);
  if (c.lane->Send(LaneAttachFrame(RoutingId())) != LocalLane::SendResult::kSent) {
    retired_lanes_.push_back(std::move(c.lane));
    return false;
  }
  ++counters_.lanes_opened;
  return true;
}

void RankActor::SweepLanes() {
  for (auto& [key, c] : conns_) {
    if (c.lane != nullptr && c.lane->broken()) {
      ++counters_.lanes_broken;
      LogOnce("rank", "lane_broken:" + c.lane->why_broken(),
              "rank " + std::to_string(options_.rank) + ": local lane to " + c.endpoint +
                  " broke (" + c.lane->why_broken() + "); its frames go over ZeroMQ");
      session_.OnLaneClosed(c.engine, c.rank, /*process_gone=*/false, MonoNow());
      // P's end closed: if the kernel says its process is gone (now, or at
      // a heartbeat soon after: the socket closes while P still exits), P
      // is dead now, not after peer_dead_after of silence (rule 8).
      if (c.lane->peer_closed()) {
        c.closed_lane_pid = c.lane->peer_pid();
        CheckLanePeerGone(c, MonoNow());
      }
      retired_lanes_.push_back(std::move(c.lane));
    }
  }
  retired_lanes_.clear();
  lanes_.Sweep();
}

std::optional<bool> RankActor::SendOnLane(LocalLane& lane, const std::vector<uint8_t>& frame) {
  switch (lane.Send(frame)) {
    case LocalLane::SendResult::kSent:
      ++counters_.frames_out;
      ++counters_.lane_frames_out;
      return true;
    case LocalLane::SendResult::kQueueFull:
      ++send_failures_;  // as a ZeroMQ socket at its high-water mark
      return false;
    case LocalLane::SendResult::kBroken:
      break;
  }
  return std::nullopt;
}

bool RankActor::SendToD(const std::string& identity, const std::vector<uint8_t>& frame) {
  if (LocalLane* lane = lanes_.LaneOf(identity)) {
    if (std::optional<bool> sent = SendOnLane(*lane, frame)) return *sent;
    // Broken: D went away or falls back to its DEALER, if any.
  }
  return SendFrame(router_, &identity, frame);
}

bool RankActor::SendToP(Conn& c, const std::vector<uint8_t>& frame) {
  if (c.lane != nullptr) {
    if (std::optional<bool> sent = SendOnLane(*c.lane, frame)) return *sent;
    // Broken: P gone or closed it; ZeroMQ from here on (SweepLanes).
  }
  return SendFrame(c.sock, nullptr, frame);
}

}  // namespace kvrelay::runtime
