// Tests of the three transports through the Transport interface: each case
// runs for shm, tcp and ucx (ucx is skipped where UCX cannot start). The
// writer ("P") and the receiver ("D") use separate Transport instances, as
// two processes would; the fork tests prove the cross-process path.
#include "net/transport.h"

#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "base/prng.h"
#include "engine/byte_kv_memory.h"
#include "net/tcp_stream.h"
#include "net/write_plan.h"
#include "os/clock.h"

namespace kvrelay::net {
namespace {

using namespace std::chrono_literals;

constexpr TransferId kT1{0x1111, 0x2222};
constexpr TransferId kT2{0x3333, 0x4444};

// A small layout: 4 planes × 8 blocks × 256 bytes.
RegionLayout SmallLayout() { return RegionLayout{4, 8, 256}; }

// Waits (bounded) for `pred`; true if it held in time.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

void FillPattern(std::span<uint8_t> bytes, uint64_t seed) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<uint8_t>(Mix64(seed + i / 8) >> (8 * (i % 8)));
  }
}

// What `dst` holds after copying `segments` from `src` into it.
std::vector<uint8_t> Expected(std::span<const uint8_t> src, std::vector<uint8_t> dst,
                              std::span<const Segment> segments) {
  for (const Segment& s : segments) {
    std::memcpy(dst.data() + s.dst_offset, src.data() + s.src_offset, s.bytes);
  }
  return dst;
}

bool AllZero(std::span<const uint8_t> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

// Whole blocks `src_block`..+n of every plane → `dst_block`..+n.
std::vector<Segment> BlockSegments(const RegionLayout& l, uint32_t src_block, uint32_t dst_block,
                                   uint32_t n) {
  std::vector<Segment> out;
  for (uint64_t plane = 0; plane < l.planes; ++plane) {
    out.push_back(Segment{(plane * l.num_blocks + src_block) * l.block_stride_bytes,
                          (plane * l.num_blocks + dst_block) * l.block_stride_bytes,
                          n * l.block_stride_bytes});
  }
  return out;
}

std::vector<uint32_t> Range(uint32_t first, uint32_t n) {
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(first + i);
  return out;
}

std::string UniqueName(const std::string& base) {
  static std::atomic<int> counter{0};
  return base + "-" + std::to_string(counter.fetch_add(1));
}

// The forked child's part: reads a length-prefixed registration from
// `in`, writes `segs` from a region filled with FillPattern(5) into it.
// 0 on success, else the step that failed.
uint8_t ChildWrite(TransportKind kind, int in, const RegionLayout& layout,
                   const std::vector<Segment>& segs) {
  uint32_t len = 0;
  pollfd pfd{in, POLLIN, 0};
  if (poll(&pfd, 1, 30'000) != 1 || read(in, &len, 4) != 4 || len > 4096) return 10;
  std::vector<uint8_t> reg(len);
  size_t got = 0;
  while (got < len) {
    const ssize_t r = read(in, reg.data() + got, len - got);
    if (r <= 0) return 11;
    got += static_cast<size_t>(r);
  }
  auto transport = MakeTransport(kind, TransportOptions{});
  if (!transport.ok()) return 12;
  auto region = transport.value()->CreateRegion("child", layout);
  if (!region.ok()) return 13;
  FillPattern(region.value()->bytes(), 5);
  auto target = transport.value()->Open(reg, region.value().get());
  if (!target.ok()) return 14;
  const Status s = target.value()->Write(kT1, segs);
  return s.ok() ? 0 : static_cast<uint8_t>(100 + static_cast<int>(s.code()));
}

class TransportTest : public testing::TestWithParam<TransportKind> {
 protected:
  void SetUp() override {
    options_.tcp_streams = 2;
    auto p = MakeTransport(GetParam(), options_);
    if (!p.ok() && GetParam() == TransportKind::kUcx) {
      GTEST_SKIP() << "ucx unavailable: " << p.status().ToString();
    }
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto d = MakeTransport(GetParam(), options_);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    p_ = std::move(p).value();
    d_ = std::move(d).value();
  }

  std::unique_ptr<Region> NewRegion(Transport& t, const RegionLayout& layout) {
    auto r = t.CreateRegion(UniqueName("test"), layout);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return nullptr;
    EXPECT_EQ(r.value()->bytes().size(), layout.bytes());
    EXPECT_TRUE(AllZero(r.value()->bytes()));
    return std::move(r).value();
  }

  std::unique_ptr<Target> OpenTarget(Region& remote, Region& local) {
    auto t = p_->Open(remote.registration(), &local);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }

  // P's and D's regions of `layout`, P's filled with FillPattern(seed);
  // both null on failure (recorded).
  struct Regions {
    std::unique_ptr<Region> p, d;
  };
  Regions NewRegions(const RegionLayout& layout, uint64_t seed) {
    Regions r{NewRegion(*p_, layout), NewRegion(*d_, layout)};
    if (!r.p || !r.d) return {};
    FillPattern(r.p->bytes(), seed);
    return r;
  }

  // D opens P's region `remote` for reading into `local`.
  std::unique_ptr<Source> OpenSource(Region& remote, Region& local) {
    auto s = d_->OpenSource(remote.registration(), &local);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  bool IsTcp() const { return GetParam() == TransportKind::kTcp; }

  TransportOptions options_;
  std::unique_ptr<Transport> p_;
  std::unique_ptr<Transport> d_;
};

TEST_P(TransportTest, WriteLandsExactlyTheSegments) {
  const RegionLayout layout = SmallLayout();
  auto p = NewRegion(*p_, layout);
  auto d = NewRegion(*d_, layout);
  ASSERT_TRUE(p && d);
  FillPattern(p->bytes(), 1);
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(target);

  // Blocks 0,1 → 2,3 whole, and half of block 4 → the middle of block 5.
  std::vector<Segment> segs = BlockSegments(layout, 0, 2, 2);
  for (uint64_t plane = 0; plane < layout.planes; ++plane) {
    segs.push_back(Segment{(plane * 8 + 4) * 256, (plane * 8 + 5) * 256 + 64, 128});
  }
  d->grants().Grant(kT1, std::vector<uint32_t>{2, 3, 5});
  const std::vector<uint8_t> before(d->bytes().begin(), d->bytes().end());
  ASSERT_TRUE(target->Write(kT1, segs).ok());
  const auto want = Expected(p->bytes(), before, segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));

  uint64_t total = 0;
  for (const Segment& s : segs) total += s.bytes;
  EXPECT_EQ(p_->stats().writes_ok.load(), 1u);
  EXPECT_EQ(p_->stats().bytes_written.load(), total);
  EXPECT_EQ(p_->stats().writes_failed.load(), 0u);
  if (IsTcp()) {
    EXPECT_EQ(d_->stats().bytes_received.load(), total);
  }

  // Empty writes and zero-byte segments succeed and move nothing.
  EXPECT_TRUE(target->Write(kT1, {}).ok());
  const std::vector<Segment> empty = {Segment{0, 0, 0}};
  EXPECT_TRUE(target->Write(kT1, empty).ok());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));
}

TEST_P(TransportTest, RealKvThroughAPlanReadsBackOnD) {
  engine::ModelShape shape;
  ASSERT_TRUE(engine::ModelShapeByName("tiny", &shape));
  // P tp 1 (all groups) → D tp 2 rank 1 (groups 2, 3).
  const uint32_t p_blocks = 8, d_blocks = 10;
  auto p = NewRegion(*p_, LayoutFor(shape, 1, p_blocks));
  auto d = NewRegion(*d_, LayoutFor(shape, 2, d_blocks));
  ASSERT_TRUE(p && d);
  engine::ByteKvMemory p_mem(shape, p_blocks, 0, 4, p->bytes());
  engine::ByteKvMemory d_mem(shape, d_blocks, 2, 2, d->bytes());
  const std::vector<BlockId> src = {{1, 1}, {2, 1}, {6, 1}};
  const std::vector<BlockId> dst = {{7, 1}, {8, 1}, {0, 1}};
  for (const BlockId b : src) {
    for (uint32_t g = 0; g < 4; ++g) p_mem.Write(b, g, Mix64(b.index * 10 + g));
  }
  const auto plan = PlanWrite(shape, 1, 0, p_blocks, 2, 1, d_blocks, src, dst);
  d->grants().Grant(kT1, std::vector<uint32_t>{7, 8, 0});
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(target);
  ASSERT_TRUE(target->Write(kT1, plan).ok());
  for (size_t i = 0; i < src.size(); ++i) {
    for (uint32_t g = 2; g < 4; ++g) EXPECT_EQ(d_mem.Read(dst[i], g), p_mem.Read(src[i], g));
  }
}

TEST_P(TransportTest, ConcurrentWritersOfDisjointTransfers) {
  const RegionLayout layout{4, 16, 512};
  auto p = NewRegion(*p_, layout);
  auto d = NewRegion(*d_, layout);
  ASSERT_TRUE(p && d);
  FillPattern(p->bytes(), 2);
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(target);
  constexpr uint32_t kThreads = 4;  // more than tcp_streams: some wait
  constexpr uint32_t kBlocksEach = 4;
  constexpr int kRounds = 25;
  std::vector<std::vector<Segment>> segs(kThreads);
  for (uint32_t i = 0; i < kThreads; ++i) {
    const TransferId t{100 + i, 7};
    // Thread i copies P's blocks of thread (i+1) to its own D blocks.
    segs[i] = BlockSegments(layout, ((i + 1) % kThreads) * kBlocksEach, i * kBlocksEach,
                            kBlocksEach);
    d->grants().Grant(t, Range(i * kBlocksEach, kBlocksEach));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < kRounds; ++round) {
        if (!target->Write(TransferId{100 + i, 7}, segs[i]).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<uint8_t> want(layout.bytes(), 0);
  for (const auto& s : segs) want = Expected(p->bytes(), want, s);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));
  EXPECT_EQ(p_->stats().writes_ok.load(), uint64_t{kThreads} * kRounds);
}

TEST_P(TransportTest, ManySmallSegmentsSpanSeveralFrames) {
  // 2 planes × 40000 blocks of 16 bytes: 80000 one-block segments with a
  // gap between them is more than one tcp frame's 65536 segments.
  const RegionLayout layout{2, 40000, 16};
  auto p = NewRegion(*p_, layout);
  auto d = NewRegion(*d_, layout);
  ASSERT_TRUE(p && d);
  FillPattern(p->bytes(), 3);
  std::vector<Segment> segs;
  std::vector<uint32_t> blocks;
  for (uint32_t b = 0; b < layout.num_blocks; b += 2) blocks.push_back(b);
  for (uint64_t plane = 0; plane < layout.planes; ++plane) {
    for (uint32_t b : blocks) {
      const uint64_t off = (plane * layout.num_blocks + b) * layout.block_stride_bytes;
      segs.push_back(Segment{off, off, layout.block_stride_bytes});
    }
  }
  while (segs.size() <= (1u << 16)) {  // top up with the odd blocks of plane 0
    const uint32_t b = static_cast<uint32_t>(segs.size() - 40000) * 2 + 1;
    segs.push_back(Segment{b * 16ull, b * 16ull, 16});
    blocks.push_back(b);
  }
  d->grants().Grant(kT1, blocks);
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(target);
  ASSERT_TRUE(target->Write(kT1, segs).ok());
  const auto want = Expected(p->bytes(), std::vector<uint8_t>(layout.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));
}

TEST_P(TransportTest, SegmentsOutsideARegionAreRefusedAndTouchNothingEitherWay) {
  const RegionLayout layout = SmallLayout();
  auto p = NewRegion(*p_, layout);
  auto d = NewRegion(*d_, layout);
  ASSERT_TRUE(p && d);
  FillPattern(p->bytes(), 4);
  d->grants().Grant(kT1, Range(0, layout.num_blocks));
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(target);
  const uint64_t size = layout.bytes();
  const std::vector<std::vector<Segment>> bad = {
      {{0, size - 8, 16}},                 // dst runs past the end
      {{0, size, 1}},                      // dst starts at the end
      {{0, UINT64_MAX - 4, 16}},           // dst offset + bytes wraps
      {{size - 8, 0, 16}},                 // src runs past the end
      {{UINT64_MAX - 4, 0, 16}},           // src wraps
      {{0, 0, 64}, {0, size - 1, 2}},      // one good segment, one bad
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const Status s = target->Write(kT1, bad[i]);
    EXPECT_FALSE(s.ok()) << "case " << i;
  }
  EXPECT_TRUE(AllZero(d->bytes()));
  EXPECT_EQ(p_->stats().writes_ok.load(), 0u);
  EXPECT_EQ(p_->stats().writes_failed.load(), bad.size());
  if (IsTcp()) {
    // Dst errors are found by the receiver: refused and counted there.
    EXPECT_EQ(d_->stats().writes_refused.load(), 4u);
  }
  // The target still works.
  const auto good = BlockSegments(layout, 0, 0, 1);
  ASSERT_TRUE(target->Write(kT1, good).ok());
  const auto want = Expected(p->bytes(), std::vector<uint8_t>(size, 0), good);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));

  // The same segments read from P's region into a fresh one of D's: now
  // dst is local and src remote.
  auto d2 = NewRegion(*d_, layout);
  ASSERT_TRUE(d2);
  p->read_grants().Grant(kT1, Range(0, layout.num_blocks));
  auto source = OpenSource(*p, *d2);
  ASSERT_TRUE(source);
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_FALSE(source->Read(kT1, bad[i]).ok()) << "read case " << i;
  }
  EXPECT_TRUE(AllZero(d2->bytes()));
  EXPECT_EQ(d_->stats().reads_ok.load(), 0u);
  EXPECT_EQ(d_->stats().reads_failed.load(), bad.size());
  if (IsTcp()) {
    // Src errors are found by P's receiver: refused and counted there.
    EXPECT_EQ(p_->stats().reads_refused.load(), 2u);
  }
  ASSERT_TRUE(source->Read(kT1, good).ok());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d2->bytes().begin()));
}

