// tcp_client.cc — StreamPool and the local half of a tcp Write or Read
// (see tcp_client.h).
#include "net/tcp_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>

#include "base/check.h"
#include "os/errno_message.h"

namespace kvrelay::net::tcp {

StreamPool::StreamPool(TcpRegistration remote, uint32_t max_streams)
    : remote_(std::move(remote)), max_streams_(std::max<uint32_t>(max_streams, 1)) {}

StreamPool::~StreamPool() {
  MutexLock lock(&mu_);
  KV_CHECK_MSG(open_ == idle_.size(), "tcp stream pool destroyed during an operation");
  for (int fd : idle_) close(fd);
}

Result<int> StreamPool::Acquire(const WaitBound& bound) {
  return Take(bound, /*wait=*/true);
}

int StreamPool::TryAcquire(const WaitBound& bound) {
  Result<int> fd = Take(bound, /*wait=*/false);
  return fd.ok() ? *fd : -1;
}

int StreamPool::TryAcquireIdle() {
  MutexLock lock(&mu_);
  return PopLiveIdle();
}

void StreamPool::Release(int fd, const Status& status) {
  const bool reusable = status.ok() || status.code() == StatusCode::kFailedPrecondition ||
                        status.code() == StatusCode::kInvalidArgument;
  MutexLock lock(&mu_);
  if (reusable) {
    idle_.push_back(fd);
  } else {
    close(fd);
    --open_;
  }
  cv_.NotifyOne();
}

Result<int> StreamPool::Take(const WaitBound& bound, bool wait) {
  {
    MutexLock lock(&mu_);
    while (true) {
      const auto ready = [&]() REQUIRES(mu_) { return !idle_.empty() || open_ < max_streams_; };
      if (!wait) {
        if (!ready()) return ResourceExhaustedError("tcp: no idle stream");
      } else {
        const int wait_ms = bound.CapMs(kStreamWaitMs);
        if (wait_ms == 0 || !cv_.WaitFor(&mu_, std::chrono::milliseconds(wait_ms), ready)) {
          if (bound.Expired()) {
            return DeadlineExceededError("tcp: the deadline passed waiting for a stream");
          }
          return ResourceExhaustedError("tcp: all " + std::to_string(max_streams_) +
                                        " streams busy");
        }
      }
      if (const int fd = PopLiveIdle(); fd >= 0) return fd;
      if (open_ < max_streams_) break;  // idle ones were dead: open one
    }
    ++open_;
  }
  Result<int> fd = Connect(bound);
  if (!fd.ok()) {
    MutexLock lock(&mu_);
    --open_;
    cv_.NotifyOne();
  }
  return fd;
}

int StreamPool::PopLiveIdle() {
  while (!idle_.empty()) {
    const int fd = idle_.back();
    idle_.pop_back();
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) == 0) return fd;
    close(fd);
    --open_;
    cv_.NotifyOne();  // room to open another
  }
  return -1;
}

Result<int> StreamPool::Connect(const WaitBound& bound) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  const std::string port = std::to_string(remote_.port);
  if (const int err = getaddrinfo(remote_.host.c_str(), port.c_str(), &hints, &addrs);
      err != 0) {
    return UnavailableError("tcp: resolving " + remote_.host + ": " + gai_strerror(err));
  }
  std::string last_error = "no address";
  int connected = -1;
  for (addrinfo* a = addrs; a != nullptr && connected < 0; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_error = ErrnoMessage("socket");
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last_error = ErrnoMessage("connect");
      close(fd);
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    int r;
    do {
      r = poll(&p, 1, bound.CapMs(kConnectTimeoutMs));
    } while (r < 0 && errno == EINTR);
    if (r <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      if (r == 0) {
        last_error = "connect: timed out";
      } else {
        if (err != 0) errno = err;
        last_error = ErrnoMessage("connect");
      }
      close(fd);
      continue;
    }
    connected = fd;
  }
  freeaddrinfo(addrs);
  if (connected < 0) {
    return bound.Failed("tcp: connecting to " + remote_.host + ":" + port + ": " + last_error);
  }
  const int flags = fcntl(connected, F_GETFL);
  fcntl(connected, F_SETFL, flags & ~O_NONBLOCK);
  SetStreamOptions(connected);
  return connected;
}

Status CheckLocal(std::span<uint8_t> local, std::span<const Segment> segments, bool local_is_src,
                  const char* what, uint64_t* total) {
  *total = 0;
  for (const Segment& s : segments) {
    const uint64_t offset = local_is_src ? s.src_offset : s.dst_offset;
    if (offset > local.size() || s.bytes > local.size() - offset) {
      return Status(StatusCode::kOutOfRange,
                    std::string("tcp ") + what + ": local segment [" + std::to_string(offset) +
                        ", " + std::to_string(s.bytes) + " bytes) outside the local region");
    }
    *total += s.bytes;
  }
  return Status::Ok();
}

Status CountOutcome(Status status, uint64_t total, OpCounters counters) {
  if (status.ok()) {
    counters.ok.fetch_add(1, std::memory_order_relaxed);
    counters.bytes.fetch_add(total, std::memory_order_relaxed);
  } else {
    counters.failed.fetch_add(1, std::memory_order_relaxed);
  }
  return status;
}

}  // namespace kvrelay::net::tcp
