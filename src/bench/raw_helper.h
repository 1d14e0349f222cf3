// raw_helper.h — the plumbing the raw baselines share: a forked helper
// process on a socketpair, cold memory pools, loopback sockets, and a
// sampled hash that proves the bytes arrived.
//
// Why a header of small inline pieces: each baseline is a few lines of
// mechanism; everything around it (fork, pools, verification) is the same
// and written once here. Single-threaded use only (see raw_baseline.h).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/result.h"
#include "net/transport.h"
#include "os/errno_message.h"

namespace kvrelay::bench::raw {

// Before a transfer: `idle` asleep (RawOptions::idle_before; 0: none).
inline void IdleBefore(std::chrono::microseconds idle) {
  if (idle.count() > 0) std::this_thread::sleep_for(idle);
}

inline bool SendAll(int fd, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

inline bool RecvAll(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, MSG_WAITALL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

inline bool SendByte(int fd) {
  const uint8_t b = 1;
  return SendAll(fd, &b, 1);
}
inline bool RecvByte(int fd) {
  uint8_t b = 0;
  return RecvAll(fd, &b, 1);
}

// writev until every byte of `iov` is out (batches of IOV_MAX).
inline bool SendAllV(int fd, std::vector<iovec>& iov) {
  size_t i = 0;
  while (i < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(IOV_MAX, iov.size() - i));
    msghdr msg{};
    msg.msg_iov = iov.data() + i;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    // Skip what went out; the partly-sent entry is advanced in place.
    while (w > 0 && i < iov.size()) {
      if (static_cast<size_t>(w) >= iov[i].iov_len) {
        w -= static_cast<ssize_t>(iov[i].iov_len);
        ++i;
      } else {
        iov[i].iov_base = static_cast<uint8_t*>(iov[i].iov_base) + w;
        iov[i].iov_len -= static_cast<size_t>(w);
        w = 0;
      }
    }
  }
  return true;
}

// Private memory, touched now and stamped so that every 4 KiB holds its
// own offset (what the sampled hash reads).
//
// Touched by writing, never by MAP_POPULATE: on this machine's kind of VM
// (paravirtualised page tables) the first user access to a populated page
// costs ~45 µs — 0.09 GB/s, measured — while an ordinary first-touch fault
// costs ~1 µs. See docs/performance.md.
class Pool {
 public:
  static Result<Pool> Make(uint64_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return UnavailableError(ErrnoMessage("mmap " + std::to_string(bytes) + " bytes"));
    }
    uint8_t* b = static_cast<uint8_t*>(p);
    std::memset(b, 0x5a, bytes);
    for (uint64_t off = 0; off + 8 <= bytes; off += 4096) std::memcpy(b + off, &off, 8);
    return Pool(b, bytes);
  }
  Pool(Pool&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  Pool& operator=(Pool&&) = delete;
  ~Pool() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  uint8_t* data() const { return data_; }

 private:
  Pool(uint8_t* d, uint64_t n) : data_(d), bytes_(n) {}
  uint8_t* data_;
  uint64_t bytes_;
};

// A sampled hash of a transfer's bytes: every 4 KiB step and the last 8
// bytes of each segment, on the source or the destination side.
inline uint64_t HashSegments(const uint8_t* base, const std::vector<net::Segment>& t, bool dst) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 1099511628211ull;
  };
  for (const net::Segment& s : t) {
    if (s.bytes < 8) continue;
    const uint8_t* p = base + (dst ? s.dst_offset : s.src_offset);
    for (uint64_t off = 0; off + 8 <= s.bytes; off += 4096) mix(p + off);
    mix(p + s.bytes - 8);
  }
  return h;
}
inline uint64_t HashSrc(const uint8_t* base, const std::vector<net::Segment>& t) {
  return HashSegments(base, t, false);
}
inline uint64_t HashDst(const uint8_t* base, const std::vector<net::Segment>& t) {
  return HashSegments(base, t, true);
}

// A forked helper process, connected to the parent by a socketpair.
class Helper {
 public:
  // Runs fn(socket) in a child process that exits with fn's return value.
  static Result<Helper> Fork(const std::function<int(int sock)>& fn) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return UnavailableError(ErrnoMessage("socketpair"));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      close(sv[0]);
      close(sv[1]);
      return UnavailableError(ErrnoMessage("fork"));
    }
    if (pid == 0) {
      close(sv[0]);
      _exit(fn(sv[1]));
    }
    close(sv[1]);
    return Helper(pid, sv[0]);
  }
  Helper(Helper&& o) noexcept : pid_(o.pid_), sock_(o.sock_) {
    o.pid_ = -1;
    o.sock_ = -1;
  }
  Helper(const Helper&) = delete;
  Helper& operator=(const Helper&) = delete;
  Helper& operator=(Helper&&) = delete;
  ~Helper() { (void)Wait(); }

  int sock() const { return sock_; }

  // Tells the helper the transfers are done, reads the hash of what it
  // received and compares it with `expected`; then waits for it to exit.
  Status FinishAndCompare(uint64_t expected) {
    uint64_t got = 0;
    const bool ok = SendByte(sock_) && RecvAll(sock_, reinterpret_cast<uint8_t*>(&got), sizeof got);
    Status exit = Wait();
    if (!ok) return exit.ok() ? UnavailableError("baseline helper did not answer") : exit;
    if (got != expected) {
      return Status(StatusCode::kDataLoss,
                    "baseline: the bytes that arrived differ from those sent");
    }
    return exit;
  }

  // Waits for the helper to exit; an exit code other than 0 is an error.
  Status Wait() {
    if (sock_ >= 0) {
      close(sock_);
      sock_ = -1;
    }
    if (pid_ <= 0) return Status::Ok();
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
    return UnavailableError("baseline helper failed (status " + std::to_string(status) + ")");
  }

 private:
  Helper(pid_t pid, int sock) : pid_(pid), sock_(sock) {}
  pid_t pid_;
  int sock_;
};

// A listening socket on 127.0.0.1, any port.
class Listener {
 public:
  // `backlog`: connections that may wait to be accepted.
  static Result<Listener> Loopback(int backlog = 4) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return UnavailableError(ErrnoMessage("socket"));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, std::max(backlog, 4)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      const Status s = UnavailableError(ErrnoMessage("listen on loopback"));
      close(fd);
      return s;
    }
    return Listener(fd, ntohs(a.sin_port));
  }
  Listener(Listener&& o) noexcept : fd_(o.fd_), port_(o.port_) { o.fd_ = -1; }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  Listener& operator=(Listener&&) = delete;
  ~Listener() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }
  uint16_t port() const { return port_; }

 private:
  Listener(int fd, uint16_t port) : fd_(fd), port_(port) {}
  int fd_;
  uint16_t port_;
};

inline Result<int> ConnectLoopback(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return UnavailableError(ErrnoMessage("socket"));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const Status s = UnavailableError(ErrnoMessage("connect to 127.0.0.1:" + std::to_string(port)));
    close(fd);
    return s;
  }
  const int yes = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  return fd;
}

}  // namespace kvrelay::bench::raw