TEST_P(TransportTest, MalformedRegistrationsAreRejected) {
  auto p = NewRegion(*p_, SmallLayout());
  auto d = NewRegion(*d_, SmallLayout());
  ASSERT_TRUE(p && d);
  const std::vector<uint8_t>& good = d->registration();
  ASSERT_FALSE(good.empty());
  ASSERT_LE(good.size(), 4096u);  // fits the control channel's limit
  // Every truncation, and a trailing byte.
  for (size_t n = 0; n < good.size(); ++n) {
    auto t = p_->Open(std::span(good).first(n), p.get());
    ASSERT_FALSE(t.ok()) << "truncated to " << n;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << "truncated to " << n;
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  auto t = p_->Open(longer, p.get());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);

  const uint64_t seed = 0xBADC0DE5;
  std::cout << "random registrations: seed " << seed << "\n";
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng prng(seed);
  for (int i = 0; i < 10000; ++i) {
    std::vector<uint8_t> junk(prng.Uniform(good.size() * 2 + 1));
    for (uint8_t& b : junk) b = static_cast<uint8_t>(prng.Next64());
    // Half keep the real magic and version, so decoding gets further.
    if (i % 2 == 1 && junk.size() >= 8) std::copy_n(good.begin(), 8, junk.begin());
    auto r = p_->Open(junk, p.get());
    ASSERT_FALSE(r.ok()) << "buffer " << i;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "buffer " << i;
  }
  // Single-byte corruptions of the real thing: none may crash; most are
  // rejected (a changed tcp host or port decodes, and fails on Write).
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> bent = good;
    bent[i] ^= static_cast<uint8_t>(1 + prng.Uniform(255));
    auto r = p_->Open(bent, p.get());
    if (GetParam() == TransportKind::kShm) {
      EXPECT_FALSE(r.ok()) << "byte " << i;
    }
  }
}

TEST_P(TransportTest, AForkedChildWritesIntoTheParentsRegion) {
  if (GetParam() == TransportKind::kUcx) GTEST_SKIP() << "cross-process ucx is not tested here";
  // Fork first, while this process runs no transport threads; the child
  // waits for the registration on a pipe.
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const RegionLayout layout = SmallLayout();
  const std::vector<Segment> segs = BlockSegments(layout, 1, 4, 3);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(to_child[1]);
    close(from_child[0]);
    // Runs in scope so the child's region (and its shm segment) is
    // destroyed before _exit.
    const uint8_t code = ChildWrite(GetParam(), to_child[0], layout, segs);
    (void)!write(from_child[1], &code, 1);
    _exit(0);
  }
  close(to_child[0]);
  close(from_child[1]);
  auto d = NewRegion(*d_, layout);
  ASSERT_TRUE(d);
  d->grants().Grant(kT1, Range(4, 3));
  const auto& reg = d->registration();
  const uint32_t len = static_cast<uint32_t>(reg.size());
  ASSERT_EQ(write(to_child[1], &len, 4), 4);
  ASSERT_EQ(write(to_child[1], reg.data(), reg.size()), static_cast<ssize_t>(reg.size()));
  pollfd pfd{from_child[0], POLLIN, 0};
  uint8_t code = 255;
  const bool answered = poll(&pfd, 1, 30'000) == 1 && read(from_child[0], &code, 1) == 1;
  if (!answered) kill(pid, SIGKILL);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  close(to_child[1]);
  close(from_child[0]);
  ASSERT_TRUE(answered) << "the child did not answer in time";
  ASSERT_EQ(code, 0) << "child failed at step " << int{code};
  if (IsTcp()) {
    // Already true (the child saw the reply); the acquire load orders this
    // thread after the receiver's writes for the race detector.
    uint64_t total = 0;
    for (const Segment& s : segs) total += s.bytes;
    EXPECT_TRUE(WaitFor([&] { return d_->stats().bytes_received.load() >= total; }));
  }
  // The child's P region held FillPattern(5); recompute it here.
  std::vector<uint8_t> p_bytes(layout.bytes());
  FillPattern(p_bytes, 5);
  const auto want = Expected(p_bytes, std::vector<uint8_t>(layout.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));
}

