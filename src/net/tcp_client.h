// tcp_client.h — StreamPool: the connections from one process to one remote
// tcp region's receiver, for writes and reads alike (TcpRemote): at most
// max_streams, opened lazily, reused while in step.
//
// Each operation (or each stripe of a striped write) takes a stream for
// itself — an idle one, or a new one while fewer than max_streams are open;
// otherwise Acquire waits at most min(kStreamWaitMs, the operation's
// deadline) and TryAcquire does not wait — runs its frames on it and gives
// it back. A stream is reused only if the operation left it in step: it
// succeeded, or the peer refused or rejected a frame whole
// (kFailedPrecondition, kInvalidArgument). Any other error closes it. An
// idle stream found readable was closed by the peer (region gone, receiver
// restarted) and is dropped.
//
// Sockets: TCP_NODELAY, 4 MiB SO_SNDBUF, send/recv timeouts of
// kStallTimeoutMs, connect bounded by min(kConnectTimeoutMs, the deadline).
//
// CheckLocal, CountOutcome, RunFrames: the local half of a Write or a Read.
//
// Thread safety: Run may be called from several threads at once.
// Ownership: owned by its Target or Source; destroying it while an
// operation runs is a bug (checked).
#pragma once

#include "base/mutex.h"
#include "net/tcp_stream.h"

namespace kvrelay::net::tcp {

class StreamPool {
 public:
  StreamPool(TcpRegistration remote, uint32_t max_streams)
      : remote_(std::move(remote)), max_streams_(std::max<uint32_t>(max_streams, 1)) {}
  ~StreamPool() {
    MutexLock lock(&mu_);
    KV_CHECK_MSG(open_ == idle_.size(), "tcp stream pool destroyed during an operation");
    for (int fd : idle_) close(fd);
  }
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  uint32_t max_streams() const { return max_streams_; }

  // Runs op(fd) -> Status on a stream of the pool and returns its status
  // (or why no stream could be had: kResourceExhausted, kUnavailable,
  // kDeadlineExceeded).
  template <typename Op>
  Status Run(Op op, const WaitBound& bound = {}) EXCLUDES(mu_) {
    Result<int> fd = Acquire(bound);
    if (!fd.ok()) return fd.status();
    Status status = op(*fd);
    Release(*fd, status);
    return status;
  }

  // A stream for one operation, waiting for one at most min(kStreamWaitMs,
  // the deadline). Give it back with Release.
  Result<int> Acquire(const WaitBound& bound) EXCLUDES(mu_) {
    return Take(bound, /*wait=*/true);
  }
  // A stream if one is idle or may be opened now, else -1 (never waits for
  // another operation to give one back).
  int TryAcquire(const WaitBound& bound) EXCLUDES(mu_) {
    Result<int> fd = Take(bound, /*wait=*/false);
    return fd.ok() ? *fd : -1;
  }
  // An idle stream, else -1: never connects and never waits (for a caller
  // that must not block, PendingWrite). An idle stream the peer closed is
  // dropped, as in Take.
  int TryAcquireIdle() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return PopLiveIdle();
  }
  // Gives back a stream from Acquire/TryAcquire after an operation that
  // ended with `status`: kept if that left it in step, else closed.
  void Release(int fd, const Status& status) EXCLUDES(mu_) {
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

 private:
  Result<int> Take(const WaitBound& bound, bool wait) EXCLUDES(mu_) {
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

  // The last idle stream still in step, else -1. An idle stream has
  // nothing to read; readable means the receiver closed it (region gone,
  // receiver restarted): it is dropped and the next one tried.
  int PopLiveIdle() REQUIRES(mu_) {
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

  Result<int> Connect(const WaitBound& bound) {
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
        last_error = Errno("socket");
        continue;
      }
      if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
        last_error = Errno("connect");
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
          last_error = Errno("connect");
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

  const TcpRegistration remote_;
  const uint32_t max_streams_;

  Mutex mu_;
  CondVar cv_;
  std::vector<int> idle_ GUARDED_BY(mu_);
  uint32_t open_ GUARDED_BY(mu_) = 0;  // idle + in use
};

// What a Write and a Read share on the local side: every segment's local
// range (src for a write, dst for a read) is checked before any byte moves
// (CheckLocal), the frames of a segment list run on one stream
// (FramesOnStream), and each operation's outcome is counted once in
// `ok`/`failed`/`bytes` (CountOutcome).
struct OpCounters {
  std::atomic<uint64_t>& ok;
  std::atomic<uint64_t>& failed;
  std::atomic<uint64_t>& bytes;
};

// kOutOfRange if a segment's local range lies outside `local`; else sets
// *total to the segments' bytes.
inline Status CheckLocal(std::span<uint8_t> local, std::span<const Segment> segments,
                         bool local_is_src, const char* what, uint64_t* total) {
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

inline Status CountOutcome(Status status, uint64_t total, OpCounters counters) {
  if (status.ok()) {
    counters.ok.fetch_add(1, std::memory_order_relaxed);
    counters.bytes.fetch_add(total, std::memory_order_relaxed);
  } else {
    counters.failed.fetch_add(1, std::memory_order_relaxed);
  }
  return status;
}

// Runs frame_fn(fd, frame, frame_bytes, table) for each frame of
// `segments` (ForEachFrame) on stream `fd`, in order; stops at the first
// error.
template <typename FrameFn>
Status FramesOnStream(int fd, std::span<const Segment> segments, FrameFn frame_fn) {
  std::vector<uint8_t> table;  // this call's: operations and stripes run concurrently
  return ForEachFrame(segments, [&](std::span<const Segment> frame, uint64_t frame_bytes) {
    return frame_fn(fd, frame, frame_bytes, table);
  });
}

}  // namespace kvrelay::net::tcp
