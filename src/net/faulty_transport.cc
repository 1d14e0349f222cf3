// faulty_transport.cc — see faulty_transport.h. A fault drill's transport:
// the decision per write (read) is a pure function of (seed, write (read)
// number) so a drill replays; the partial write or read goes through the
// real transport.
#include "net/faulty_transport.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

  // One operation's draw: whether it fails, and its bytes.
  struct Draw {
    bool fail = false;
    uint64_t total = 0, half = 0;
  };
  Draw Next(std::span<const Segment> segments) {
    Draw d;
    for (const Segment& s : segments) d.total += s.bytes;
    const uint64_t n = ops.fetch_add(1);
    const bool armed = bytes.load() >= after_bytes;
    // A uniform draw in [0, 1) from (seed, n).
    const double draw = static_cast<double>(Mix64(seed * 0x9E3779B97F4A7C15ull + n) >> 11) /
                        static_cast<double>(1ull << 53);
    d.fail = armed && draw < probability && d.total >= 2;
    d.half = d.total / 2;
    return d;
  }
  // The outcome of an operation drawn `d` whose real part (all of it, or
  // the first half when it fails) ended `s`; counts it.
  Status Outcome(const Draw& d, const Status& s) {
    if (!d.fail) {
      if (s.ok()) bytes.fetch_add(d.total);
      return s;
    }
    bytes.fetch_add(s.ok() ? d.half : 0);
    failed.fetch_add(1);
    return UnavailableError(std::string("injected ") + what + " fault: failed after " +
                            std::to_string(d.half) + " of " + std::to_string(d.total) +
                            " bytes (" +
                            (s.ok() ? "prefix done" : "prefix also failed: " + s.message()) +
                            ")");
  }
  // The segments the real operation moves: all, or the first half.
  static std::vector<Segment> Part(const Draw& d, std::span<const Segment> segments) {
    return d.fail ? PrefixSegments(segments, d.half)
                  : std::vector<Segment>(segments.begin(), segments.end());
  }

  // Runs op(segments) (the real Write or Read), or — when this operation is
  // drawn to fail — op(the first half of them) and then fails.
  template <typename Op>
  Status Run(std::span<const Segment> segments, Op op) {
    const Draw d = Next(segments);
    const std::vector<Segment> part = Part(d, segments);
    return Outcome(d, op(std::span<const Segment>(part)));
  }
};

// A polled write or read (Target::StartWrite, Source::StartRead) of the
// real transport, started on all its segments or — drawn to fail — on the
// first half, whose outcome is then the injected failure. Everything else
// is the real one's.
class FaultyPending final : public PendingWrite {
 public:
  FaultyPending(std::unique_ptr<PendingWrite> inner, FaultDirection* direction,
                FaultDirection::Draw draw, std::shared_ptr<void> keep)
      : inner_(std::move(inner)), direction_(direction), draw_(draw), keep_(std::move(keep)) {}
  int fd() const override { return inner_->fd(); }
  bool wants_write() const override { return inner_->wants_write(); }
  std::optional<Status> Progress() override {
    std::optional<Status> s = inner_->Progress();
    if (!s) return s;
    return direction_->Outcome(draw_, *s);
  }
  Instant give_up_at() const override { return inner_->give_up_at(); }
  Status GiveUp() override { return inner_->GiveUp(); }
  Status Abandon(Status why) override { return inner_->Abandon(std::move(why)); }

 private:
  std::unique_ptr<PendingWrite> inner_;
  FaultDirection* const direction_;  // in *keep_
  const FaultDirection::Draw draw_;
  const std::shared_ptr<void> keep_;
};

// Draws the operation, starts its part through start(part) and wraps what
// that returns (nullptr: the real transport offers no polled path now; the
// draw is spent, and the caller's Write or Read draws again).
template <typename StartFn>
std::unique_ptr<PendingWrite> StartFaulty(FaultDirection* direction, std::shared_ptr<void> keep,
                                          std::span<const Segment> segments, StartFn start) {
  const FaultDirection::Draw d = direction->Next(segments);
  const std::vector<Segment> part = FaultDirection::Part(d, segments);
  std::unique_ptr<PendingWrite> inner = start(std::span<const Segment>(part));
  if (inner == nullptr) return nullptr;
  return std::make_unique<FaultyPending>(std::move(inner), direction, d, std::move(keep));
}

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
  bool CopiesInPlace() const override { return inner_->CopiesInPlace(); }
  std::unique_ptr<PendingWrite> StartWrite(TransferId transfer, std::span<const Segment> segments,
                                           Instant deadline) override {
    return StartFaulty(&state_->writes, state_, segments, [&](std::span<const Segment> s) {
      return inner_->StartWrite(transfer, s, deadline);
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
  bool CopiesInPlace() const override { return inner_->CopiesInPlace(); }
  std::unique_ptr<PendingWrite> StartRead(TransferId transfer, std::span<const Segment> segments,
                                          Instant deadline) override {
    return StartFaulty(&state_->reads, state_, segments, [&](std::span<const Segment> s) {
      return inner_->StartRead(transfer, s, deadline);
    });
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