// ---------------------------------------------------------------------------
// Read mode: D reads P's region into its own (P's region is the remote one).

TEST_P(TransportTest, ReadMovesExactlyTheSegments) {
  const RegionLayout layout = SmallLayout();
  auto [p, d] = NewRegions(layout, 11);
  ASSERT_TRUE(p && d);
  FillPattern(d->bytes(), 12);  // what is not read must stay
  auto source = OpenSource(*p, *d);
  ASSERT_TRUE(source);
  // P's blocks 4,5 → D's 0,1 whole; a piece of P's block 1 → the middle
  // of D's block 6; the last 3 bytes of the region; an empty segment.
  std::vector<Segment> segs = BlockSegments(layout, 4, 0, 2);
  for (uint64_t plane = 0; plane < layout.planes; ++plane) {
    segs.push_back(Segment{(plane * 8 + 1) * 256 + 17, (plane * 8 + 6) * 256 + 100, 99});
  }
  segs.push_back(Segment{layout.bytes() - 3, 5, 3});
  segs.push_back(Segment{0, 0, 0});
  p->read_grants().Grant(kT1, std::vector<uint32_t>{1, 4, 5, 7});
  const std::vector<uint8_t> before(d->bytes().begin(), d->bytes().end());
  const Status status = source->Read(kT1, segs);
  ASSERT_TRUE(status.ok()) << status.ToString();
  const auto want = Expected(p->bytes(), before, segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));

  uint64_t total = 0;
  for (const Segment& seg : segs) total += seg.bytes;
  EXPECT_EQ(d_->stats().reads_ok.load(), 1u);
  EXPECT_EQ(d_->stats().bytes_read.load(), total);
  EXPECT_EQ(d_->stats().reads_failed.load(), 0u);
  EXPECT_EQ(d_->stats().bytes_written.load(), 0u);
  if (IsTcp()) {
    EXPECT_EQ(p_->stats().bytes_served.load(), total);
    EXPECT_EQ(p_->stats().reads_refused.load(), 0u);
  }
  // Empty reads succeed and move nothing.
  EXPECT_TRUE(source->Read(kT1, {}).ok());
  const std::vector<Segment> empty = {Segment{0, 0, 0}};
  EXPECT_TRUE(source->Read(kT1, empty).ok());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));
}

TEST_P(TransportTest, ConcurrentReadersAndWritersShareTheRegions) {
  // Threads 0..3 read P's block ranges into D while threads 4..7 write
  // P's other blocks into D; all through one Source and one Target.
  const RegionLayout layout{2, 16, 1024};
  auto [p, d] = NewRegions(layout, 14);
  ASSERT_TRUE(p && d);
  auto source = OpenSource(*p, *d);
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(source && target);
  constexpr uint32_t kEach = 2;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (uint32_t i = 0; i < 8; ++i) {
    const TransferId t{200 + i, 9};
    const auto segs = BlockSegments(layout, (7 - i) * kEach, i * kEach, kEach);
    if (i < 4) {
      p->read_grants().Grant(t, Range((7 - i) * kEach, kEach));
    } else {
      d->grants().Grant(t, Range(i * kEach, kEach));
    }
    threads.emplace_back([&, i, t, segs] {
      for (int round = 0; round < 20; ++round) {
        const Status st = i < 4 ? source->Read(t, segs) : target->Write(t, segs);
        if (!st.ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<uint8_t> want(layout.bytes(), 0);
  for (uint32_t i = 0; i < 8; ++i) {
    want = Expected(p->bytes(), want, BlockSegments(layout, (7 - i) * kEach, i * kEach, kEach));
  }
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));
  EXPECT_EQ(d_->stats().reads_ok.load(), 80u);
  EXPECT_EQ(p_->stats().writes_ok.load(), 80u);
}

TEST_P(TransportTest, AReadAfterTheRemoteSideIsDestroyedFails) {
  // First P's region goes (its transport lives on), then region and
  // transport; each time a Source opened before fails, and does not hang.
  const RegionLayout layout = SmallLayout();
  for (const bool transport_too : {false, true}) {
    SCOPED_TRACE(transport_too ? "region and transport destroyed" : "region destroyed");
    auto [p, d] = NewRegions(layout, 15);
    ASSERT_TRUE(p && d);
    p->read_grants().Grant(kT1, Range(0, layout.num_blocks));
    auto source = OpenSource(*p, *d);
    ASSERT_TRUE(source);
    const auto segs = BlockSegments(layout, 0, 0, 2);
    ASSERT_TRUE(source->Read(kT1, segs).ok());
    const std::vector<uint8_t> registration = p->registration();
    const uint64_t failed_before = d_->stats().reads_failed.load();
    p.reset();
    if (transport_too) p_.reset();
    const auto start = std::chrono::steady_clock::now();
    const Status status = source->Read(kT1, segs);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << status.ToString();
    EXPECT_FALSE(status.ok());
    EXPECT_EQ(d_->stats().reads_failed.load(), failed_before + 1);
    if (transport_too) continue;
    EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
    // Opening it anew fails at once (shm, ucx) or on the first Read (tcp:
    // OpenSource connects lazily).
    auto again = d_->OpenSource(registration, d.get());
    if (again.ok()) {
      EXPECT_EQ(again.value()->Read(kT1, segs).code(), StatusCode::kUnavailable);
    } else {
      EXPECT_EQ(again.status().code(), StatusCode::kUnavailable) << again.status().ToString();
    }
  }
}

TEST_P(TransportTest, BigReadAndWriteOf64MiBIn2MiBSegments) {
  // 2 planes × 32 blocks × 1 MiB: every 2-block run, read into the
  // mirrored position on D (so no segment lands where it came from).
  const RegionLayout layout{2, 32, 1 << 20};
  auto [p, d] = NewRegions(layout, 16);
  ASSERT_TRUE(p && d);
  std::vector<Segment> segs;
  for (uint64_t plane = 0; plane < layout.planes; ++plane) {
    for (uint32_t b = 0; b < layout.num_blocks; b += 2) {
      segs.push_back(BlockSegments(layout, b, layout.num_blocks - 2 - b, 2)[plane]);
    }
  }
  ASSERT_EQ(segs.size(), 32u);
  p->read_grants().Grant(kT1, Range(0, layout.num_blocks));
  d->grants().Grant(kT1, Range(0, layout.num_blocks));
  auto source = OpenSource(*p, *d);
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(source && target);
  using Clock = std::chrono::steady_clock;
  auto mib_per_s = [&](Clock::duration took) {
    return 64.0 / std::chrono::duration<double>(took).count();
  };
  // One warm-up of each (first touch of D's pages, connections), then the
  // best of three.
  double read_best = 0, write_best = 0;
  for (int round = 0; round < 4; ++round) {
    auto start = Clock::now();
    const Status r = source->Read(kT1, segs);
    const double read = mib_per_s(Clock::now() - start);
    ASSERT_TRUE(r.ok()) << r.ToString();
    start = Clock::now();
    const Status w = target->Write(kT1, segs);
    const double write = mib_per_s(Clock::now() - start);
    ASSERT_TRUE(w.ok()) << w.ToString();
    if (round > 0) {
      read_best = std::max(read_best, read);
      write_best = std::max(write_best, write);
    }
  }
  std::cout << TransportName(GetParam()) << ": 64 MiB in 2 MiB segments, best of 3: read "
            << static_cast<int>(read_best) << " MiB/s, write " << static_cast<int>(write_best)
            << " MiB/s\n";
  // Both moved P's bytes into the mirrored places on D.
  const auto want =
      Expected(p->bytes(), std::vector<uint8_t>(layout.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));
  EXPECT_EQ(d_->stats().bytes_read.load(), 4 * layout.bytes());
}

TEST_P(TransportTest, AWriteWhoseDeadlinePassedFailsAtOnceAndTouchesNothing) {
  const RegionLayout layout = SmallLayout();
  auto [p, d] = NewRegions(layout, 21);
  ASSERT_TRUE(p && d);
  d->grants().Grant(kT1, Range(0, layout.num_blocks));
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(target);
  const auto segs = BlockSegments(layout, 0, 0, layout.num_blocks);
  const Status s = target->Write(kT1, segs, MonoNow() - Duration::Milliseconds(1));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_TRUE(AllZero(d->bytes()));
  EXPECT_EQ(p_->stats().writes_failed.load(), 1u);
  // A deadline ahead is no obstacle.
  ASSERT_TRUE(target->Write(kT1, segs, MonoNow() + Duration::Seconds(30)).ok());
  const auto want = Expected(p->bytes(), std::vector<uint8_t>(layout.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d->bytes().begin()));
}

INSTANTIATE_TEST_SUITE_P(AllKinds, TransportTest,
                         testing::Values(TransportKind::kShm, TransportKind::kTcp,
                                         TransportKind::kUcx),
                         [](const testing::TestParamInfo<TransportKind>& param_info) {
                           return std::string(TransportName(param_info.param));
                         });

// ---------------------------------------------------------------------------
// tcp: the receiver enforces grants and survives hostile peers.

// P and D tcp transports made with `options`, a region of `layout` on each,
// P's filled with FillPattern(seed): the setup of the tcp fixtures below.
struct TcpPair {
  std::unique_ptr<Transport> p, d;
  std::unique_ptr<Region> p_region, d_region;
};
void MakeTcpPair(const TransportOptions& options, const RegionLayout& layout, uint64_t seed,
                 TcpPair* out) {
  auto p = MakeTcpTransport(options);
  auto d = MakeTcpTransport(options);
  ASSERT_TRUE(p.ok() && d.ok());
  out->p = std::move(p).value();
  out->d = std::move(d).value();
  auto pr = out->p->CreateRegion("p", layout);
  auto dr = out->d->CreateRegion("d", layout);
  ASSERT_TRUE(pr.ok() && dr.ok());
  out->p_region = std::move(pr).value();
  out->d_region = std::move(dr).value();
  FillPattern(out->p_region->bytes(), seed);
}

class TcpTest : public testing::Test {
 protected:
  void SetUp() override {
    TransportOptions options;
    options.tcp_streams = 2;
    TcpPair pair;
    ASSERT_NO_FATAL_FAILURE(MakeTcpPair(options, layout_, 9, &pair));
    p_ = std::move(pair.p);
    d_ = std::move(pair.d);
    p_region_ = std::move(pair.p_region);
    d_region_ = std::move(pair.d_region);
    auto t = p_->Open(d_region_->registration(), p_region_.get());
    ASSERT_TRUE(t.ok());
    target_ = std::move(t).value();
  }

  // A raw client connection to a region's receiver, D's unless said
  // (registration: magic4 version2 host_len2 host port2 ...).
  int RawConnect(Region* region = nullptr) {
    const auto& reg = (region != nullptr ? region : d_region_.get())->registration();
    const size_t host_len = reg[6] | (reg[7] << 8);
    const std::string host(reinterpret_cast<const char*>(reg.data()) + 8, host_len);
    const uint16_t port = static_cast<uint16_t>(reg[8 + host_len] | (reg[9 + host_len] << 8));
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addrs = nullptr;
    EXPECT_EQ(getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addrs), 0);
    if (addrs == nullptr) return -1;
    const int fd = socket(addrs->ai_family, SOCK_STREAM, 0);
    const int rc = connect(fd, addrs->ai_addr, addrs->ai_addrlen);
    freeaddrinfo(addrs);
    EXPECT_EQ(rc, 0) << std::strerror(errno);
    return fd;
  }

  // Reads until EOF (true) or `timeout` (false).
  static bool ClosedByPeer(int fd, int timeout_ms = 10'000) {
    uint8_t buf[256];
    while (true) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) != 1) return false;
      const ssize_t r = recv(fd, buf, sizeof buf, 0);
      if (r <= 0) return true;
    }
  }

  static std::vector<uint8_t> Header(uint32_t magic, uint16_t version, TransferId t, uint32_t n,
                                     uint64_t total) {
    std::vector<uint8_t> h(36);
    auto put = [&](size_t at, uint64_t v, int bytes) {
      for (int i = 0; i < bytes; ++i) h[at + i] = static_cast<uint8_t>(v >> (8 * i));
    };
    put(0, magic, 4);
    put(4, version, 2);
    put(6, 0, 2);
    put(8, t.hi, 8);
    put(16, t.lo, 8);
    put(24, n, 4);
    put(28, total, 8);
    return h;
  }

  bool DUntouched() { return AllZero(d_region_->bytes()); }

  const RegionLayout layout_ = SmallLayout();
  std::unique_ptr<Transport> p_, d_;
  std::unique_ptr<Region> p_region_, d_region_;
  std::unique_ptr<Target> target_;
};

