// raw_baseline.cc — shared memory, tcp and ZeroMQ baselines (UCX's is in
// raw_ucx.cc). See raw_baseline.h.
//
// The helper process is forked after the transfer list is built, so it
// knows every segment without a protocol: the stream carries payload bytes
// only and one byte of acknowledgement per transfer (tcp: per stripe, each
// on its own stream) — the least a transfer over that mechanism can cost. After the last transfer the helper hashes
// what landed in the last transfer's destination and the parent compares
// it with the source, so a broken baseline cannot report a good figure.
#include "bench/raw_baseline.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "bench/raw_helper.h"
#include "net/stripe_plan.h"
#include "os/clock.h"
#include "os/errno_message.h"

namespace kvrelay::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Every baseline moves its transfers twice and times the second pass: the
// first warms what a long-running P and D have warm (page tables of both
// pools and of the mapping, the socket's buffers), so the timed pass
// measures the mechanism, not first touches.
constexpr int kPasses = 2;

}  // namespace

Result<std::vector<double>> RawShmCopy(const std::vector<RawTransfer>& transfers,
                                       const RawOptions& options) {
  const std::string name = "/kvrelay-bench-" + std::to_string(getpid());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return UnavailableError(ErrnoMessage("shm_open " + name));
  if (ftruncate(fd, static_cast<off_t>(options.dst_pool_bytes)) != 0) {
    const Status s = UnavailableError(ErrnoMessage("ftruncate"));
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  // The receiver maps the segment and allocates it by writing it (not
  // MAP_POPULATE: see raw::Pool) and, after the parent's "done", hashes the
  // last transfer's destination.
  auto child = raw::Helper::Fork([&](int sock) -> int {
    void* dst = mmap(nullptr, options.dst_pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (dst == MAP_FAILED) return 2;
    std::memset(dst, 0, options.dst_pool_bytes);
    if (!raw::SendByte(sock)) return 3;
    if (!raw::RecvByte(sock)) return 4;
    const uint64_t h = raw::HashDst(static_cast<uint8_t*>(dst), transfers.back());
    return raw::SendAll(sock, &h, sizeof h) ? 0 : 5;
  });
  if (!child.ok()) {
    close(fd);
    shm_unlink(name.c_str());
    return child.status();
  }
  const bool ready = raw::RecvByte(child->sock());
  void* dst = ready ? mmap(nullptr, options.dst_pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
  close(fd);
  shm_unlink(name.c_str());  // both processes hold it mapped now
  if (dst == MAP_FAILED) return UnavailableError("shm baseline: the receiver or mmap failed");
  // The writer's own page tables for the mapping, as a long-lived writer
  // has them: write every page once before timing.
  std::memset(dst, 0, options.dst_pool_bytes);
  Result<raw::Pool> src = raw::Pool::Make(options.src_pool_bytes);
  if (!src.ok()) return src.status();

  std::vector<double> seconds;
  seconds.reserve(transfers.size());
  uint8_t* d = static_cast<uint8_t*>(dst);
  for (int pass = 0; pass < kPasses; ++pass) {
    for (const RawTransfer& t : transfers) {
      raw::IdleBefore(options.idle_before);
      const auto t0 = Clock::now();
      for (const net::Segment& s : t) {
        std::memcpy(d + s.dst_offset, src->data() + s.src_offset, s.bytes);
      }
      if (pass == kPasses - 1) seconds.push_back(SecondsSince(t0));
    }
  }
  Status verdict = child->FinishAndCompare(raw::HashSrc(src->data(), transfers.back()));
  munmap(dst, options.dst_pool_bytes);
  if (!verdict.ok()) return verdict;
  return seconds;
}

Result<std::vector<double>> RawTcpStream(const std::vector<RawTransfer>& transfers,
                                         const RawOptions& options) {
  const uint32_t streams = std::max<uint32_t>(options.tcp_streams, 1);
  // Every transfer's stripes, as kvrelay's tcp Write cuts them; both
  // processes know them (the helper is forked after this).
  std::vector<std::vector<RawTransfer>> plan;
  plan.reserve(transfers.size());
  for (const RawTransfer& t : transfers) {
    uint64_t total = 0;
    for (const net::Segment& s : t) total += s.bytes;
    plan.push_back(net::SplitIntoStripes(
        t, net::StripeCount(total, streams, options.tcp_stripe_min_bytes)));
  }
  Result<raw::Listener> listener = raw::Listener::Loopback(static_cast<int>(streams));
  if (!listener.ok()) return listener.status();
  const int lfd = listener->fd();
  // The receiver: one thread per stream, each receiving its stripe of every
  // transfer that has one straight into the pool and acknowledging it.
  auto child = raw::Helper::Fork([&](int sock) -> int {
    Result<raw::Pool> dst = raw::Pool::Make(options.dst_pool_bytes);
    if (!dst.ok()) return 2;
    std::vector<int> fds;
    for (uint32_t i = 0; i < streams; ++i) {
      const int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return 3;
      fds.push_back(fd);
    }
    std::vector<int> codes(streams, 0);
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < streams; ++i) {
      threads.emplace_back([&, i] {
        for (int pass = 0; pass < kPasses; ++pass) {
          for (const std::vector<RawTransfer>& stripes : plan) {
            if (i >= stripes.size()) continue;
            for (const net::Segment& s : stripes[i]) {
              if (!raw::RecvAll(fds[i], dst->data() + s.dst_offset, s.bytes)) {
                codes[i] = 4;
                return;
              }
            }
            if (!raw::SendByte(fds[i])) {
              codes[i] = 5;
              return;
            }
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int fd : fds) close(fd);
    for (int code : codes) {
      if (code != 0) return code;
    }
    if (!raw::RecvByte(sock)) return 6;
    const uint64_t h = raw::HashDst(dst->data(), transfers.back());
    return raw::SendAll(sock, &h, sizeof h) ? 0 : 7;
  });
  if (!child.ok()) return child.status();
  Result<raw::Pool> src = raw::Pool::Make(options.src_pool_bytes);
  if (!src.ok()) return src.status();
  std::vector<int> fds;
  Status failed = Status::Ok();
  for (uint32_t i = 0; i < streams && failed.ok(); ++i) {
    Result<int> fd = raw::ConnectLoopback(listener->port());
    if (fd.ok()) {
      fds.push_back(*fd);
    } else {
      failed = fd.status();
    }
  }

  // Stripe i of a transfer: writev of its segments on stream i, then its
  // acknowledgement.
  const auto send_stripe = [&](size_t i, const RawTransfer& stripe) {
    std::vector<iovec> iov;
    iov.reserve(stripe.size());
    for (const net::Segment& s : stripe) iov.push_back({src->data() + s.src_offset, s.bytes});
    return raw::SendAllV(fds[i], iov) && raw::RecvByte(fds[i]);
  };
  std::vector<double> seconds;
  seconds.reserve(transfers.size());
  for (int pass = 0; pass < kPasses && failed.ok(); ++pass) {
    for (const std::vector<RawTransfer>& stripes : plan) {
      raw::IdleBefore(options.idle_before);
      const auto t0 = Clock::now();
      // One flag per stripe (not vector<bool>: threads write their own).
      std::vector<uint8_t> ok(stripes.size(), 0);
      std::vector<std::thread> helpers;
      for (size_t i = 1; i < stripes.size(); ++i) {
        helpers.emplace_back([&, i] { ok[i] = send_stripe(i, stripes[i]) ? 1 : 0; });
      }
      ok[0] = send_stripe(0, stripes[0]) ? 1 : 0;
      for (std::thread& t : helpers) t.join();
      if (std::find(ok.begin(), ok.end(), 0) != ok.end()) {
        failed = UnavailableError(ErrnoMessage("tcp baseline: stream"));
        break;
      }
      if (pass == kPasses - 1) seconds.push_back(SecondsSince(t0));
    }
  }
  for (int fd : fds) close(fd);
  Status verdict = child->FinishAndCompare(raw::HashSrc(src->data(), transfers.back()));
  if (!failed.ok()) return failed;
  if (!verdict.ok()) return verdict;
  return seconds;
}

Result<std::vector<double>> ZmqRoundTrips(uint32_t samples, uint32_t payload_bytes,
                                          std::chrono::microseconds gap) {
  auto child = raw::Helper::Fork([&](int sock) -> int {
    void* ctx = zmq_ctx_new();
    void* router = zmq_socket(ctx, ZMQ_ROUTER);
    if (zmq_bind(router, "tcp://127.0.0.1:*") != 0) return 2;
    char endpoint[256] = {};
    size_t len = sizeof endpoint;
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, endpoint, &len);
    const uint32_t n = static_cast<uint32_t>(std::strlen(endpoint));
    if (!raw::SendAll(sock, &n, sizeof n) || !raw::SendAll(sock, endpoint, n)) return 3;
    std::vector<uint8_t> id(256), body(payload_bytes + 16);
    while (true) {
      const int il = zmq_recv(router, id.data(), id.size(), 0);
      const int bl = zmq_recv(router, body.data(), body.size(), 0);
      if (il < 0 || bl < 0) return 4;
      if (bl == 0) break;  // the parent's "quit"
      zmq_send(router, id.data(), static_cast<size_t>(il), ZMQ_SNDMORE);
      zmq_send(router, body.data(), static_cast<size_t>(bl), 0);
    }
    zmq_close(router);
    zmq_ctx_term(ctx);
    return 0;
  });
  if (!child.ok()) return child.status();
  uint32_t n = 0;
  std::string endpoint;
  if (raw::RecvAll(child->sock(), reinterpret_cast<uint8_t*>(&n), sizeof n) && n < 256) {
    endpoint.resize(n);
    if (!raw::RecvAll(child->sock(), reinterpret_cast<uint8_t*>(endpoint.data()), n)) {
      endpoint.clear();
    }
  }
  if (endpoint.empty()) return UnavailableError("zmq baseline: the echo process did not start");
  void* ctx = zmq_ctx_new();
  void* dealer = zmq_socket(ctx, ZMQ_DEALER);
  const int linger = 0;
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
  std::vector<double> seconds;
  Status failed = Status::Ok();
  if (zmq_connect(dealer, endpoint.c_str()) != 0) {
    failed = UnavailableError("zmq baseline: connect " + endpoint);
  } else {
    std::vector<uint8_t> out(payload_bytes, 0x42), in(payload_bytes + 16);
    const uint32_t warmup = 50;
    for (uint32_t i = 0; i < warmup + samples; ++i) {
      if (gap.count() > 0) std::this_thread::sleep_for(gap);
      const auto t0 = Clock::now();
      if (zmq_send(dealer, out.data(), out.size(), 0) < 0 ||
          zmq_recv(dealer, in.data(), in.size(), 0) < 0) {
        failed = UnavailableError("zmq baseline: round trip failed");
        break;
      }
      if (i >= warmup) seconds.push_back(SecondsSince(t0));
    }
    zmq_send(dealer, nullptr, 0, 0);  // quit
  }
  zmq_close(dealer);
  zmq_ctx_term(ctx);
  Status exit = child->Wait();
  if (!failed.ok()) return failed;
  if (!exit.ok()) return exit;
  return seconds;
}

}  // namespace kvrelay::bench
