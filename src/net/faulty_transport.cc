// faulty_transport.cc — see faulty_transport.h. A fault drill's transport:
// the decision per write (read) is a pure function of (seed, write (read)
// number) so a drill replays; the partial write or read goes through the
// real transport.
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

// One direction's draw and counters.
struct FaultDirection {
  const char* what;       // "write" | "read"
  double probability;
  uint64_t after_bytes;
  uint64_t seed;
  std::atomic<uint64_t> bytes{0};  // moved so far (whole operations and prefixes)
  std::atomic<uint64_t> ops{0};    // operations drawn so far
  std::atomic<uint64_t> failed{0};

  FaultDirection(const char* w, double p, uint64_t after, uint64_t s)
      : what(w), probability(p), after_bytes(after), seed(s) {}

  // Runs op(segments) (the real Write or Read), or — when this operation is
  // drawn to fail — op(the first half of them) and then fails.
  template <typename Op>
  Status Run(std::span<const Segment> segments, Op op) {
    uint64_t total = 0;
    for (const Segment& s : segments) total += s.bytes;
    const uint64_t n = ops.fetch_add(1);
    const bool armed = bytes.load() >= after_bytes;
    // A uniform draw in [0, 1) from (seed, n).
    const double draw = static_cast<double>(Mix64(seed * 0x9E3779B97F4A7C15ull + n) >> 11) /
                        static_cast<double>(1ull << 53);
    if (!armed || draw >= probability || total < 2) {
      Status s = op(segments);
      if (s.ok()) bytes.fetch_add(total);
      return s;
    }
    const uint64_t half = total / 2;
    const std::vector<Segment> prefix = PrefixSegments(segments, half);
    Status s = op(std::span<const Segment>(prefix));
    bytes.fetch_add(s.ok() ? half : 0);
    failed.fetch_add(1);
    return UnavailableError(std::string("injected ") + what + " fault: failed after " +
                            std::to_string(half) + " of " + std::to_string(total) +
                            " bytes (" +
                            (s.ok() ? "prefix done" : "prefix also failed: " + s.message()) +
                            ")");
  }
};

struct FaultState {
  explicit FaultState(const WriteFaultOptions& o)
      : writes("write", o.probability, o.after_bytes, o.seed),
        // Reads draw from their own stream of the same seed.
        reads("read", o.read_probability, o.read_after_bytes, o.seed ^ 0x5EAD5EAD5EAD5EADull) {}
  FaultDirection writes;
  FaultDirection reads;
};

class FaultyTarget final : public Target {
 public:
  FaultyTarget(std::unique_ptr<Target> inner, std::shared_ptr<FaultState> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}

  using Target::Write;
  Status Write(TransferId transfer, std::span<const Segment> segments,
               Instant deadline) override {
    return state_->writes.Run(segments, [&](std::span<const Segment> s) {
      return inner_->Write(transfer, s, deadline);
    });
  }

 private:
  std::unique_ptr<Target> inner_;
  std::shared_ptr<FaultState> state_;
};

class FaultySource final : public Source {
 public:
  FaultySource(std::unique_ptr<Source> inner, std::shared_ptr<FaultState> state)
      : inner_(std::move(inner)), state_(std::move(state)) {}

  Status Read(TransferId transfer, std::span<const Segment> segments) override {
    return state_->reads.Run(
        segments, [&](std::span<const Segment> s) { return inner_->Read(transfer, s); });
  }

 private:
  std::unique_ptr<Source> inner_;
  std::shared_ptr<FaultState> state_;
};

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, const WriteFaultOptions& options)
      : inner_(std::move(inner)), state_(std::make_shared<FaultState>(options)) {}
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
    Result<std::unique_ptr<Source>> s = inner_->OpenSource(registration, local);
    if (!s.ok()) return s.status();
    return std::unique_ptr<Source>(std::make_unique<FaultySource>(std::move(*s), state_));
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
