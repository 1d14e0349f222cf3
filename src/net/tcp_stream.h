// tcp_stream.h — the tcp transport's wire and socket plumbing: frame and
// registration constants, the registration codec (bounds-checked), and
// blocking, EINTR-safe send/recv helpers with stall bounds. Shared by the
// receiver (tcp_region.h) and the writer (tcp_target.h); the frame format
// is in tcp_transport.cc's header comment and docs/wire.md.
//
// Thread safety: pure functions and values.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "base/check.h"
#include "net/byte_codec.h"
#include "net/transport.h"


namespace kvrelay::net::tcp {

using net::AppendLe;
using net::GetLe;
using net::LayoutBytes;
using net::PutLe;
using net::Reader;


constexpr uint32_t kRegMagic = 0x4354564B;    // "KVTC"
constexpr uint16_t kRegVersion = 1;
constexpr uint32_t kFrameMagic = 0x4654564B;  // "KVTF"
constexpr uint16_t kFrameVersion = 1;
constexpr uint32_t kReplyMagic = 0x5254564B;  // "KVTR"
constexpr size_t kHeaderBytes = 36;
constexpr size_t kTableEntryBytes = 16;
constexpr size_t kReplyBytes = 8;
constexpr uint32_t kMaxFrameSegments = 1u << 16;
constexpr uint64_t kMaxFrameBytes = 1ull << 30;
constexpr size_t kMaxConnections = 64;
constexpr int kStallTimeoutMs = 30'000;
constexpr int kConnectTimeoutMs = 5'000;
constexpr auto kStreamWait = std::chrono::seconds(60);
constexpr int kSendBufferBytes = 4 << 20;
constexpr size_t kMaxHostBytes = 255;
constexpr size_t kIovBatch = 1024;  // <= IOV_MAX

enum ReplyStatus : uint32_t { kReplyOk = 0, kReplyRefused = 1, kReplyMalformed = 2 };

inline std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Host names and numeric addresses (IPv6 with a scope too); no spaces or
// control characters.
inline bool HostOk(const std::string& host) {
  if (host.empty() || host.size() > kMaxHostBytes) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == ':' || c == '_' || c == '%';
    if (!ok) return false;
  }
  return true;
}

struct TcpRegistration {
  std::string host;
  uint16_t port = 0;
  uint64_t total_bytes = 0;
  RegionLayout layout;
};

inline std::vector<uint8_t> EncodeRegistration(const TcpRegistration& r) {
  std::vector<uint8_t> out;
  out.reserve(4 + 2 + 2 + r.host.size() + 2 + 8 + 8 + 4 + 8);
  AppendLe(out, kRegMagic, 4);
  AppendLe(out, kRegVersion, 2);
  AppendLe(out, r.host.size(), 2);
  out.insert(out.end(), r.host.begin(), r.host.end());
  AppendLe(out, r.port, 2);
  AppendLe(out, r.total_bytes, 8);
  AppendLe(out, r.layout.planes, 8);
  AppendLe(out, r.layout.num_blocks, 4);
  AppendLe(out, r.layout.block_stride_bytes, 8);
  return out;
}

inline Result<TcpRegistration> DecodeRegistration(std::span<const uint8_t> in) {
  Reader reader(in);
  if (reader.Get(4) != kRegMagic || !reader.ok()) {
    return InvalidArgumentError("tcp registration: bad magic");
  }
  if (reader.Get(2) != kRegVersion || !reader.ok()) {
    return InvalidArgumentError("tcp registration: unsupported version");
  }
  TcpRegistration r;
  const size_t host_len = reader.Get(2);
  r.host = reader.GetString(host_len);
  r.port = static_cast<uint16_t>(reader.Get(2));
  r.total_bytes = reader.Get(8);
  r.layout.planes = reader.Get(8);
  r.layout.num_blocks = static_cast<uint32_t>(reader.Get(4));
  r.layout.block_stride_bytes = reader.Get(8);
  if (!reader.ok() || !reader.AtEnd()) {
    return InvalidArgumentError("tcp registration: truncated or trailing bytes");
  }
  if (!HostOk(r.host)) return InvalidArgumentError("tcp registration: bad host");
  if (r.port == 0) return InvalidArgumentError("tcp registration: port 0");
  uint64_t bytes = 0;
  if (!LayoutBytes(r.layout, &bytes) || bytes != r.total_bytes) {
    return InvalidArgumentError("tcp registration: inconsistent layout");
  }
  return r;
}

// Waits for `fd` to be readable: forever (timeout_ms < 0) or timeout_ms.
// False on timeout or error.
inline bool WaitReadable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  while (true) {
    const int r = poll(&p, 1, timeout_ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Receives exactly n bytes. `idle_first` waits forever for the first byte
// (between frames); every other wait is bounded by kStallTimeoutMs.
inline bool RecvAll(int fd, uint8_t* out, size_t n, bool idle_first) {
  size_t got = 0;
  while (got < n) {
    if (!WaitReadable(fd, idle_first && got == 0 ? -1 : kStallTimeoutMs)) return false;
    const ssize_t r = recv(fd, out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0) {
      return false;
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return false;
    }
  }
  return true;
}

// Receives exactly the bytes of iov[0..n) (modified in place), handling
// partial reads; every wait is bounded by kStallTimeoutMs.
inline bool RecvAllV(int fd, iovec* iov, size_t n) {
  while (n > 0) {
    if (!WaitReadable(fd, kStallTimeoutMs)) return false;
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min(n, kIovBatch);
    const ssize_t r = recvmsg(fd, &msg, 0);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return false;
    }
    size_t got = static_cast<size_t>(r);
    while (n > 0 && got >= iov->iov_len) {
      got -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + got;
      iov->iov_len -= got;
    }
  }
  return true;
}

// Sends every byte of iov[0..n) (modified in place), handling partial
// sends. MSG_NOSIGNAL: a closed peer is an error, not a SIGPIPE.
inline bool SendAllV(int fd, iovec* iov, size_t n) {
  while (n > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min(n, kIovBatch);
    const ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;  // EAGAIN here is SO_SNDTIMEO expiring: a stalled peer.
    }
    size_t sent = static_cast<size_t>(r);
    while (n > 0 && sent >= iov->iov_len) {
      sent -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + sent;
      iov->iov_len -= sent;
    }
  }
  return true;
}

inline bool SendAll(int fd, const uint8_t* data, size_t n) {
  iovec iov{const_cast<uint8_t*>(data), n};
  return SendAllV(fd, &iov, 1);
}


}  // namespace kvrelay::net::tcp
