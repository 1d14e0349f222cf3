// faulty_transport.cc — see faulty_transport.h. A fault drill's transport:
// the decision per write is a pure function of (seed, write number) so a
// drill replays; the partial write goes through the real transport.
#include "net/faulty_transport.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "base/check.h"
#include "base/prng.h"

namespace kvrelay::net {

std::vector<Segment> PrefixSegments(std::span<const Segment> segments, uint64_t bytes) {
  std::vector<Segment> out;
  for (const Segment& s : segments) {
    if (bytes == 0) break;
    Segment cut = s;
    cut.bytes = std::min(s.bytes, bytes);
    bytes -= cut.bytes;
    out.push_back(cut);
  }
  return out;
}

namespace {

struct FaultState {
  WriteFaultOptions options;
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> writes{0};
  std::atomic<uint64_t> writes_failed{0};
};

class FaultyTarget final : public Target {
 public:
  FaultyTarget(std::unique_ptr<Target> inner, std::shared_ptr<FaultState> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}

  Status Write(TransferId transfer, std::span<const Segment> segments) override {
    uint64_t total = 0;
    for (const Segment& s : segments) total += s.bytes;
    const uint64_t n = state_->writes.fetch_add(1);
    const bool armed = state_->bytes_written.load() >= state_->options.after_bytes;
    // A uniform draw in [0, 1) from (seed, n).
    const double draw =
        static_cast<double>(Mix64(state_->options.seed * 0x9E3779B97F4A7C15ull + n) >> 11) /
        static_cast<double>(1ull << 53);
    if (!armed || draw >= state_->options.probability || total < 2) {
      Status s = inner_->Write(transfer, segments);
      if (s.ok()) state_->bytes_written.fetch_add(total);
      return s;
    }
    const uint64_t half = total / 2;
    const std::vector<Segment> prefix = PrefixSegments(segments, half);
    Status s = inner_->Write(transfer, prefix);
    state_->bytes_written.fetch_add(s.ok() ? half : 0);
    state_->writes_failed.fetch_add(1);
    return UnavailableError("injected write fault: failed after " + std::to_string(half) +
                            " of " + std::to_string(total) + " bytes (" +
                            (s.ok() ? "prefix written" : "prefix also failed: " + s.message()) +
                            ")");
  }

 private:
  std::unique_ptr<Target> inner_;
  std::shared_ptr<FaultState> state_;
};

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, const WriteFaultOptions& options)
      : inner_(std::move(inner)), state_(std::make_shared<FaultState>()) {
    state_->options = options;
  }
  TransportKind kind() const override { return inner_->kind(); }
  Result<std::unique_ptr<Region>> CreateRegion(const std::string& name,
                                               const RegionLayout& layout) override {
    return inner_->CreateRegion(name, layout);
  }
  Result<std::unique_ptr<Target>> Open(std::span<const uint8_t> registration,
                                       Region* local) override {
    Result<std::unique_ptr<Target>> t = inner_->Open(registration, local);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Target>(std::make_unique<FaultyTarget>(std::move(*t), state_));
  }
  Result<std::unique_ptr<Source>> OpenSource(std::span<const uint8_t> registration,
                                             Region* local) override {
    return inner_->OpenSource(registration, local);  // no read faults (yet)
  }
  const TransportStats& stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<Transport> inner_;
  std::shared_ptr<FaultState> state_;
};

}  // namespace

std::unique_ptr<Transport> MakeFaultyTransport(std::unique_ptr<Transport> inner,
                                               const WriteFaultOptions& options) {
  KV_CHECK(options.enabled());
  KV_CHECK(inner != nullptr);
  return std::make_unique<FaultyTransport>(std::move(inner), options);
}

}  // namespace kvrelay::net
