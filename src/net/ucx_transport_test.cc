// ucx_transport_test.cc — MakeUcxTransport: bytes land, concurrent writers,
// bounds, malformed registrations, a second process (fork + exec of this
// binary), the tcp-only path, teardown in any order; read mode (gets): the
// liveness word, a second process read and then gone. The read tests every
// transport shares are in transport_test.cc.

#include "net/ucx_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/prng.h"

extern char** environ;

namespace kvrelay::net {
namespace {

using Clock = std::chrono::steady_clock;

const RegionLayout kLayout{.planes = 4, .num_blocks = 16, .block_stride_bytes = 4096};

uint8_t Pattern(uint64_t i, uint8_t salt) {
  return static_cast<uint8_t>((i * 131 + (i >> 8) * 7 + salt) & 0xff);
}

void Fill(Region& r, uint8_t salt) {
  std::span<uint8_t> b = r.bytes();
  for (size_t i = 0; i < b.size(); ++i) b[i] = Pattern(i, salt);
}

// True if dst[dst_offset, +bytes) == pattern(salt) at src_offset.
::testing::AssertionResult Landed(Region& dst, const Segment& s, uint8_t salt) {
  std::span<uint8_t> b = dst.bytes();
  for (uint64_t i = 0; i < s.bytes; ++i) {
    if (b[s.dst_offset + i] != Pattern(s.src_offset + i, salt)) {
      return ::testing::AssertionFailure()
             << "byte " << i << " of segment src " << s.src_offset << " dst " << s.dst_offset
             << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

// Landed() for bytes another process's write delivered. Our progress thread
// wrote them; this thread learned they are there from the other process
// (over a pipe). That ordering runs through the kernel, which TSan cannot
// see, so under TSan (KVRELAY_TSAN) this one function is suppressed below.
[[gnu::noinline]] ::testing::AssertionResult LandedFromOtherProcess(Region& dst,
                                                                   const Segment& s,
                                                                   uint8_t salt) {
  return Landed(dst, s, salt);
}

TransferId Tid(uint64_t n) { return TransferId{1, n}; }

std::unique_ptr<Transport> MakeOrDie(const TransportOptions& options = {}) {
  auto t = MakeUcxTransport(options);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// A decode rejection must be kInvalidArgument.
void ExpectRejected(Transport& t, Region* local, std::span<const uint8_t> reg,
                    const std::string& what) {
  auto r = t.Open(reg, local);
  ASSERT_FALSE(r.ok()) << what;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what << ": "
                                                              << r.status().ToString();
}

// Decoded view of a registration, following the format in ucx_transport.h,
// so tests can forge correctly checksummed but invalid ones.
struct Fields {
  uint32_t magic = 0, version = 0;
  uint64_t address = 0, total = 0, planes = 0;
  uint32_t num_blocks = 0;
  uint64_t stride = 0;
  std::vector<uint8_t> worker, rkey;
};

uint64_t Fnv(const std::vector<uint8_t>& b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t c : b) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void PutLe(std::vector<uint8_t>& o, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) o.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint64_t GetLe(const std::vector<uint8_t>& b, size_t* pos, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(b.at(*pos + i)) << (8 * i);
  *pos += n;
  return v;
}

Fields Parse(const std::vector<uint8_t>& b) {
  Fields f;
  size_t p = 0;
  f.magic = static_cast<uint32_t>(GetLe(b, &p, 4));
  f.version = static_cast<uint32_t>(GetLe(b, &p, 4));
  f.address = GetLe(b, &p, 8);
  f.total = GetLe(b, &p, 8);
  f.planes = GetLe(b, &p, 8);
  f.num_blocks = static_cast<uint32_t>(GetLe(b, &p, 4));
  f.stride = GetLe(b, &p, 8);
  size_t n = GetLe(b, &p, 4);
  f.worker.assign(b.begin() + p, b.begin() + p + n);
  p += n;
  n = GetLe(b, &p, 4);
  f.rkey.assign(b.begin() + p, b.begin() + p + n);
  return f;
}

// `worker_len`/`rkey_len` override the length prefixes when set.
std::vector<uint8_t> Forge(const Fields& f, int64_t worker_len = -1, int64_t rkey_len = -1) {
  std::vector<uint8_t> o;
  PutLe(o, f.magic, 4);
  PutLe(o, f.version, 4);
  PutLe(o, f.address, 8);
  PutLe(o, f.total, 8);
  PutLe(o, f.planes, 8);
  PutLe(o, f.num_blocks, 4);
  PutLe(o, f.stride, 8);
  PutLe(o, worker_len >= 0 ? uint64_t(worker_len) : f.worker.size(), 4);
  o.insert(o.end(), f.worker.begin(), f.worker.end());
  PutLe(o, rkey_len >= 0 ? uint64_t(rkey_len) : f.rkey.size(), 4);
  o.insert(o.end(), f.rkey.begin(), f.rkey.end());
  PutLe(o, Fnv(o), 8);
  return o;
}

// ---------------------------------------------------------------------------

// Two transports (as P and D would have), D's region opened from P's.
struct Pair {
  std::unique_ptr<Transport> p, d;
  std::unique_ptr<Region> p_region, d_region;
  std::unique_ptr<Target> target;  // P -> D
};

// Empty `p` on failure (after recording it); kUnavailable from UCX makes
// *unavailable true instead (caller skips).
Pair MakePair(const TransportOptions& options, std::string* unavailable = nullptr) {
  Pair out;
  auto p = MakeUcxTransport(options);
  auto d = MakeUcxTransport(options);
  if (unavailable != nullptr && (!p.ok() || !d.ok())) {
    const Status& s = p.ok() ? d.status() : p.status();
    if (s.code() == StatusCode::kUnavailable) {
      *unavailable = s.ToString();
      return out;
    }
  }
  if (!p.ok() || !d.ok()) {
    ADD_FAILURE() << p.status().ToString() << " / " << d.status().ToString();
    return out;
  }
  auto pr = p.value()->CreateRegion("p", kLayout);
  auto dr = d.value()->CreateRegion("d", kLayout);
  if (!pr.ok() || !dr.ok()) {
    ADD_FAILURE() << pr.status().ToString() << " / " << dr.status().ToString();
    return out;
  }
  auto t = p.value()->Open(dr.value()->registration(), pr.value().get());
  if (!t.ok()) {
    if (unavailable != nullptr && t.status().code() == StatusCode::kUnavailable) {
      *unavailable = t.status().ToString();
    } else {
      ADD_FAILURE() << t.status().ToString();
    }
    return out;
  }
  out.p = std::move(p).value();
  out.d = std::move(d).value();
  out.p_region = std::move(pr).value();
  out.d_region = std::move(dr).value();
  out.target = std::move(t).value();
  return out;
}

TEST(UcxTransport, KindAndZeroedRegion) {
  auto t = MakeOrDie();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind(), TransportKind::kUcx);
  auto r = t->CreateRegion("r", kLayout);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r.value()->bytes().size(), kLayout.bytes());
  EXPECT_EQ(r.value()->layout().num_blocks, kLayout.num_blocks);
  for (uint8_t b : r.value()->bytes()) ASSERT_EQ(b, 0);
  const auto& reg = r.value()->registration();
  ASSERT_GE(reg.size(), 8u);
  Fields f = Parse(reg);
  EXPECT_EQ(f.magic, kUcxRegistrationMagic);
  EXPECT_EQ(f.version, kUcxRegistrationVersion);
  EXPECT_EQ(f.address, reinterpret_cast<uintptr_t>(r.value()->bytes().data()));
  EXPECT_EQ(f.total, kLayout.bytes());
  EXPECT_EQ(f.planes, kLayout.planes);
  EXPECT_EQ(f.num_blocks, kLayout.num_blocks);
  EXPECT_EQ(f.stride, kLayout.block_stride_bytes);
  // The documented format round-trips exactly.
  EXPECT_EQ(Forge(f), reg);
}

TEST(UcxTransport, BadLayoutRejected) {
  auto t = MakeOrDie();
  ASSERT_NE(t, nullptr);
  for (RegionLayout l : {RegionLayout{0, 16, 4096}, RegionLayout{4, 0, 4096},
                         RegionLayout{4, 16, 0}, RegionLayout{1ull << 40, 1u << 20, 1ull << 20}}) {
    auto r = t->CreateRegion("bad", l);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  }
}

TEST(UcxTransport, WriteLandsAcrossTransports) {
  Pair x = MakePair({});
  ASSERT_NE(x.p, nullptr);
  Fill(*x.p_region, 1);
  std::printf("endpoint: %s\n", DescribeUcxTarget(*x.target).c_str());
  std::vector<Segment> segs = {
      {.src_offset = 0, .dst_offset = 4096 * 3, .bytes = 4096},
      {.src_offset = 4096 * 10, .dst_offset = 0, .bytes = 4096 * 2},
      {.src_offset = 7, .dst_offset = 4096 * 20 + 13, .bytes = 1000},  // unaligned
      {.src_offset = 0, .dst_offset = 4096 * 63, .bytes = 4096},       // last block
      {.src_offset = 5, .dst_offset = 5, .bytes = 0},                  // empty
  };
  Status s = x.target->Write(Tid(1), segs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  uint64_t total = 0;
  for (const Segment& seg : segs) {
    EXPECT_TRUE(Landed(*x.d_region, seg, 1));
    total += seg.bytes;
  }
  // Nothing else was touched.
  std::span<uint8_t> d = x.d_region->bytes();
  for (uint64_t i = 4096 * 4; i < 4096 * 20; ++i) ASSERT_EQ(d[i], 0) << i;
  EXPECT_EQ(x.p->stats().writes_ok.load(), 1u);
  EXPECT_EQ(x.p->stats().bytes_written.load(), total);
  EXPECT_EQ(x.p->stats().writes_failed.load(), 0u);
}

TEST(UcxTransport, WriteWithinOneTransport) {
  auto t = MakeOrDie();
  ASSERT_NE(t, nullptr);
  auto a = t->CreateRegion("a", kLayout);
  auto b = t->CreateRegion("b", kLayout);
  ASSERT_TRUE(a.ok() && b.ok());
  Fill(*a.value(), 9);
  auto target = t->Open(b.value()->registration(), a.value().get());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  Segment seg{.src_offset = 4096, .dst_offset = 8192, .bytes = 3 * 4096};
  Status s = target.value()->Write(Tid(2), {&seg, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Landed(*b.value(), seg, 9));
}

TEST(UcxTransport, LargeWrite) {
  Pair x = MakePair({});
  ASSERT_NE(x.p, nullptr);
  Fill(*x.p_region, 3);
  Segment seg{.src_offset = 0, .dst_offset = 0, .bytes = kLayout.bytes()};
  Status s = x.target->Write(Tid(3), {&seg, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Landed(*x.d_region, seg, 3));
}

TEST(UcxTransport, ConcurrentWritersDisjointRanges) {
  Pair x = MakePair({});
  ASSERT_NE(x.p, nullptr);
  Fill(*x.p_region, 5);
  // A second Target to the same region, so both shared and separate
  // endpoints are exercised.
  auto second = x.p->Open(x.d_region->registration(), x.p_region.get());
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  constexpr int kThreads = 8;
  constexpr int kWritesPerThread = 40;
  const uint64_t slice = kLayout.bytes() / kThreads;  // 32 KiB each
  std::vector<std::thread> threads;
  std::vector<Status> failures(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Target* target = (t % 2 == 0) ? x.target.get() : second.value().get();
      Prng rng(1000 + t);
      for (int i = 0; i < kWritesPerThread; ++i) {
        // A few segments inside this thread's slice; source = same offsets.
        std::vector<Segment> segs;
        for (int k = 0; k < 3; ++k) {
          uint64_t off = t * slice + rng.Uniform(slice - 1);
          uint64_t len = 1 + rng.Uniform(t * slice + slice - off);
          segs.push_back({.src_offset = off, .dst_offset = off, .bytes = len});
        }
        Status s = target->Write(Tid(100 + t), segs);
        if (!s.ok()) {
          failures[t] = s;
          return;
        }
      }
      // Finally the whole slice, so the check below covers every byte.
      Segment all{.src_offset = t * slice, .dst_offset = t * slice, .bytes = slice};
      failures[t] = target->Write(Tid(100 + t), {&all, 1});
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(failures[t].ok()) << failures[t].ToString();
  Segment whole{.src_offset = 0, .dst_offset = 0, .bytes = kLayout.bytes()};
  EXPECT_TRUE(Landed(*x.d_region, whole, 5));
  EXPECT_EQ(x.p->stats().writes_ok.load(), uint64_t{kThreads} * (kWritesPerThread + 1));
}

TEST(UcxTransport, OutOfRangeSegmentRefused) {
  Pair x = MakePair({});
  ASSERT_NE(x.p, nullptr);
  Fill(*x.p_region, 7);
  const uint64_t n = kLayout.bytes();
  const std::vector<Segment> bad = {
      {.src_offset = n, .dst_offset = 0, .bytes = 1},
      {.src_offset = 0, .dst_offset = n, .bytes = 1},
      {.src_offset = n - 10, .dst_offset = 0, .bytes = 11},
      {.src_offset = 0, .dst_offset = n - 10, .bytes = 11},
      {.src_offset = UINT64_MAX, .dst_offset = 0, .bytes = 2},
      {.src_offset = 0, .dst_offset = 8, .bytes = UINT64_MAX - 4},
      {.src_offset = n + 1, .dst_offset = 0, .bytes = 0},
  };
  for (const Segment& b : bad) {
    // A good segment first: the whole Write must be refused before any put.
    std::vector<Segment> segs = {{.src_offset = 0, .dst_offset = 0, .bytes = 4096}, b};
    Status s = x.target->Write(Tid(4), segs);
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
  }
  for (uint8_t byte : x.d_region->bytes()) ASSERT_EQ(byte, 0);
  EXPECT_EQ(x.p->stats().writes_failed.load(), bad.size());
  // Still usable.
  Segment ok{.src_offset = 0, .dst_offset = n - 4096, .bytes = 4096};
  Status s = x.target->Write(Tid(4), {&ok, 1});
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Landed(*x.d_region, ok, 7));
}

TEST(UcxTransport, OpenRejectsForeignLocalRegion) {
  Pair x = MakePair({});
  ASSERT_NE(x.p, nullptr);
  // d_region belongs to the other transport.
  auto r = x.p->Open(x.d_region->registration(), x.d_region.get());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  auto n = x.p->Open(x.d_region->registration(), nullptr);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
}

TEST(UcxTransport, MalformedRegistrationsRejected) {
  auto t = MakeOrDie();
  ASSERT_NE(t, nullptr);
  auto local = t->CreateRegion("local", kLayout);
  auto remote = t->CreateRegion("remote", kLayout);
  ASSERT_TRUE(local.ok() && remote.ok());
  Region* l = local.value().get();
  const std::vector<uint8_t> good = remote.value()->registration();
  ASSERT_TRUE(t->Open(good, l).ok());

  // Every proper prefix.
  for (size_t n = 0; n < good.size(); ++n) {
    ExpectRejected(*t, l, std::span<const uint8_t>(good.data(), n),
                   "prefix of " + std::to_string(n));
  }
  // Trailing garbage.
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  ExpectRejected(*t, l, longer, "trailing byte");
  // Every single-byte corruption.
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> c = good;
    c[i] ^= 0x5a;
    ExpectRejected(*t, l, c, "byte " + std::to_string(i) + " flipped");
  }
  // Correctly checksummed but invalid fields.
  const Fields f = Parse(good);
  auto forged = [&](const std::string& what, auto mutate, int64_t wl = -1, int64_t rl = -1) {
    Fields g = f;
    mutate(g);
    ExpectRejected(*t, l, Forge(g, wl, rl), what);
  };
  forged("magic", [](Fields& g) { g.magic ^= 1; });
  forged("version", [](Fields& g) { g.version = 2; });
  forged("total != layout", [](Fields& g) { g.total += 1; });
  forged("layout overflow", [](Fields& g) { g.planes = 1ull << 40; g.stride = 1ull << 40; });
  forged("zero region", [](Fields& g) { g.planes = 0; g.total = 0; });
  forged("address wraps", [](Fields& g) { g.address = UINT64_MAX - 10; });
  forged("null address", [](Fields& g) { g.address = 0; });
  forged("empty worker address", [](Fields& g) { g.worker.clear(); });
  forged("empty rkey", [](Fields& g) { g.rkey.clear(); });
  forged("worker address over cap",
         [](Fields& g) { g.worker.assign(kUcxMaxBlobBytes + 1, 0x11); });
  forged("rkey over cap", [](Fields& g) { g.rkey.assign(kUcxMaxBlobBytes + 1, 0x22); });
  forged("worker length past end", [](Fields&) {}, 0x7fffffff, -1);
  forged("rkey length past end", [](Fields&) {}, -1, 0xffffffff);
  forged("rkey length short", [](Fields&) {}, -1, static_cast<int64_t>(f.rkey.size()) - 1);

  // Random buffers, some starting with a valid header to get further in.
  // KVRELAY_UCX_FUZZ_SEED=N replays a failing run.
  uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("KVRELAY_UCX_FUZZ_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::printf("MalformedRegistrationsRejected seed=%llu\n",
              static_cast<unsigned long long>(seed));
  SCOPED_TRACE("seed=" + std::to_string(seed));
  Prng rng(seed);
  for (int i = 0; i < 10000; ++i) {
    std::vector<uint8_t> buf(rng.Uniform(good.size() * 2 + 1));
    for (auto& b : buf) b = static_cast<uint8_t>(rng.Next64());
    if (rng.OneIn(2)) {
      size_t keep = std::min(buf.size(), static_cast<size_t>(rng.Uniform(good.size() + 1)));
      std::copy(good.begin(), good.begin() + keep, buf.begin());
    }
    if (buf == good) continue;  // a whole valid prefix of the right length
    ExpectRejected(*t, l, buf, "random buffer " + std::to_string(i));
    if (HasFatalFailure()) return;
  }
  EXPECT_TRUE(t->Open(good, l).ok());
}

TEST(UcxTransport, AnyDestructionOrder) {
  Pair x = MakePair({});
  ASSERT_NE(x.p, nullptr);
  Fill(*x.p_region, 11);
  // The transports go first; regions and the target keep UCX alive.
  x.p.reset();
  x.d.reset();
  Segment seg{.src_offset = 0, .dst_offset = 4096, .bytes = 4096};
  Status s = x.target->Write(Tid(5), {&seg, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Landed(*x.d_region, seg, 11));
  // The local region before the target that writes from it.
  x.p_region.reset();
  s = x.target->Write(Tid(5), {&seg, 1});
  EXPECT_TRUE(s.ok()) << s.ToString();
  x.d_region.reset();
  x.target.reset();
}

// Read mode: D gets from P's region. P's region destroyed while a Target
// writing from it keeps its memory mapped (the bytes still there): the
// liveness word, not the bytes, makes the Read fail.
TEST(UcxTransport, ReadFailsOnceTheRemoteRegionIsDestroyedEvenIfItsMemoryLives) {
  Pair x = MakePair({});
  ASSERT_NE(x.p, nullptr);
  Fill(*x.p_region, 25);
  auto source = x.d->OpenSource(x.p_region->registration(), x.d_region.get());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const std::vector<Segment> segs = {
      {.src_offset = 4096 * 2, .dst_offset = 0, .bytes = 4096 * 3},
      {.src_offset = 13, .dst_offset = 4096 * 30 + 5, .bytes = 777},  // unaligned
  };
  Status s = source.value()->Read(Tid(12), segs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const Segment& seg : segs) EXPECT_TRUE(Landed(*x.d_region, seg, 25));
  EXPECT_EQ(x.d->stats().reads_ok.load(), 1u);
  EXPECT_EQ(x.d->stats().bytes_read.load(), 4096u * 3 + 777);

  x.p_region.reset();  // x.target still holds its mapping
  s = source.value()->Read(Tid(12), segs);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(x.d->stats().reads_failed.load(), 1u);
  Segment seg{.src_offset = 0, .dst_offset = 0, .bytes = 4096};
  EXPECT_TRUE(x.target->Write(Tid(12), {&seg, 1}).ok());  // writes from it still work
}

TEST(UcxTransport, TcpOnly) {
  TransportOptions options;
  options.ucx_tls = "tcp";
  std::string unavailable;
  Pair x = MakePair(options, &unavailable);
  if (!unavailable.empty()) GTEST_SKIP() << "UCX tcp unavailable: " << unavailable;
  ASSERT_NE(x.p, nullptr);
  std::string desc = DescribeUcxTarget(*x.target);
  std::printf("endpoint: %s\n", desc.c_str());
  EXPECT_NE(desc.find("tcp"), std::string::npos) << desc;
  EXPECT_EQ(desc.find("cma"), std::string::npos) << desc;
  EXPECT_EQ(desc.find("posix"), std::string::npos) << desc;
  EXPECT_EQ(desc.find("sysv"), std::string::npos) << desc;
  Fill(*x.p_region, 13);
  std::vector<Segment> segs = {
      {.src_offset = 0, .dst_offset = 0, .bytes = kLayout.bytes() / 2},
      {.src_offset = 100, .dst_offset = kLayout.bytes() / 2 + 7, .bytes = 5000},
  };
  Status s = x.target->Write(Tid(6), segs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const Segment& seg : segs) EXPECT_TRUE(Landed(*x.d_region, seg, 13));
}

// UCX 1.13's shared-memory transports cannot detect a dead peer, so with
// the error mode we ask for (PEER) they are not selected: a shm-only TLS
// either works (a UCX that supports it) or is refused with kUnavailable.
TEST(UcxTransport, ShmOnlyTlsWorksOrIsUnavailable) {
  TransportOptions options;
  options.ucx_tls = "sm";
  std::string unavailable;
  Pair x = MakePair(options, &unavailable);
  if (!unavailable.empty()) {
    std::printf("shm-only TLS: %s\n", unavailable.c_str());
    SUCCEED();
    return;
  }
  ASSERT_NE(x.p, nullptr);
  Fill(*x.p_region, 17);
  Segment seg{.src_offset = 0, .dst_offset = 4096, .bytes = 3 * 4096};
  Status s = x.target->Write(Tid(9), {&seg, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Landed(*x.d_region, seg, 17));
}

TEST(UcxTransport, EmptyWriteIsOk) {
  Pair x = MakePair({});
  ASSERT_NE(x.p, nullptr);
  EXPECT_TRUE(x.target->Write(Tid(10), {}).ok());
  Segment zero{.src_offset = 0, .dst_offset = 0, .bytes = 0};
  EXPECT_TRUE(x.target->Write(Tid(10), {&zero, 1}).ok());
  EXPECT_EQ(x.p->stats().writes_ok.load(), 2u);
  EXPECT_EQ(x.p->stats().bytes_written.load(), 0u);
}

TEST(UcxTransport, UnknownTlsIsUnavailable) {
  TransportOptions options;
  options.ucx_tls = "no_such_transport";
  auto t = MakeUcxTransport(options);
  if (t.ok()) {
    // Some UCX versions accept the name and fail only at connection time.
    auto a = t.value()->CreateRegion("a", kLayout);
    ASSERT_TRUE(a.ok());
    auto target = t.value()->Open(a.value()->registration(), a.value().get());
    ASSERT_FALSE(target.ok());
    EXPECT_EQ(target.status().code(), StatusCode::kUnavailable) << target.status().ToString();
  } else {
    EXPECT_EQ(t.status().code(), StatusCode::kUnavailable) << t.status().ToString();
  }
}

// ---------------------------------------------------------------------------
// Second process: fork(), then exec this binary with KVRELAY_UCX_FORK_CHILD
// set, which runs ChildMain before gtest starts. Exec because UCX state must
// not be shared across fork and a multi-threaded parent may only call
// async-signal-safe functions between fork and exec; the parent may thus
// create its transport before forking. The two talk over two pipes.

constexpr int kChildIn = 100;   // child reads from this fd
constexpr int kChildOut = 101;  // child writes to this fd
constexpr char kChildEnv[] = "KVRELAY_UCX_FORK_CHILD";
constexpr auto kChildTimeout = std::chrono::seconds(60);

bool WriteAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes, waiting at most until `deadline`.
bool ReadExactly(int fd, void* data, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{.fd = fd, .events = POLLIN, .revents = 0};
    int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t got = read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool SendMsg(int fd, const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return WriteAll(fd, &n, 4) && WriteAll(fd, s.data(), s.size());
}

bool RecvMsg(int fd, std::string* s, Clock::time_point deadline) {
  uint32_t n = 0;
  if (!ReadExactly(fd, &n, 4, deadline) || n > (1u << 20)) return false;
  s->assign(n, '\0');
  return ReadExactly(fd, s->data(), n, deadline);
}

struct Child {
  pid_t pid = -1;
  int to = -1;    // parent writes
  int from = -1;  // parent reads

  // Ends the child (if still running) and reaps it; returns its wait status.
  int Reap(bool kill_first) {
    if (to >= 0) close(to);
    to = -1;
    if (pid > 0 && kill_first) kill(pid, SIGKILL);
    // EOF on `from` means the child exited (or closed it at exit).
    if (from >= 0 && !kill_first) {
      char c;
      auto deadline = Clock::now() + kChildTimeout;
      while (ReadExactly(from, &c, 1, deadline)) {
      }
      if (Clock::now() >= deadline) kill(pid, SIGKILL);
    }
    if (from >= 0) close(from);
    from = -1;
    int status = -1;
    if (pid > 0) waitpid(pid, &status, 0);
    pid = -1;
    return status;
  }
};

// Starts this binary as a child in `mode` (see ChildMain).
Child SpawnChild(const std::string& mode) {
  Child c;
  int down[2], up[2];
  if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0) return c;
  // Everything exec needs is built before fork.
  std::vector<std::string> args = {"ucx_transport_test"};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, kChildEnv, sizeof(kChildEnv) - 1) != 0) env.emplace_back(*e);
  }
  env.push_back(std::string(kChildEnv) + "=" + mode);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = fork();
  if (pid == 0) {
    // dup2 clears O_CLOEXEC on the new descriptors.
    if (dup2(down[0], kChildIn) < 0 || dup2(up[1], kChildOut) < 0) _exit(120);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(121);
  }
  close(down[0]);
  close(up[1]);
  if (pid < 0) {
    close(down[1]);
    close(up[0]);
    return c;
  }
  c.pid = pid;
  c.to = down[1];
  c.from = up[0];
  return c;
}

const Segment kChildSegs[] = {
    {.src_offset = 0, .dst_offset = 4096 * 5, .bytes = 4096 * 3},
    {.src_offset = 4096 * 40, .dst_offset = 4096 * 50, .bytes = 4096 * 10 + 17},
};

// Child side, run before main() in a process SpawnChild exec'd (gtest never
// starts there). Mode "write": read (tls, registration) from the parent,
// write kChildSegs from a region filled with Pattern(.., 21), report "OK"
// or the error. Mode "serve": read tls, create a region, send its
// registration, wait for the parent to close the pipe, vanish.
[[noreturn]] void ChildMain(const std::string& mode) {
  auto deadline = Clock::now() + kChildTimeout;
  std::string tls, reg;
  if (!RecvMsg(kChildIn, &tls, deadline)) std::_Exit(2);
  {
    TransportOptions options;
    options.ucx_tls = tls;
    auto t = MakeUcxTransport(options);
    if (!t.ok()) {
      SendMsg(kChildOut, "MAKE " + t.status().ToString());
      std::_Exit(0);
    }
    auto region = t.value()->CreateRegion("child", kLayout);
    if (!region.ok()) {
      SendMsg(kChildOut, "REGION " + region.status().ToString());
      std::_Exit(3);
    }
    Fill(*region.value(), 21);
    if (mode == "serve") {
      const auto& mine = region.value()->registration();
      if (!SendMsg(kChildOut, std::string(mine.begin(), mine.end()))) std::_Exit(4);
      char c;
      while (ReadExactly(kChildIn, &c, 1, deadline)) {
      }
      std::_Exit(0);  // a peer vanishing without UCX teardown
    }
    if (!RecvMsg(kChildIn, &reg, deadline)) std::_Exit(5);
    auto target = t.value()->Open(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(reg.data()), reg.size()),
        region.value().get());
    if (!target.ok()) {
      SendMsg(kChildOut, "OPEN " + target.status().ToString());
      std::_Exit(6);
    }
    Status s = target.value()->Write(Tid(7), kChildSegs);
    SendMsg(kChildOut, s.ok() ? "OK" : "WRITE " + s.ToString());
  }  // orderly UCX teardown
  std::_Exit(0);
}

[[maybe_unused]] const bool kChildHook = [] {
  if (const char* mode = std::getenv(kChildEnv)) ChildMain(mode);
  return false;
}();

class UcxTransportFork : public ::testing::TestWithParam<std::string> {};

// The child opens the parent's registration and writes; the parent checks.
TEST_P(UcxTransportFork, ChildWritesIntoParentRegion) {
  TransportOptions options;
  options.ucx_tls = GetParam();
  auto t = MakeUcxTransport(options);
  if (!t.ok() && t.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << t.status().ToString();
  }
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto region = t.value()->CreateRegion("parent", kLayout);
  ASSERT_TRUE(region.ok()) << region.status().ToString();

  Child child = SpawnChild("write");
  ASSERT_GT(child.pid, 0) << std::strerror(errno);
  const auto& reg = region.value()->registration();
  ASSERT_TRUE(SendMsg(child.to, GetParam()));
  ASSERT_TRUE(SendMsg(child.to, std::string(reg.begin(), reg.end())));
  std::string result;
  bool got = RecvMsg(child.from, &result, Clock::now() + kChildTimeout);
  int status = child.Reap(/*kill_first=*/!got);
  ASSERT_TRUE(got) << "no answer from child";
  if (result.starts_with("MAKE ") && result.find("UNAVAILABLE") != std::string::npos) {
    GTEST_SKIP() << "child: " << result;
  }
  ASSERT_EQ(result, "OK");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  for (const Segment& seg : kChildSegs) {
    EXPECT_TRUE(LandedFromOtherProcess(*region.value(), seg, 21));
  }
  // Nothing outside the segments.
  std::span<uint8_t> b = region.value()->bytes();
  for (uint64_t i = 0; i < kChildSegs[0].dst_offset; ++i) ASSERT_EQ(b[i], 0) << i;
}

// This process's transport and region over `tls`, and a child serving its
// own region ("serve" mode: filled with Pattern(.., 21)) with its
// registration. `skip` says why UCX is unavailable; any other failure is
// recorded and leaves `region` empty.
struct ServingChild {
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Region> region;
  Child child;
  std::string registration;
  std::string skip;

  std::span<const uint8_t> registration_bytes() const {
    return {reinterpret_cast<const uint8_t*>(registration.data()), registration.size()};
  }
};

ServingChild StartServingChild(const std::string& tls) {
  ServingChild x;
  TransportOptions options;
  options.ucx_tls = tls;
  auto t = MakeUcxTransport(options);
  if (!t.ok()) {
    if (t.status().code() == StatusCode::kUnavailable) {
      x.skip = t.status().ToString();
    } else {
      ADD_FAILURE() << t.status().ToString();
    }
    return x;
  }
  auto region = t.value()->CreateRegion("parent", kLayout);
  if (!region.ok()) {
    ADD_FAILURE() << region.status().ToString();
    return x;
  }
  x.child = SpawnChild("serve");
  if (x.child.pid <= 0) {
    ADD_FAILURE() << "spawn: " << std::strerror(errno);
    return x;
  }
  if (!SendMsg(x.child.to, tls) ||
      !RecvMsg(x.child.from, &x.registration, Clock::now() + kChildTimeout)) {
    x.child.Reap(/*kill_first=*/true);
    ADD_FAILURE() << "no registration from child";
    return x;
  }
  if (x.registration.starts_with("MAKE ")) {
    x.child.Reap(/*kill_first=*/true);
    x.skip = "child: " + x.registration;
    return x;
  }
  x.transport = std::move(t).value();
  x.region = std::move(region).value();
  return x;
}

// Kills the child, then runs `op` (a Write or Read to it), which must fail
// rather than hang or crash.
void ExpectFailsOnceTheChildIsGone(Child& child, const char* what,
                                   const std::function<Status()>& op) {
  child.Reap(/*kill_first=*/true);
  const auto start = Clock::now();
  const Status s = op();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  std::printf("%s vanished peer: %s after %lld ms\n", what, s.ToString().c_str(),
              static_cast<long long>(took.count()));
  EXPECT_FALSE(s.ok());
}

// The parent writes into a child's region; after the child is gone a Write
// fails (within the write timeout) instead of hanging or crashing.
TEST_P(UcxTransportFork, WriteToVanishedPeerFails) {
  ServingChild x = StartServingChild(GetParam());
  if (!x.skip.empty()) GTEST_SKIP() << x.skip;
  ASSERT_NE(x.region, nullptr);
  Fill(*x.region, 23);
  auto target = x.transport->Open(x.registration_bytes(), x.region.get());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  Segment seg{.src_offset = 0, .dst_offset = 0, .bytes = 8192};
  Status s = target.value()->Write(Tid(8), {&seg, 1});
  EXPECT_TRUE(s.ok()) << s.ToString();
  ExpectFailsOnceTheChildIsGone(x.child, "write to",
                                [&] { return target.value()->Write(Tid(8), {&seg, 1}); });
  target.value().reset();  // closing an endpoint to a dead peer is bounded too
}

// The parent reads a child's region (gets over the chosen TLS); after the
// child is gone a Read fails (within the copy timeout) instead of hanging.
TEST_P(UcxTransportFork, ReadFromChildThenFailWhenItVanishes) {
  ServingChild x = StartServingChild(GetParam());
  if (!x.skip.empty()) GTEST_SKIP() << x.skip;
  ASSERT_NE(x.region, nullptr);
  auto source = x.transport->OpenSource(x.registration_bytes(), x.region.get());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const std::vector<Segment> segs = {
      {.src_offset = 4096 * 50, .dst_offset = 4096 * 5, .bytes = 4096 * 3},
      {.src_offset = 7, .dst_offset = 4096 * 40 + 1, .bytes = 4096 * 10 + 17},
  };
  Status s = source.value()->Read(Tid(13), segs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const Segment& seg : segs) EXPECT_TRUE(LandedFromOtherProcess(*x.region, seg, 21));
  ExpectFailsOnceTheChildIsGone(x.child, "read from",
                                [&] { return source.value()->Read(Tid(13), segs); });
  source.value().reset();  // closing an endpoint to a dead peer is bounded too
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportFork, ::testing::Values("", "tcp"),
                         [](const auto& tp) {
                           return tp.param.empty() ? std::string("Default") : tp.param;
                         });

}  // namespace
}  // namespace kvrelay::net

// See LandedFromOtherProcess. Only a TSan runtime calls this.
extern "C" const char* __tsan_default_suppressions() {
  return "race:LandedFromOtherProcess\n";
}