TEST_F(TcpTest, UngrantedWriteIsRefusedCountedAndTheTargetStillWorks) {
  const auto segs = BlockSegments(layout_, 0, 2, 2);
  Status s = target_->Write(kT1, segs);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(d_->stats().writes_refused.load(), 1u);
  EXPECT_TRUE(DUntouched());
  // Granted to another transfer: refused.
  d_region_->grants().Grant(kT2, std::vector<uint32_t>{2, 3});
  EXPECT_EQ(target_->Write(kT1, segs).code(), StatusCode::kFailedPrecondition);
  // Only part of the range granted: refused, nothing written.
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{2});
  EXPECT_EQ(target_->Write(kT1, segs).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DUntouched());
  EXPECT_EQ(d_->stats().writes_refused.load(), 3u);
  // The zero transfer is never granted.
  EXPECT_EQ(target_->Write(TransferId{}, segs).code(), StatusCode::kFailedPrecondition);
  // Granted: the same Target (and pooled stream) works.
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{2, 3});
  ASSERT_TRUE(target_->Write(kT1, segs).ok());
  const auto want =
      Expected(p_region_->bytes(), std::vector<uint8_t>(layout_.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d_region_->bytes().begin()));
  EXPECT_EQ(p_->stats().writes_ok.load(), 1u);
  EXPECT_EQ(p_->stats().writes_failed.load(), 4u);
}

TEST_F(TcpTest, RevokedGrantIsRefused) {
  const auto segs = BlockSegments(layout_, 0, 5, 1);
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{5});
  ASSERT_TRUE(target_->Write(kT1, segs).ok());
  std::vector<uint8_t> after(d_region_->bytes().begin(), d_region_->bytes().end());
  FillPattern(p_region_->bytes(), 10);  // new content that must not land
  d_region_->grants().Revoke(kT1, std::vector<uint32_t>{5});
  EXPECT_EQ(target_->Write(kT1, segs).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::equal(after.begin(), after.end(), d_region_->bytes().begin()));
  EXPECT_EQ(d_->stats().writes_refused.load(), 1u);
}

TEST_F(TcpTest, ASegmentSpanningPlanesNeedsEveryBlockItTouches) {
  // From the last block of plane 0 into block 0 of plane 1.
  const uint64_t stride = layout_.block_stride_bytes;
  const std::vector<Segment> segs = {Segment{0, 7 * stride + 100, stride}};
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{7});
  EXPECT_EQ(target_->Write(kT1, segs).code(), StatusCode::kFailedPrecondition);
  d_region_->grants().Revoke(kT1, std::vector<uint32_t>{7});
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{0});
  EXPECT_EQ(target_->Write(kT1, segs).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DUntouched());
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{7});
  EXPECT_TRUE(target_->Write(kT1, segs).ok());
  // Three planes: blocks 7.. of plane 0, all of plane 1, ..0 of plane 2.
  const std::vector<Segment> wide = {Segment{0, 7 * stride, 10 * stride}};
  EXPECT_EQ(target_->Write(kT1, wide).code(), StatusCode::kFailedPrecondition);
  d_region_->grants().Grant(kT1, Range(0, 8));
  EXPECT_TRUE(target_->Write(kT1, wide).ok());
}

