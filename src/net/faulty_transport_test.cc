// Tests of FaultyTransport over the real shm transport: a failing write
// lands exactly its first half and says so; nothing fails before
// `after_bytes`; the same seed fails the same writes; reads likewise, drawn
// apart from writes.
#include "net/faulty_transport.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <string>
#include <vector>

#include "os/clock.h"

namespace kvrelay::net {
namespace {

constexpr TransferId kT{0x1111, 0x2222};

TEST(PrefixSegments, CutsAtTheByteCount) {
  const std::vector<Segment> s = {{0, 100, 10}, {10, 200, 10}, {20, 300, 10}};
  EXPECT_TRUE(PrefixSegments(s, 0).empty());
  EXPECT_EQ(PrefixSegments(s, 15), (std::vector<Segment>{{0, 100, 10}, {10, 200, 5}}));
  EXPECT_EQ(PrefixSegments(s, 30), s);
  EXPECT_EQ(PrefixSegments(s, 99), s);
}

// The faulty transport owns `src` (filled with 0xAB) and has opened the
// other transport's `dst` for writing (`target`) and for reading
// (`source`; `dst` is filled with 0xCD by tests that read).
struct Pair {
  std::unique_ptr<Transport> writer, receiver;
  std::unique_ptr<Region> src, dst;
  std::unique_ptr<Target> target;
  std::unique_ptr<Source> source;
};

Pair MakePair(const WriteFaultOptions& faults, const std::string& name) {
  Pair p;
  auto w = MakeShmTransport({});
  auto r = MakeShmTransport({});
  EXPECT_TRUE(w.ok() && r.ok());
  p.writer = MakeFaultyTransport(std::move(*w), faults);
  p.receiver = std::move(*r);
  const RegionLayout layout{1, 4, 1024};
  auto src = p.writer->CreateRegion(name + "-src", layout);
  auto dst = p.receiver->CreateRegion(name + "-dst", layout);
  EXPECT_TRUE(src.ok() && dst.ok());
  p.src = std::move(*src);
  p.dst = std::move(*dst);
  std::fill(p.src->bytes().begin(), p.src->bytes().end(), uint8_t{0xAB});
  auto t = p.writer->Open(p.dst->registration(), p.src.get());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  p.target = std::move(*t);
  auto source = p.writer->OpenSource(p.dst->registration(), p.src.get());
  EXPECT_TRUE(source.ok()) << source.status().ToString();
  p.source = std::move(*source);
  return p;
}

bool All(std::span<const uint8_t> bytes, uint8_t value) {
  return std::all_of(bytes.begin(), bytes.end(), [&](uint8_t b) { return b == value; });
}

TEST(FaultyTransport, AFailingWriteLandsItsFirstHalfOnly) {
  Pair p = MakePair({.probability = 1.0, .after_bytes = 0, .seed = 7}, "ft-half");
  const std::vector<Segment> segs = {{0, 0, 1024}, {1024, 1024, 1024}};
  Status s = p.target->Write(kT, segs);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("1024 of 2048"), std::string::npos) << s.message();
  const auto d = p.dst->bytes();
  EXPECT_TRUE(std::all_of(d.begin(), d.begin() + 1024, [](uint8_t b) { return b == 0xAB; }));
  EXPECT_TRUE(std::all_of(d.begin() + 1024, d.end(), [](uint8_t b) { return b == 0; }));
}

TEST(FaultyTransport, NothingFailsBeforeAfterBytes) {
  Pair p = MakePair({.probability = 1.0, .after_bytes = 2048, .seed = 7}, "ft-after");
  const std::vector<Segment> one = {{0, 0, 1024}};
  EXPECT_TRUE(p.target->Write(kT, one).ok());
  EXPECT_TRUE(p.target->Write(kT, one).ok());
  EXPECT_EQ(p.target->Write(kT, one).code(), StatusCode::kUnavailable);
}

TEST(FaultyTransport, TheSameSeedFailsTheSameWrites) {
  auto outcomes = [](uint64_t seed, const std::string& name) {
    Pair p = MakePair({.probability = 0.5, .after_bytes = 0, .seed = seed}, name);
    const std::vector<Segment> one = {{0, 0, 1024}};
    std::string out;
    for (int i = 0; i < 64; ++i) out += p.target->Write(kT, one).ok() ? '1' : '0';
    return out;
  };
  const std::string a = outcomes(3, "ft-seed-a"), b = outcomes(3, "ft-seed-b");
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find('0'), std::string::npos);
  EXPECT_NE(a.find('1'), std::string::npos);
}

