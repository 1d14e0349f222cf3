// tcp_pending_fixture.h — TcpPendingFixture: what the tests of polled tcp
// writes and reads (tcp_pending_write_test.cc, tcp_pending_read_test.cc)
// share: a P and a D tcp transport in this process, one region each (P's
// bytes a known pattern, D's zero), one stream per peer so "idle or not"
// is exact, and helpers to name a block's segments and drive a pending
// operation to its end.
//
// Test-only (header-only, included by tests). Threading: the test's.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <cstring>
#include <memory>
#include <vector>

#include "net/transport.h"
#include "os/clock.h"

namespace kvrelay::net {

class TcpPendingFixture : public testing::Test {
 protected:
  static constexpr TransferId kT{0xabc, 0xdef};
  // 4 planes × 8 blocks × 4 KiB: a block's four segments are 16 KiB.
  static constexpr RegionLayout kLayout{4, 8, 4096};

  // Block `src` of every plane on P → block `dst` on D.
  static std::vector<Segment> OneBlock(uint32_t src, uint32_t dst) {
    std::vector<Segment> out;
    for (uint64_t plane = 0; plane < kLayout.planes; ++plane) {
      out.push_back(Segment{(plane * kLayout.num_blocks + src) * kLayout.block_stride_bytes,
                            (plane * kLayout.num_blocks + dst) * kLayout.block_stride_bytes,
                            kLayout.block_stride_bytes});
    }
    return out;
  }

  // Polls and steps `op` until it returns its outcome (bounded).
  static Status Drive(PendingWrite& op) {
    for (int i = 0; i < 10'000; ++i) {
      if (std::optional<Status> s = op.Progress()) return *s;
      pollfd p{op.fd(), static_cast<short>(op.wants_write() ? POLLOUT : POLLIN), 0};
      poll(&p, 1, 1000);
    }
    return InternalError("the pending operation never ended");
  }

  void SetUp() override { MakePair(kLayout); }

  // P's and D's transports and regions of `layout` (a test with other
  // sizes calls it from its own SetUp).
  void MakePair(const RegionLayout& layout) {
    TransportOptions options;
    options.tcp_streams = 1;  // one stream: "idle or not" is exact
    options.tcp_stripe_min_bytes = 16 * 1024;
    auto p = MakeTcpTransport(options);
    auto d = MakeTcpTransport(options);
    ASSERT_TRUE(p.ok() && d.ok());
    p_ = std::move(p).value();
    d_ = std::move(d).value();
    auto pr = p_->CreateRegion("p", layout);
    auto dr = d_->CreateRegion("d", layout);
    ASSERT_TRUE(pr.ok() && dr.ok());
    p_region_ = std::move(pr).value();
    d_region_ = std::move(dr).value();
    std::span<uint8_t> bytes = p_region_->bytes();
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  }

  // Every segment's bytes on D equal P's.
  bool Landed(const std::vector<Segment>& segs) {
    for (const Segment& s : segs) {
      if (std::memcmp(d_region_->bytes().data() + s.dst_offset,
                      p_region_->bytes().data() + s.src_offset, s.bytes) != 0) {
        return false;
      }
    }
    return true;
  }

  Instant Soon() const { return MonoNow() + Duration::Seconds(10); }

  std::unique_ptr<Transport> p_, d_;
  std::unique_ptr<Region> p_region_, d_region_;
};

}  // namespace kvrelay::net
