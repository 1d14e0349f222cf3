#include "runtime/lane_hub.h"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include "os/log.h"

namespace kvrelay::runtime {

LaneHub::LaneHub(uint32_t rank, LaneLimits limits, Duration attach_within,
                 RankCounters* counters, uint64_t* malformed)
    : rank_(rank),
      limits_(limits),
      attach_within_(attach_within),
      counters_(counters),
      malformed_(malformed) {}

bool LaneHub::Listen(const std::string& address) {
  auto listener = LaneListener::Bind(address);
  if (!listener.ok()) {
    Log("rank", "rank %u: no local lane (@%s: %s); D ranks use ZeroMQ", rank_, address.c_str(),
        listener.status().message().c_str());
    return false;
  }
  listener_ = std::move(*listener);
  return true;
}

void LaneHub::Accept(Instant now) {
  for (int n = 0; n < 64; ++n) {
    const int fd = listener_->Accept();
    if (fd < 0) return;
    if (lanes_.size() >= kMaxLanes) {
      close(fd);
      LogOnce("rank", "lanes_full",
              "rank " + std::to_string(rank_) + ": refused a local lane: " +
                  std::to_string(kMaxLanes) + " open; that D rank uses ZeroMQ");
      continue;
    }
    lanes_.push_back(std::make_unique<LocalLane>(fd, limits_));
    lanes_.back()->set_attach_deadline(now + attach_within_);
  }
}

void LaneHub::Read(LocalLane& lane,
                   const std::function<void(const std::string&, const uint8_t*, size_t)>& fn) {
  lane.Read([&](const uint8_t* data, size_t size) {
    if (!lane.identity().empty()) {
      fn(lane.identity(), data, size);
      return;
    }
    std::optional<std::string> id = ParseLaneAttach(data, size);
    if (!id) {
      ++*malformed_;
      lane.Break("its first frame is not an attach");
      return;
    }
    auto it = of_identity_.find(*id);
    if (it != of_identity_.end() && it->second != &lane) {
      it->second->Break("replaced by a newer lane of the same D rank");
    }
    of_identity_[*id] = &lane;
    lane.set_identity(std::move(*id));
    ++counters_->lanes_opened;
  });
}

LocalLane* LaneHub::LaneOf(const std::string& identity) const {
  auto it = of_identity_.find(identity);
  return it == of_identity_.end() ? nullptr : it->second;
}

void LaneHub::CloseUnattached(Instant now) {
  for (auto& l : lanes_) {
    if (!l->broken() && l->identity().empty() && now >= l->attach_deadline()) {
      l->Break("no attach within " + std::to_string(attach_within_.millis()) + " ms");
    }
  }
}

void LaneHub::Sweep() {
  auto broken = [](const std::unique_ptr<LocalLane>& l) { return l->broken(); };
  if (std::none_of(lanes_.begin(), lanes_.end(), broken)) return;
  for (auto& l : lanes_) {
    if (!l->broken()) continue;
    auto it = of_identity_.find(l->identity());
    if (it != of_identity_.end() && it->second == l.get()) of_identity_.erase(it);
    ++counters_->lanes_broken;
    if (!l->peer_closed()) {  // a D rank that went away is counted, not logged
      LogOnce("rank", "lane_broken:" + l->why_broken(),
              "rank " + std::to_string(rank_) + ": local lane from D " + l->identity() +
                  " broke (" + l->why_broken() + "); its frames go over ZeroMQ");
    }
  }
  std::erase_if(lanes_, broken);
}

void LaneHub::Clear() {
  of_identity_.clear();
  lanes_.clear();
  listener_.reset();
}

}  // namespace kvrelay::runtime