TEST(FaultyTransport, AFailingReadLandsItsFirstHalfOnly) {
  Pair p = MakePair({.seed = 7, .read_probability = 1.0}, "ft-read-half");
  std::fill(p.dst->bytes().begin(), p.dst->bytes().end(), uint8_t{0xCD});
  std::fill(p.src->bytes().begin(), p.src->bytes().end(), uint8_t{0});
  // Remote blocks 2, 3 → local blocks 0, 1.
  const std::vector<Segment> segs = {{2048, 0, 1024}, {3072, 1024, 1024}};
  Status s = p.source->Read(kT, segs);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("injected read fault"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1024 of 2048"), std::string::npos) << s.message();
  const auto local = p.src->bytes();
  EXPECT_TRUE(All(local.first(1024), 0xCD));
  EXPECT_TRUE(All(local.subspan(1024), 0));
  // Write faults are off: writes go through whole.
  EXPECT_TRUE(p.target->Write(kT, segs).ok());
}

TEST(FaultyTransport, ReadsAndWritesAreDrawnApart) {
  // Write faults on, read faults off: every read succeeds, and reading
  // does not move the writes' draws or byte count.
  auto writes = [](bool read_between, const std::string& name) {
    Pair p = MakePair({.probability = 0.5, .after_bytes = 0, .seed = 5}, name);
    const std::vector<Segment> one = {{0, 0, 1024}};
    std::string out;
    for (int i = 0; i < 32; ++i) {
      if (read_between) {
        EXPECT_TRUE(p.source->Read(kT, one).ok());
      }
      out += p.target->Write(kT, one).ok() ? '1' : '0';
    }
    return out;
  };
  EXPECT_EQ(writes(false, "ft-apart-a"), writes(true, "ft-apart-b"));
  // Read faults wait for their own byte count.
  Pair p =
      MakePair({.seed = 5, .read_probability = 1.0, .read_after_bytes = 2048}, "ft-apart-c");
  const std::vector<Segment> one = {{0, 0, 1024}};
  EXPECT_TRUE(p.target->Write(kT, one).ok());  // writes do not count toward it
  EXPECT_TRUE(p.source->Read(kT, one).ok());
  EXPECT_TRUE(p.source->Read(kT, one).ok());
  EXPECT_EQ(p.source->Read(kT, one).code(), StatusCode::kUnavailable);
}

// Polled operations over tcp (Target::StartWrite, Source::StartRead) are
// drawn as Write and Read are: one drawn to fail moves its first half
// through the real polled operation and then ends kUnavailable; with faults
// off (not yet armed) they pass through whole.
TEST(FaultyTransport, PolledWritesAndReadsFailHalfWayToo) {
  for (const bool fail : {true, false}) {
    SCOPED_TRACE(fail ? "drawn to fail" : "faults off");
    TransportOptions options;
    options.tcp_streams = 1;
    auto w = MakeTcpTransport(options);
    auto r = MakeTcpTransport(options);
    ASSERT_TRUE(w.ok() && r.ok());
    // Off: armed only after far more bytes than the test moves.
    const uint64_t after = fail ? 1 : uint64_t{1} << 40;
    std::unique_ptr<Transport> faulty = MakeFaultyTransport(
        std::move(*w), {.probability = 1.0, .after_bytes = after, .seed = 3,
                        .read_probability = 1.0, .read_after_bytes = after});
    const RegionLayout layout{1, 4, 1024};
    auto mine = faulty->CreateRegion("ft-polled-mine", layout);
    auto peer = (*r)->CreateRegion("ft-polled-peer", layout);
    ASSERT_TRUE(mine.ok() && peer.ok());
    std::fill((*mine)->bytes().begin(), (*mine)->bytes().end(), uint8_t{0xAB});
    std::fill((*peer)->bytes().begin(), (*peer)->bytes().end(), uint8_t{0xCD});
    auto target = faulty->Open((*peer)->registration(), mine->get());
    auto source = faulty->OpenSource((*peer)->registration(), mine->get());
    ASSERT_TRUE(target.ok() && source.ok());
    (*peer)->grants().Grant(kT, std::vector<uint32_t>{0, 1, 2, 3});
    (*peer)->read_grants().Grant(kT, std::vector<uint32_t>{0, 1, 2, 3});
    // A first byte, through whole (faults start after 1 byte): opens the stream.
    ASSERT_TRUE((*target)->Write(kT, std::vector<Segment>{{3072, 3072, 1}}).ok());
    ASSERT_TRUE((*source)->Read(kT, std::vector<Segment>{{3072, 3072, 1}}).ok());
    const auto drive = [](PendingWrite& op) {
      for (int i = 0; i < 10'000; ++i) {
        if (std::optional<Status> s = op.Progress()) return *s;
        pollfd pfd{op.fd(), static_cast<short>(op.wants_write() ? POLLOUT : POLLIN), 0};
        poll(&pfd, 1, 1000);
      }
      return InternalError("never ended");
    };
    const Instant soon = MonoNow() + Duration::Seconds(10);
    // Write my block 0 into the peer's block 0: two 512-byte segments.
    auto wr =
        (*target)->StartWrite(kT, std::vector<Segment>{{0, 0, 512}, {512, 512, 512}}, soon);
    ASSERT_NE(wr, nullptr);
    const Status ws = drive(*wr);
    EXPECT_EQ(ws.code(), fail ? StatusCode::kUnavailable : StatusCode::kOk) << ws.ToString();
    const auto peer0 = (*peer)->bytes().first(1024);
    EXPECT_TRUE(All(peer0.first(512), 0xAB));
    EXPECT_TRUE(All(peer0.subspan(512), fail ? 0xCD : 0xAB));
    // Read the peer's block 1 into my block 1.
    auto rd = (*source)->StartRead(kT, std::vector<Segment>{{1024, 1024, 1024}}, soon);
    ASSERT_NE(rd, nullptr);
    const Status rs = drive(*rd);
    EXPECT_EQ(rs.code(), fail ? StatusCode::kUnavailable : StatusCode::kOk) << rs.ToString();
    if (fail) {
      EXPECT_NE(rs.message().find("injected read fault"), std::string::npos);
    }
    const auto mine1 = (*mine)->bytes().subspan(1024, 1024);
    EXPECT_TRUE(All(mine1.first(512), 0xCD));
    EXPECT_TRUE(All(mine1.subspan(512), fail ? 0xAB : 0xCD));
  }
}

}  // namespace
}  // namespace kvrelay::net
