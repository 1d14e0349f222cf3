// Tests of FaultyTransport over the real shm transport: a failing write
// lands exactly its first half and says so; nothing fails before
// `after_bytes`; the same seed fails the same writes.
#include "net/faulty_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

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

struct Pair {
  std::unique_ptr<Transport> writer, receiver;
  std::unique_ptr<Region> src, dst;
  std::unique_ptr<Target> target;
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
  return p;
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

}  // namespace
}  // namespace kvrelay::net