TEST_F(TcpTest, GarbageHeaderIsCountedAsMalformedAndTheReceiverKeepsServing) {
  const int fd = RawConnect();
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> garbage(64);
  Prng prng(77);
  for (uint8_t& b : garbage) b = static_cast<uint8_t>(prng.Next64());
  ASSERT_EQ(send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  EXPECT_TRUE(ClosedByPeer(fd));
  close(fd);
  EXPECT_TRUE(WaitFor([&] { return d_->stats().frames_malformed.load() == 1; }));

  // Over the limits, and a bad version: each closes its connection.
  const std::vector<std::vector<uint8_t>> bad = {
      Header(0x4654564B, 1, kT1, (1u << 16) + 1, 0),
      Header(0x4654564B, 1, kT1, 1, (1ull << 30) + 1),
      Header(0x4654564B, 2, kT1, 0, 0),
  };
  for (const auto& h : bad) {
    const int c = RawConnect();
    ASSERT_GE(c, 0);
    ASSERT_EQ(send(c, h.data(), h.size(), MSG_NOSIGNAL), static_cast<ssize_t>(h.size()));
    EXPECT_TRUE(ClosedByPeer(c));
    close(c);
  }
  EXPECT_TRUE(WaitFor([&] { return d_->stats().frames_malformed.load() == 4; }));

  // A table whose bytes do not add up to total_bytes: the payload is
  // consumed, the reply says malformed, and the connection stays usable.
  {
    const int c = RawConnect();
    std::vector<uint8_t> frame = Header(0x4654564B, 1, kT1, 1, 8);
    const uint8_t entry[16] = {0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0};  // 4 ≠ 8
    frame.insert(frame.end(), entry, entry + 16);
    frame.insert(frame.end(), 8, 0xAB);
    std::vector<uint8_t> empty_frame = Header(0x4654564B, 1, kT1, 0, 0);
    frame.insert(frame.end(), empty_frame.begin(), empty_frame.end());
    ASSERT_EQ(send(c, frame.data(), frame.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(frame.size()));
    uint8_t reply[16];
    size_t got = 0;
    while (got < sizeof reply) {
      pollfd p{c, POLLIN, 0};
      ASSERT_EQ(poll(&p, 1, 10'000), 1);
      const ssize_t r = recv(c, reply + got, sizeof reply - got, 0);
      ASSERT_GT(r, 0);
      got += static_cast<size_t>(r);
    }
    EXPECT_EQ(reply[4], 2);   // malformed
    EXPECT_EQ(reply[12], 0);  // the next (empty) frame: ok
    close(c);
  }
  EXPECT_EQ(d_->stats().frames_malformed.load(), 5u);
  EXPECT_TRUE(DUntouched());

  d_region_->grants().Grant(kT1, std::vector<uint32_t>{1});
  EXPECT_TRUE(target_->Write(kT1, BlockSegments(layout_, 1, 1, 1)).ok());
}

TEST_F(TcpTest, ConnectionsOverTheBoundAreRefusedAndSlotsAreFreed) {
  std::vector<int> raw;
  for (int i = 0; i < 64; ++i) {
    raw.push_back(RawConnect());
    ASSERT_GE(raw.back(), 0);
  }
  // The 65th connection (the target's first stream) is closed at once.
  const auto segs = BlockSegments(layout_, 0, 0, 1);
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{0});
  EXPECT_EQ(target_->Write(kT1, segs).code(), StatusCode::kUnavailable);
  for (int fd : raw) close(fd);
  // Their threads finish and free the slots; the target reconnects.
  EXPECT_TRUE(WaitFor([&] { return target_->Write(kT1, segs).ok(); }));
}

TEST_F(TcpTest, DestroyingTheRegionStopsReceiversMidFrame) {
  const int c = RawConnect();
  ASSERT_GE(c, 0);
  // Half a frame: the receiver thread blocks mid-frame.
  const auto h = Header(0x4654564B, 1, kT1, 1, 16);
  ASSERT_EQ(send(c, h.data(), h.size(), MSG_NOSIGNAL), static_cast<ssize_t>(h.size()));
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{0});
  ASSERT_TRUE(target_->Write(kT1, BlockSegments(layout_, 0, 0, 1)).ok());  // a pooled stream
  d_region_.reset();  // must not hang: joins every receiver thread
  EXPECT_TRUE(ClosedByPeer(c));
  close(c);
  // The target's pooled stream is dead now: a write fails, not hangs.
  EXPECT_EQ(target_->Write(kT1, BlockSegments(layout_, 0, 0, 1)).code(),
            StatusCode::kUnavailable);
}

// ---------------------------------------------------------------------------
// tcp striping and deadlines.

bool RecvN(int fd, uint8_t* out, size_t n);  // below

// P and D on tcp with 4 streams per target and stripes of at least 4 KiB, so
// that a write of a few blocks is striped; the regions are 8 planes × 16
// blocks × 16 KiB (2 MiB).
class TcpStripeTest : public testing::Test {
 protected:
  void SetUp() override {
    TransportOptions options;
    options.tcp_streams = 4;
    options.tcp_stripe_min_bytes = 4096;
    TcpPair pair;
    ASSERT_NO_FATAL_FAILURE(MakeTcpPair(options, layout_, 31, &pair));
    p_ = std::move(pair.p);
    d_ = std::move(pair.d);
    p_region_ = std::move(pair.p_region);
    d_region_ = std::move(pair.d_region);
  }

  std::unique_ptr<Target> Open(const std::vector<uint8_t>& registration) {
    auto t = p_->Open(registration, p_region_.get());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }

  const RegionLayout layout_{8, 16, 16 << 10};
  std::unique_ptr<Transport> p_, d_;
  std::unique_ptr<Region> p_region_, d_region_;
};

// A fake receiver on loopback for `layout_`-sized regions: accepts every
// connection and runs serve(fd, index) on its own thread for it. The
// destructor shuts every connection down and joins.
// A listening socket on 127.0.0.1, an ephemeral port (set in *port); -1 on
// failure (with a test failure recorded).
int ListenLoopback(int backlog, uint16_t* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(listen(fd, backlog), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  *port = ntohs(addr.sin_port);
  return fd;
}

class FakeReceiver {
 public:
  FakeReceiver(const RegionLayout& layout, std::function<void(int fd, int index)> serve)
      : serve_(std::move(serve)) {
    uint16_t port = 0;
    listener_ = ListenLoopback(16, &port);
    registration_ = tcp::EncodeRegistration({"127.0.0.1", port, layout.bytes(), layout});
    accept_ = std::thread([this] {
      for (int index = 0;; ++index) {
        const int fd = accept(listener_, nullptr, nullptr);
        if (fd < 0) return;  // shut down
        std::lock_guard<std::mutex> lock(mu_);
        fds_.push_back(fd);
        threads_.emplace_back([this, fd, index] { serve_(fd, index); });
      }
    });
  }
  ~FakeReceiver() {
    shutdown(listener_, SHUT_RDWR);
    accept_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    for (std::thread& t : threads_) t.join();
    for (int fd : fds_) close(fd);
    close(listener_);
  }
  const std::vector<uint8_t>& registration() const { return registration_; }
  int connections() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(fds_.size());
  }

 private:
  std::function<void(int, int)> serve_;
  int listener_ = -1;
  std::vector<uint8_t> registration_;
  std::thread accept_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

// A frame's header and table as a fake receiver reads them; false on EOF.
struct FakeFrame {
  uint32_t n = 0;
  uint64_t total = 0;
  std::vector<std::pair<uint64_t, uint64_t>> table;  // dst offset, bytes
};
bool RecvFrameHead(int fd, FakeFrame* f) {
  uint8_t header[tcp::kHeaderBytes];
  if (!RecvN(fd, header, sizeof header)) return false;
  f->n = static_cast<uint32_t>(GetLe(header + 24, 4));
  f->total = GetLe(header + 28, 8);
  std::vector<uint8_t> table(size_t{f->n} * tcp::kTableEntryBytes);
  if (!RecvN(fd, table.data(), table.size())) return false;
  f->table.clear();
  for (uint32_t i = 0; i < f->n; ++i) {
    f->table.emplace_back(GetLe(table.data() + 16 * i, 8), GetLe(table.data() + 16 * i + 8, 8));
  }
  return true;
}
bool SendOkReply(int fd) {
  uint8_t reply[tcp::kReplyBytes];
  PutLe(reply, tcp::kReplyMagic, 4);
  PutLe(reply + 4, tcp::kReplyOk, 4);
  return send(fd, reply, sizeof reply, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof reply);
}

TEST_F(TcpStripeTest, AStripedWriteLandsByteExactAndAgainAfterIt) {
  d_region_->grants().Grant(kT1, Range(0, layout_.num_blocks));
  auto target = Open(d_region_->registration());
  ASSERT_TRUE(target);
  // 10 blocks of every plane, shifted by 3: 1.25 MiB in 8 segments, cut
  // into 4 stripes across segment boundaries.
  const auto segs = BlockSegments(layout_, 0, 3, 10);
  for (int round = 0; round < 3; ++round) {
    const Status s = target->Write(kT1, segs, MonoNow() + Duration::Seconds(30));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  const auto want = Expected(p_region_->bytes(), std::vector<uint8_t>(layout_.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d_region_->bytes().begin()));
  EXPECT_EQ(p_->stats().writes_ok.load(), 3u);  // once per write, not per stripe
  EXPECT_EQ(p_->stats().writes_failed.load(), 0u);
  EXPECT_EQ(p_->stats().bytes_written.load(), 3 * 10 * 8 * (16u << 10));
  EXPECT_EQ(d_->stats().bytes_received.load(), 3 * 10 * 8 * (16u << 10));
}

TEST_F(TcpStripeTest, StripesGoOutInParallelOnTheirOwnStreams) {
  // Replies to no frame until four frames (on four connections) have
  // arrived whole: a write whose stripes went one after another could
  // never finish.
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t bytes = 0;
  FakeReceiver fake(layout_, [&](int fd, int) {
    FakeFrame f;
    while (RecvFrameHead(fd, &f)) {
      std::vector<uint8_t> payload(f.total);
      if (!RecvN(fd, payload.data(), payload.size())) return;
      std::unique_lock<std::mutex> lock(mu);
      ++arrived;
      bytes += f.total;
      cv.notify_all();
      if (!cv.wait_for(lock, 10s, [&] { return arrived >= 4; })) return;
      lock.unlock();
      if (!SendOkReply(fd)) return;
    }
  });
  auto target = Open(fake.registration());
  ASSERT_TRUE(target);
  const auto segs = BlockSegments(layout_, 0, 3, 10);
  const Status s = target->Write(kT1, segs, MonoNow() + Duration::Seconds(30));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(fake.connections(), 4);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(arrived, 4);
  EXPECT_EQ(bytes, 10 * 8 * (16u << 10));
}

TEST_F(TcpStripeTest, AStripeFailingMidWayFailsTheWriteOnce) {
  // Connection 2 takes its stripe's header and half its payload, then
  // closes; the others are answered ok.
  FakeReceiver fake(layout_, [&](int fd, int index) {
    FakeFrame f;
    while (RecvFrameHead(fd, &f)) {
      const uint64_t take = index == 2 ? f.total / 2 : f.total;
      std::vector<uint8_t> payload(take);
      if (!RecvN(fd, payload.data(), payload.size())) return;
      if (index == 2) {
        shutdown(fd, SHUT_RDWR);
        return;
      }
      if (!SendOkReply(fd)) return;
    }
  });
  auto target = Open(fake.registration());
  ASSERT_TRUE(target);
  const Status s =
      target->Write(kT1, BlockSegments(layout_, 0, 3, 10), MonoNow() + Duration::Seconds(30));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(p_->stats().writes_failed.load(), 1u);
  EXPECT_EQ(p_->stats().writes_ok.load(), 0u);
  EXPECT_EQ(p_->stats().bytes_written.load(), 0u);
}

TEST_F(TcpStripeTest, GrantsAreCheckedPerStripe) {
  // Plane 1's blocks 0..15 into plane 0's: 256 KiB in 4 stripes of 4
  // blocks. Every block granted but 12, which only the last stripe touches:
  // that stripe is refused, the others land, the write fails, and the
  // streams stay usable.
  const uint64_t block = layout_.block_stride_bytes;
  const uint64_t plane = layout_.num_blocks * block;
  const std::vector<Segment> segs{{plane, 0, plane}};
  std::vector<uint32_t> blocks = Range(0, layout_.num_blocks);
  blocks.erase(std::find(blocks.begin(), blocks.end(), 12u));
  d_region_->grants().Grant(kT1, blocks);
  auto target = Open(d_region_->registration());
  ASSERT_TRUE(target);
  const Status s = target->Write(kT1, segs, MonoNow() + Duration::Seconds(30));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(d_->stats().writes_refused.load(), 1u);  // one stripe's frame, not four
  EXPECT_EQ(d_->stats().bytes_received.load(), 12 * block);
  EXPECT_EQ(p_->stats().writes_failed.load(), 1u);
  EXPECT_EQ(p_->stats().writes_ok.load(), 0u);
  const auto d = d_region_->bytes();
  const auto p = p_region_->bytes();
  EXPECT_TRUE(std::equal(d.begin(), d.begin() + 12 * block, p.begin() + plane));
  EXPECT_TRUE(AllZero(d.subspan(12 * block)));
  // Granted now: the same write succeeds on the same streams.
  d_region_->grants().Grant(kT1, std::vector<uint32_t>{12});
  EXPECT_TRUE(target->Write(kT1, segs, MonoNow() + Duration::Seconds(30)).ok());
  EXPECT_TRUE(std::equal(d.begin(), d.begin() + plane, p.begin() + plane));
}

TEST_F(TcpStripeTest, AStalledPeerEndsAtTheDeadlineNotTheStallTimeout) {
  // Accepts and reads nothing, so the senders fill the socket buffers and
  // wait; a second fake reads everything and never replies.
  FakeReceiver silent(layout_, [](int fd, int) {
    pollfd p{fd, POLLRDHUP, 0};
    (void)poll(&p, 1, 20'000);
  });
  FakeReceiver mute(layout_, [](int fd, int) {
    FakeFrame f;
    while (RecvFrameHead(fd, &f)) {
      std::vector<uint8_t> payload(f.total);
      if (!RecvN(fd, payload.data(), payload.size())) return;
    }
  });
  // 8 planes × 16 blocks × 16 KiB = the whole 2 MiB region: with 4 MiB send
  // buffers it may fit, so write it 16 times over in one call (32 MiB).
  std::vector<Segment> big;
  for (int i = 0; i < 16; ++i) big.push_back(Segment{0, 0, layout_.bytes()});
  for (FakeReceiver* fake : {&silent, &mute}) {
    auto target = Open(fake->registration());
    ASSERT_TRUE(target);
    for (const auto& segs : {big, BlockSegments(layout_, 0, 0, 1)}) {
      const auto start = std::chrono::steady_clock::now();
      const Status s = target->Write(kT1, segs, MonoNow() + Duration::Milliseconds(300));
      const auto took = std::chrono::steady_clock::now() - start;
      EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
      EXPECT_GE(took, 250ms);
      EXPECT_LT(took, 10s);  // the stall timeout is 30 s
    }
  }
  EXPECT_EQ(p_->stats().writes_failed.load(), 4u);
}

// Striped reads (read mode): the same cut as a write, each stripe's read
// requests on its own stream.

TEST_F(TcpStripeTest, AStripedReadLandsByteExactAndCountsOnce) {
  p_region_->read_grants().Grant(kT1, Range(0, layout_.num_blocks));
  auto source = d_->OpenSource(p_region_->registration(), d_region_.get());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  // P's blocks 0..9 of every plane into D's 3..12: 1.25 MiB in 8 segments,
  // cut into 4 stripes across segment boundaries.
  const auto segs = BlockSegments(layout_, 0, 3, 10);
  for (int round = 0; round < 3; ++round) {
    const Status s = source.value()->Read(kT1, segs);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  const auto want = Expected(p_region_->bytes(), std::vector<uint8_t>(layout_.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d_region_->bytes().begin()));
  EXPECT_EQ(d_->stats().reads_ok.load(), 3u);  // once per read, not per stripe
  EXPECT_EQ(d_->stats().reads_failed.load(), 0u);
  EXPECT_EQ(d_->stats().bytes_read.load(), 3 * 10 * 8 * (16u << 10));
  EXPECT_EQ(p_->stats().bytes_served.load(), 3 * 10 * 8 * (16u << 10));
}

TEST_F(TcpStripeTest, ReadStripesGoOutInParallelOnTheirOwnStreams) {
  // A fake P that answers no read request until four (on four
  // connections) have arrived: a read whose stripes went one after
  // another could never finish. Each answer is the requested bytes of a
  // pattern: byte i of P's region is i mod 251.
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  FakeReceiver fake(layout_, [&](int fd, int) {
    FakeFrame f;
    while (RecvFrameHead(fd, &f)) {
      std::unique_lock<std::mutex> lock(mu);
      ++arrived;
      cv.notify_all();
      if (!cv.wait_for(lock, 10s, [&] { return arrived >= 4; })) return;
      lock.unlock();
      std::vector<uint8_t> answer(8);
      PutLe(answer.data(), tcp::kReadHeadMagic, 4);
      PutLe(answer.data() + 4, tcp::kReplyOk, 4);
      for (const auto& [src, bytes] : f.table) {
        for (uint64_t i = 0; i < bytes; ++i) {
          answer.push_back(static_cast<uint8_t>((src + i) % 251));
        }
      }
      answer.resize(answer.size() + 8);
      PutLe(answer.data() + answer.size() - 8, tcp::kReplyMagic, 4);
      PutLe(answer.data() + answer.size() - 4, tcp::kReplyOk, 4);
      if (send(fd, answer.data(), answer.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(answer.size())) {
        return;
      }
    }
  });
  auto source = d_->OpenSource(fake.registration(), d_region_.get());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const auto segs = BlockSegments(layout_, 0, 3, 10);
  const Status s = source.value()->Read(kT1, segs);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(fake.connections(), 4);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(arrived, 4);
  }
  const auto d = d_region_->bytes();
  for (const Segment& seg : segs) {
    for (uint64_t i = 0; i < seg.bytes; i += 4093) {
      ASSERT_EQ(d[seg.dst_offset + i], (seg.src_offset + i) % 251) << "offset " << i;
    }
  }
}

TEST_F(TcpStripeTest, AReadStripeRefusedFailsTheReadOnce) {
  // P's plane 1 into D's plane 0: 256 KiB in 4 stripes of 4 blocks. Every
  // block granted for read but 12, which only the last stripe touches: that
  // stripe is refused, the read fails once, and the streams stay usable.
  const uint64_t plane = layout_.num_blocks * layout_.block_stride_bytes;
  const std::vector<Segment> segs{{plane, 0, plane}};
  std::vector<uint32_t> blocks = Range(0, layout_.num_blocks);
  blocks.erase(std::find(blocks.begin(), blocks.end(), 12u));
  p_region_->read_grants().Grant(kT1, blocks);
  auto source = d_->OpenSource(p_region_->registration(), d_region_.get());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const Status s = source.value()->Read(kT1, segs);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(p_->stats().reads_refused.load(), 1u);  // one stripe's request, not four
  EXPECT_EQ(d_->stats().reads_failed.load(), 1u);
  EXPECT_EQ(d_->stats().reads_ok.load(), 0u);
  EXPECT_EQ(d_->stats().bytes_read.load(), 0u);
  // Granted now: the same read succeeds on the same streams.
  p_region_->read_grants().Grant(kT1, std::vector<uint32_t>{12});
  ASSERT_TRUE(source.value()->Read(kT1, segs).ok());
  const auto d = d_region_->bytes();
  const auto p = p_region_->bytes();
  EXPECT_TRUE(std::equal(d.begin(), d.begin() + plane, p.begin() + plane));
}

// Read mode on tcp: D reads P's region, P's receiver checks read grants.

TEST_F(TcpTest, UngrantedReadIsRefusedCountedAndTheSourceStillWorks) {
  auto source = d_->OpenSource(p_region_->registration(), d_region_.get());
  ASSERT_TRUE(source.ok());
  const auto segs = BlockSegments(layout_, 2, 0, 2);
  EXPECT_EQ(source.value()->Read(kT1, segs).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p_->stats().reads_refused.load(), 1u);
  // Write grants do not grant reads.
  p_region_->grants().Grant(kT1, std::vector<uint32_t>{2, 3});
  EXPECT_EQ(source.value()->Read(kT1, segs).code(), StatusCode::kFailedPrecondition);
  // Granted for read to another transfer, or only partly: refused.
  p_region_->read_grants().Grant(kT2, std::vector<uint32_t>{2, 3});
  EXPECT_EQ(source.value()->Read(kT1, segs).code(), StatusCode::kFailedPrecondition);
  p_region_->read_grants().Grant(kT1, std::vector<uint32_t>{2});
  EXPECT_EQ(source.value()->Read(kT1, segs).code(), StatusCode::kFailedPrecondition);
  // The zero transfer is never granted.
  EXPECT_EQ(source.value()->Read(TransferId{}, segs).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DUntouched());
  EXPECT_EQ(p_->stats().reads_refused.load(), 5u);
  EXPECT_EQ(p_->stats().bytes_served.load(), 0u);
  // Granted: the same Source (and pooled stream) works, and kT2 may read
  // the same blocks at the same time (shared prefix blocks).
  p_region_->read_grants().Grant(kT1, std::vector<uint32_t>{3});
  ASSERT_TRUE(source.value()->Read(kT1, segs).ok());
  ASSERT_TRUE(source.value()->Read(kT2, segs).ok());
  const auto want =
      Expected(p_region_->bytes(), std::vector<uint8_t>(layout_.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d_region_->bytes().begin()));
  EXPECT_EQ(d_->stats().reads_ok.load(), 2u);
  EXPECT_EQ(d_->stats().reads_failed.load(), 5u);
  // Revoked: refused again, D's bytes as they were.
  p_region_->read_grants().RevokeAll(kT1);
  FillPattern(p_region_->bytes(), 10);
  EXPECT_EQ(source.value()->Read(kT1, segs).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d_region_->bytes().begin()));
  EXPECT_EQ(p_->stats().reads_refused.load(), 6u);
}

// A raw reader: sends a read request of `segs` (src offsets in P's region)
// on `fd`; returns false if the send failed.
bool SendReadRequest(int fd, TransferId t, const std::vector<Segment>& segs, uint64_t total) {
  std::vector<uint8_t> table;
  return tcp::SendFrameHead(fd, tcp::kReadMagic, t, segs, total, table);
}

// Receives n bytes (bounded wait); false on EOF or timeout.
bool RecvN(int fd, uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10'000) != 1) return false;
    const ssize_t r = recv(fd, out + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

TEST_F(TcpTest, AReadGrantRevokedWhileTheBytesGoOutIsRefusedInTheTrailer) {
  // A region bigger than the socket buffers: P's receiver blocks sending
  // until this reader drains, so the revoke lands mid-payload.
  const RegionLayout big{1, 8, 4 << 20};
  auto p = p_->CreateRegion("big", big);
  ASSERT_TRUE(p.ok());
  FillPattern(p.value()->bytes(), 17);
  p.value()->read_grants().Grant(kT1, Range(0, 8));
  const int c = RawConnect(p.value().get());
  ASSERT_GE(c, 0);
  const std::vector<Segment> all = {Segment{0, 0, big.bytes()}};
  ASSERT_TRUE(SendReadRequest(c, kT1, all, big.bytes()));
  uint8_t head[8];
  ASSERT_TRUE(RecvN(c, head, sizeof head));
  EXPECT_EQ(GetLe(head, 4), tcp::kReadHeadMagic);
  EXPECT_EQ(GetLe(head + 4, 4), uint64_t{tcp::kReplyOk});  // granted when it started
  p.value()->read_grants().Revoke(kT1, std::vector<uint32_t>{5});
  std::vector<uint8_t> payload(big.bytes());
  ASSERT_TRUE(RecvN(c, payload.data(), payload.size()));
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), p.value()->bytes().begin()));
  uint8_t trailer[8];
  ASSERT_TRUE(RecvN(c, trailer, sizeof trailer));
  EXPECT_EQ(GetLe(trailer, 4), tcp::kReplyMagic);
  EXPECT_EQ(GetLe(trailer + 4, 4), uint64_t{tcp::kReplyRefused});
  EXPECT_EQ(p_->stats().reads_refused.load(), 1u);
  // A read request whose table does not add up: malformed head, nothing
  // else, and the stream stays in step for an empty request after it.
  const std::vector<Segment> one = {Segment{0, 0, 8}};
  ASSERT_TRUE(SendReadRequest(c, kT1, one, 9));
  ASSERT_TRUE(SendReadRequest(c, kT1, {}, 0));
  uint8_t replies[24];
  ASSERT_TRUE(RecvN(c, replies, sizeof replies));
  EXPECT_EQ(GetLe(replies + 4, 4), uint64_t{tcp::kReplyMalformed});
  EXPECT_EQ(GetLe(replies + 8, 4), tcp::kReadHeadMagic);
  EXPECT_EQ(GetLe(replies + 12, 4), uint64_t{tcp::kReplyOk});
  EXPECT_EQ(GetLe(replies + 16, 4), tcp::kReplyMagic);  // the empty payload's trailer
  EXPECT_EQ(GetLe(replies + 20, 4), uint64_t{tcp::kReplyOk});
  EXPECT_EQ(p_->stats().frames_malformed.load(), 1u);

  // A reader that stops reading mid-payload does not hold up the region's
  // destruction.
  p.value()->read_grants().Grant(kT1, Range(0, 8));
  ASSERT_TRUE(SendReadRequest(c, kT1, all, big.bytes()));
  ASSERT_TRUE(RecvN(c, head, sizeof head));
  const auto start = std::chrono::steady_clock::now();
  p.value().reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_TRUE(ClosedByPeer(c));
  close(c);
}

TEST_F(TcpTest, AReadFailsCleanlyWhenThePeerDisconnectsMidPayload) {
  // A fake P: accepts, answers "ok" and half the payload, then closes.
  uint16_t port = 0;
  const int listener = ListenLoopback(4, &port);
  ASSERT_GE(listener, 0);
  const std::vector<uint8_t> reg =
      tcp::EncodeRegistration({"127.0.0.1", port, layout_.bytes(), layout_});
  std::thread fake([&] {
    const int c = accept(listener, nullptr, nullptr);
    if (c < 0) return;
    std::vector<uint8_t> request(36 + 16);
    if (RecvN(c, request.data(), request.size())) {
      std::vector<uint8_t> answer(8 + 512, 0x5A);
      PutLe(answer.data(), tcp::kReadHeadMagic, 4);
      PutLe(answer.data() + 4, tcp::kReplyOk, 4);
      (void)!send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
    }
    close(c);
  });
  auto source = d_->OpenSource(reg, d_region_.get());
  ASSERT_TRUE(source.ok());
  const auto start = std::chrono::steady_clock::now();
  const Status status = source.value()->Read(kT1, std::vector<Segment>{{0, 0, 1024}});
  fake.join();
  close(listener);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(d_->stats().reads_failed.load(), 1u);
  // Nobody listens there now: the next Read fails too, at once.
  EXPECT_EQ(source.value()->Read(kT1, std::vector<Segment>{{0, 0, 1024}}).code(),
            StatusCode::kUnavailable);
}

// shm read mode: a reader learns the owner died from the owner's liveness
// lock (the kernel drops it), even though the segment stays linked.
TEST(ShmReadTest, AReadFromARegionWhoseProcessDiedFails) {
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  const RegionLayout layout = SmallLayout();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The owner: a region filled with FillPattern(18), its registration
    // up the pipe, then death without any destructor at the parent's word.
    auto t = MakeShmTransport({});
    if (!t.ok()) _exit(1);
    auto r = t.value()->CreateRegion(UniqueName("crash"), layout);
    if (!r.ok()) _exit(2);
    FillPattern(r.value()->bytes(), 18);
    const auto& reg = r.value()->registration();
    const uint32_t len = static_cast<uint32_t>(reg.size());
    if (write(up[1], &len, 4) != 4 || write(up[1], reg.data(), len) != len) _exit(3);
    pollfd pfd{down[0], POLLIN, 0};
    poll(&pfd, 1, 30'000);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  uint32_t len = 0;
  std::vector<uint8_t> reg;
  pollfd pfd{up[0], POLLIN, 0};
  if (poll(&pfd, 1, 30'000) == 1 && read(up[0], &len, 4) == 4 && len < 4096) {
    reg.resize(len);
    size_t got = 0;
    while (got < len) {
      const ssize_t r = read(up[0], reg.data() + got, len - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    if (got < len) reg.clear();
  }
  auto t = MakeShmTransport({});
  ASSERT_TRUE(t.ok());
  auto d = t.value()->CreateRegion(UniqueName("reader"), layout);
  ASSERT_TRUE(d.ok());
  std::unique_ptr<Source> source;
  if (!reg.empty()) {
    auto opened = t.value()->OpenSource(reg, d.value().get());
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (opened.ok()) source = std::move(opened).value();
  }
  const auto segs = BlockSegments(layout, 3, 1, 2);
  const Status before = source ? source->Read(kT1, segs) : InternalError("no source");
  (void)!write(down[1], "x", 1);  // the owner may die now
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  close(up[0]);
  close(down[1]);
  ASSERT_FALSE(reg.empty()) << "no registration from the owner";
  // The owner did not unlink its segment: this test does (name at byte 8).
  const size_t name_len = reg[6] | (reg[7] << 8);
  const std::string name(reinterpret_cast<const char*>(reg.data()) + 8, name_len);
  ASSERT_TRUE(source != nullptr);
  EXPECT_TRUE(before.ok()) << before.ToString();
  std::vector<uint8_t> owner(layout.bytes());
  FillPattern(owner, 18);
  const auto want = Expected(owner, std::vector<uint8_t>(layout.bytes(), 0), segs);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), d.value()->bytes().begin()));
  EXPECT_EQ(source->Read(kT1, segs).code(), StatusCode::kUnavailable);
  EXPECT_EQ(t.value()->OpenSource(reg, d.value().get()).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(shm_unlink(name.c_str()), 0) << name;
}

// Only shm's write is a bare copy between two mappings; a rank runs such a
// small write on its own thread (RankActor, inline_write_bytes). tcp and ucx
// wait on a peer and must stay on the writer pool.
TEST_P(TransportTest, OnlyShmCopiesInPlace) {
  const RegionLayout layout = SmallLayout();
  auto p = NewRegion(*p_, layout);
  auto d = NewRegion(*d_, layout);
  ASSERT_TRUE(p && d);
  auto target = OpenTarget(*d, *p);
  ASSERT_TRUE(target);
  EXPECT_EQ(target->CopiesInPlace(), GetParam() == TransportKind::kShm);
}

TEST(TransportNamesTest, ParseAndNameRoundTrip) {
  for (TransportKind k : {TransportKind::kShm, TransportKind::kTcp, TransportKind::kUcx}) {
    TransportKind parsed = TransportKind::kShm;
    ASSERT_TRUE(ParseTransport(TransportName(k), &parsed));
    EXPECT_EQ(parsed, k);
  }
  TransportKind out = TransportKind::kUcx;
  EXPECT_FALSE(ParseTransport("rdma", &out));
  EXPECT_FALSE(ParseTransport("", &out));
  EXPECT_FALSE(ParseTransport("TCP", &out));
  EXPECT_EQ(out, TransportKind::kUcx);
}

TEST(TransportMiscTest, RegistrationsOfAnotherKindAreRejected) {
  auto shm = MakeShmTransport({});
  auto tcp = MakeTcpTransport({});
  ASSERT_TRUE(shm.ok() && tcp.ok());
  auto a = shm.value()->CreateRegion(UniqueName("x"), SmallLayout());
  auto b = tcp.value()->CreateRegion("x", SmallLayout());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(shm.value()->Open(b.value()->registration(), a.value().get()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp.value()->Open(a.value()->registration(), b.value().get()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TransportMiscTest, BadLayoutsAndDuplicateShmNamesAreErrors) {
  auto shm = MakeShmTransport({});
  auto tcp = MakeTcpTransport({});
  ASSERT_TRUE(shm.ok() && tcp.ok());
  for (auto* t : {shm.value().get(), tcp.value().get()}) {
    EXPECT_EQ(t->CreateRegion("e", RegionLayout{0, 8, 256}).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(t->CreateRegion("e", RegionLayout{1ull << 40, 1u << 30, 1ull << 20})
                  .status()
                  .code(),
              StatusCode::kInvalidArgument);
  }
  const std::string name = UniqueName("dup/with odd chars");
  auto first = shm.value()->CreateRegion(name, SmallLayout());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(shm.value()->CreateRegion(name, SmallLayout()).status().code(),
            StatusCode::kAlreadyExists);
  // Once the region is gone its name is free again.
  first.value().reset();
  EXPECT_TRUE(shm.value()->CreateRegion(name, SmallLayout()).ok());
  // A bad listen host is an error, not a crash.
  TransportOptions bad;
  bad.listen_host = "no such host!";
  auto t = MakeTcpTransport(bad);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t.value()->CreateRegion("h", SmallLayout()).ok());
}

TEST(TransportMiscTest, ShmTargetOutlivesItsRegionAndTransport) {
  // Stats are shared: a Target may outlive the Transport that opened it,
  // and the writer's mapping keeps the (unlinked) segment alive.
  auto p_t = MakeShmTransport({});
  auto d_t = MakeShmTransport({});
  ASSERT_TRUE(p_t.ok() && d_t.ok());
  auto p = p_t.value()->CreateRegion(UniqueName("p"), SmallLayout());
  auto d = d_t.value()->CreateRegion(UniqueName("d"), SmallLayout());
  ASSERT_TRUE(p.ok() && d.ok());
  auto target = p_t.value()->Open(d.value()->registration(), p.value().get());
  ASSERT_TRUE(target.ok());
  const auto reg = d.value()->registration();
  d.value().reset();
  // The segment's name is gone: a new Open fails, the open Target still writes.
  EXPECT_EQ(p_t.value()->Open(reg, p.value().get()).status().code(), StatusCode::kUnavailable);
  p_t.value().reset();
  EXPECT_TRUE(target.value()->Write(kT1, BlockSegments(SmallLayout(), 0, 0, 1)).ok());
}

}  // namespace
}  // namespace kvrelay::net
