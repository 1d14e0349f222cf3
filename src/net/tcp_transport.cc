// tcp_transport.cc — the tcp transport: our own framed stream. The region's
// owner runs a receiver that writes arriving bytes straight into its region,
// but only into blocks its GrantTable grants to the frame's transfer.
//
// TcpRegion: owned by whoever called CreateRegion (the rank's runtime).
// Holds the KV (anonymous mmap, zero-filled) and the receiver: a listening
// socket on options.listen_host at an ephemeral port, one accept thread and
// one thread per accepted connection (at most kMaxConnections live; more
// are closed at once). The destructor stops everything: wakes the accept
// thread through an eventfd and joins it, shutdown()s every live
// connection and joins its thread; no thread outlives the region.
//
// Frame (writer → receiver, little-endian):
//   header  u32 magic 'KVTF' | u16 version | u16 flags (0) | u64 transfer.hi
//           | u64 transfer.lo | u32 n_segments | u64 total_bytes
//   table   n_segments × { u64 dst_offset | u64 bytes }
//   payload total_bytes: the segments' bytes in table order
// Reply (receiver → writer): u32 magic 'KVTR' | u32 status
//   0 ok (every byte is in the region), 1 refused (a segment outside the
//   region or on a block not granted to the transfer; nothing written, the
//   payload discarded), 2 malformed table (sum of segment bytes differs
//   from total_bytes; payload discarded).
// A header with a bad magic, version, flags or over the limits
// (kMaxFrameSegments, kMaxFrameBytes) closes the connection. All count as
// writes_refused / frames_malformed. A receiver waits forever for the first
// byte of a frame but at most kStallTimeoutMs for each later byte, so a
// stalled peer cannot hold a connection slot mid-frame forever.
//
// Grants are checked when a frame's table arrives, before any byte of it is
// written. A revoke that lands while a granted frame's payload is being
// received does not stop that frame: the bytes still land, then the frame
// is re-checked and answered "refused" so the writer does not report
// success. The connector must therefore not hand a revoked block to new
// KV while a write to it may be mid-frame (today: D frees a load's blocks
// only after the load ends; a frame in flight to them is bounded by the
// stall timeout).
//
// TcpTarget: owned by the writer, one per remote region. A pool of at most
// options.tcp_streams connections, opened lazily (TCP_NODELAY, 4 MiB
// SO_SNDBUF, send/recv timeouts of kStallTimeoutMs). Write takes an idle
// connection or opens one (waiting at most kStreamWaitMs when all are
// busy), sends the segments as frames of at most kMaxFrameSegments
// segments and kMaxFrameBytes bytes (splitting larger ones), header and
// table in one sendmsg, payload with sendmsg over iovecs pointing into the
// local region (no copy), and waits for each frame's reply. Any socket
// error closes that connection and returns kUnavailable; a refused frame
// returns kFailedPrecondition and keeps the connection.
//
// Registration bytes (little-endian): u32 magic 'KVTC' | u16 version (1) |
// u16 host length | host | u16 port | u64 total bytes | u64 planes |
// u32 num_blocks | u64 block_stride_bytes. The host is listen_host as
// given: it must be an address the writers can reach.
//
// Stats live in a shared_ptr so Regions and Targets may outlive the
// Transport. Writer side: writes_ok/failed, bytes_written; receiver side:
// bytes_received, writes_refused, frames_malformed.
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
#include "net/transport.h"

namespace kvrelay::net {
namespace {

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

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

void PutLe(uint8_t* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLe(const uint8_t* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{in[i]} << (8 * i);
  return v;
}
void AppendLe(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Reads little-endian fields; any read past the end sets !ok() for good.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool ok() const { return ok_; }
  bool AtEnd() const { return pos_ == in_.size(); }
  uint64_t Get(int bytes) {
    if (!ok_ || in_.size() - pos_ < static_cast<size_t>(bytes)) {
      ok_ = false;
      return 0;
    }
    const uint64_t v = GetLe(in_.data() + pos_, bytes);
    pos_ += bytes;
    return v;
  }
  std::string GetString(size_t n) {
    if (!ok_ || in_.size() - pos_ < n) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// planes × num_blocks × stride; false on zero or overflow.
bool LayoutBytes(const RegionLayout& layout, uint64_t* bytes) {
  if (layout.planes == 0 || layout.num_blocks == 0 || layout.block_stride_bytes == 0) {
    return false;
  }
  uint64_t blocks = 0;
  if (__builtin_mul_overflow(layout.planes, uint64_t{layout.num_blocks}, &blocks)) return false;
  if (__builtin_mul_overflow(blocks, layout.block_stride_bytes, bytes)) return false;
  return *bytes <= static_cast<uint64_t>(SIZE_MAX / 2);
}

// Host names and numeric addresses (IPv6 with a scope too); no spaces or
// control characters.
bool HostOk(const std::string& host) {
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

std::vector<uint8_t> EncodeRegistration(const TcpRegistration& r) {
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

Result<TcpRegistration> DecodeRegistration(std::span<const uint8_t> in) {
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
bool WaitReadable(int fd, int timeout_ms) {
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
bool RecvAll(int fd, uint8_t* out, size_t n, bool idle_first) {
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
bool RecvAllV(int fd, iovec* iov, size_t n) {
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
bool SendAllV(int fd, iovec* iov, size_t n) {
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

bool SendAll(int fd, const uint8_t* data, size_t n) {
  iovec iov{const_cast<uint8_t*>(data), n};
  return SendAllV(fd, &iov, 1);
}

class TcpRegion final : public Region {
 public:
  TcpRegion(uint8_t* base, const RegionLayout& layout, std::shared_ptr<TransportStats> stats)
      : base_(base), layout_(layout), grants_(layout.num_blocks), stats_(std::move(stats)) {}

  ~TcpRegion() override {
    if (accept_thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
      }
      const uint64_t one = 1;
      // An eventfd write of 1 cannot fail short of a bug; the join below
      // would hang if it did, so check it.
      KV_CHECK_EQ(write(wake_fd_, &one, sizeof one), static_cast<ssize_t>(sizeof one));
      accept_thread_.join();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Conn& c : conns_) {
        if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);
      }
    }
    // The accept thread is gone, so conns_ no longer grows; each Serve
    // thread touches only its own entry's fd/done fields, under mu_.
    for (Conn& c : conns_) c.thread.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    munmap(base_, layout_.bytes());
  }
  TcpRegion(const TcpRegion&) = delete;
  TcpRegion& operator=(const TcpRegion&) = delete;

  // Binds the listener and starts the accept thread.
  Status Start(const std::string& host) {
    if (!HostOk(host)) return InvalidArgumentError("tcp: bad listen_host '" + host + "'");
    wake_fd_ = eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) return UnavailableError(Errno("eventfd"));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* addrs = nullptr;
    if (const int err = getaddrinfo(host.c_str(), "0", &hints, &addrs); err != 0) {
      return UnavailableError("tcp: resolving listen_host '" + host + "': " + gai_strerror(err));
    }
    std::string last_error = "no address";
    for (addrinfo* a = addrs; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_error = Errno("socket");
        continue;
      }
      const int yes = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        last_error = Errno("bind/listen");
        close(fd);
        continue;
      }
      listen_fd_ = fd;
    }
    freeaddrinfo(addrs);
    if (listen_fd_ < 0) return UnavailableError("tcp: listening on " + host + ": " + last_error);
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return UnavailableError(Errno("getsockname"));
    }
    const uint16_t port = ntohs(addr.ss_family == AF_INET6
                                    ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                    : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    registration_ = EncodeRegistration({host, port, layout_.bytes(), layout_});
    try {
      accept_thread_ = std::thread([this] { AcceptLoop(); });
    } catch (const std::system_error& e) {
      return ResourceExhaustedError(std::string("tcp: starting the accept thread: ") + e.what());
    }
    return Status::Ok();
  }

  std::span<uint8_t> bytes() override { return {base_, layout_.bytes()}; }
  const RegionLayout& layout() const override { return layout_; }
  const std::vector<uint8_t>& registration() const override { return registration_; }
  GrantTable& grants() override { return grants_; }

 private:
  struct Conn {
    int fd = -1;  // -1 once the Serve thread closed it (under mu_)
    bool done = false;
    std::thread thread;
  };
  struct FrameSegment {
    uint64_t dst_offset;
    uint64_t bytes;
  };

  void AcceptLoop() {
    while (true) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        // EINTR, or ENOMEM: back off and retry.
        if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      if (fds[1].revents != 0) return;
      if (fds[0].revents == 0) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of fds or memory: back off (woken early by the destructor)
        // rather than spin on a listener that stays readable.
        if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
          pollfd wake{wake_fd_, POLLIN, 0};
          if (poll(&wake, 1, 100) > 0) return;
        }
        continue;
      }
      const int yes = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        close(fd);
        return;
      }
      ReapLocked();
      if (conns_.size() >= kMaxConnections) {
        close(fd);  // over the bound: refused
        continue;
      }
      Conn& c = conns_.emplace_back();
      c.fd = fd;
      try {
        c.thread = std::thread([this, &c, fd] { Serve(c, fd); });
      } catch (const std::system_error&) {
        close(fd);
        conns_.pop_back();
      }
    }
  }

  // Joins the threads of finished connections. REQUIRES: mu_ held.
  void ReapLocked() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->done) {
        it->thread.join();  // it has set done and only returns now
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Serve(Conn& c, int fd) {
    std::vector<uint8_t> table;
    std::vector<FrameSegment> segments;
    std::vector<uint8_t> scratch;
    while (ServeFrame(fd, table, segments, scratch)) {
    }
    std::lock_guard<std::mutex> lock(mu_);
    close(fd);
    c.fd = -1;
    c.done = true;
  }

  bool Reply(int fd, uint32_t status) {
    uint8_t reply[kReplyBytes];
    PutLe(reply, kReplyMagic, 4);
    PutLe(reply + 4, status, 4);
    return SendAll(fd, reply, sizeof reply);
  }

  bool Discard(int fd, uint64_t n, std::vector<uint8_t>& scratch) {
    if (scratch.empty()) scratch.resize(64 << 10);
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, scratch.size()));
      if (!RecvAll(fd, scratch.data(), chunk, false)) return false;
      n -= chunk;
    }
    return true;
  }

  // True if every block of every plane that [offset, offset+bytes) touches
  // is granted to `transfer`. REQUIRES: bytes > 0, inside the region.
  bool Granted(TransferId transfer, uint64_t offset, uint64_t bytes) const {
    const uint64_t plane_bytes = layout_.num_blocks * layout_.block_stride_bytes;
    const uint64_t last = offset + bytes - 1;
    const uint32_t first_block = layout_.BlockOf(offset);
    const uint32_t last_block = layout_.BlockOf(last);
    const uint64_t first_plane = offset / plane_bytes;
    const uint64_t last_plane = last / plane_bytes;
    if (first_plane == last_plane) return grants_.Allows(transfer, first_block, last_block);
    // Spans planes: the tail of the first, all of any in between, the head
    // of the last.
    const uint32_t end_block = layout_.num_blocks - 1;
    if (!grants_.Allows(transfer, first_block, end_block)) return false;
    if (last_plane - first_plane >= 2 && !grants_.Allows(transfer, 0, end_block)) return false;
    return grants_.Allows(transfer, 0, last_block);
  }

  bool AllGranted(TransferId transfer, const std::vector<FrameSegment>& segments) const {
    for (const FrameSegment& s : segments) {
      if (s.bytes > 0 && !Granted(transfer, s.dst_offset, s.bytes)) return false;
    }
    return true;
  }

  // One frame; false when the connection must close.
  bool ServeFrame(int fd, std::vector<uint8_t>& table, std::vector<FrameSegment>& segments,
                  std::vector<uint8_t>& scratch) {
    uint8_t header[kHeaderBytes];
    if (!RecvAll(fd, header, sizeof header, true)) return false;
    const uint32_t magic = static_cast<uint32_t>(GetLe(header, 4));
    const uint16_t version = static_cast<uint16_t>(GetLe(header + 4, 2));
    const uint16_t flags = static_cast<uint16_t>(GetLe(header + 6, 2));
    const TransferId transfer{GetLe(header + 8, 8), GetLe(header + 16, 8)};
    const uint32_t n = static_cast<uint32_t>(GetLe(header + 24, 4));
    const uint64_t total = GetLe(header + 28, 8);
    if (magic != kFrameMagic || version != kFrameVersion || flags != 0 ||
        n > kMaxFrameSegments || total > kMaxFrameBytes) {
      stats_->frames_malformed.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    table.resize(size_t{n} * kTableEntryBytes);
    if (!RecvAll(fd, table.data(), table.size(), false)) return false;
    segments.clear();
    segments.reserve(n);
    const uint64_t region_bytes = layout_.bytes();
    uint64_t sum = 0;
    bool sum_ok = true;
    bool in_region = true;
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t* e = table.data() + size_t{i} * kTableEntryBytes;
      const FrameSegment s{GetLe(e, 8), GetLe(e + 8, 8)};
      if (__builtin_add_overflow(sum, s.bytes, &sum)) sum_ok = false;
      if (s.dst_offset > region_bytes || s.bytes > region_bytes - s.dst_offset) in_region = false;
      segments.push_back(s);
    }
    if (!sum_ok || sum != total) {
      stats_->frames_malformed.fetch_add(1, std::memory_order_relaxed);
      return Discard(fd, total, scratch) && Reply(fd, kReplyMalformed);
    }
    if (!in_region || !AllGranted(transfer, segments)) {
      stats_->writes_refused.fetch_add(1, std::memory_order_relaxed);
      return Discard(fd, total, scratch) && Reply(fd, kReplyRefused);
    }
    // Straight into the region, a batch of segments per recvmsg.
    iovec iov[kIovBatch];
    for (size_t k = 0; k < segments.size(); k += kIovBatch) {
      const size_t batch = std::min(kIovBatch, segments.size() - k);
      for (size_t j = 0; j < batch; ++j) {
        iov[j].iov_base = base_ + segments[k + j].dst_offset;
        iov[j].iov_len = segments[k + j].bytes;
      }
      if (!RecvAllV(fd, iov, batch)) return false;
    }
    // Release: a thread that sees the count sees the bytes (the writer's
    // reply is causal too, but through another process tools cannot see).
    stats_->bytes_received.fetch_add(total, std::memory_order_release);
    // Revoked while the payload was arriving: the bytes landed, but the
    // writer must not count the write as done.
    if (!AllGranted(transfer, segments)) {
      stats_->writes_refused.fetch_add(1, std::memory_order_relaxed);
      return Reply(fd, kReplyRefused);
    }
    return Reply(fd, kReplyOk);
  }

  uint8_t* const base_;
  const RegionLayout layout_;
  std::vector<uint8_t> registration_;  // set by Start, then constant
  GrantTable grants_;
  const std::shared_ptr<TransportStats> stats_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread accept_thread_;

  std::mutex mu_;
  bool stopping_ = false;   // guarded by mu_
  std::list<Conn> conns_;   // guarded by mu_ (list: entries stay put)
};

class TcpTarget final : public Target {
 public:
  TcpTarget(Region* local, TcpRegistration remote, uint32_t max_streams,
            std::shared_ptr<TransportStats> stats)
      : local_(local),
        remote_(std::move(remote)),
        max_streams_(std::max<uint32_t>(max_streams, 1)),
        stats_(std::move(stats)) {}
  ~TcpTarget() override {
    std::lock_guard<std::mutex> lock(mu_);
    KV_CHECK_MSG(open_ == idle_.size(), "TcpTarget destroyed during a Write");
    for (int fd : idle_) close(fd);
  }
  TcpTarget(const TcpTarget&) = delete;
  TcpTarget& operator=(const TcpTarget&) = delete;

  Status Write(TransferId transfer, std::span<const Segment> segments) override {
    const std::span<uint8_t> local = local_->bytes();
    uint64_t total = 0;
    for (const Segment& s : segments) {
      if (s.src_offset > local.size() || s.bytes > local.size() - s.src_offset) {
        stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
        return Status(StatusCode::kOutOfRange,
                      "tcp write: source segment [" + std::to_string(s.src_offset) + ", " +
                          std::to_string(s.bytes) + " bytes) outside the local region");
      }
      total += s.bytes;
    }
    Result<int> fd = Acquire();
    if (!fd.ok()) {
      stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
      return fd.status();
    }
    const Status status = SendFrames(*fd, transfer, segments, local);
    // A refused or malformed frame was consumed whole by the receiver: the
    // stream is still in sync and the connection can be reused.
    Release(*fd, status.ok() || status.code() == StatusCode::kFailedPrecondition ||
                     status.code() == StatusCode::kInvalidArgument);
    if (status.ok()) {
      stats_->writes_ok.fetch_add(1, std::memory_order_relaxed);
      stats_->bytes_written.fetch_add(total, std::memory_order_relaxed);
    } else {
      stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
    }
    return status;
  }

 private:
  Result<int> Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (!cv_.wait_for(lock, kStreamWait,
                        [&] { return !idle_.empty() || open_ < max_streams_; })) {
        return ResourceExhaustedError("tcp: all " + std::to_string(max_streams_) +
                                      " streams busy");
      }
      if (idle_.empty()) break;
      const int fd = idle_.back();
      idle_.pop_back();
      // An idle stream has nothing to read; readable means the receiver
      // closed it (region gone, receiver restarted): drop it, try again.
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 0) == 0) return fd;
      close(fd);
      --open_;
    }
    ++open_;
    lock.unlock();
    Result<int> fd = Connect();
    if (!fd.ok()) {
      lock.lock();
      --open_;
      cv_.notify_one();
    }
    return fd;
  }

  void Release(int fd, bool reusable) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reusable) {
      idle_.push_back(fd);
    } else {
      close(fd);
      --open_;
    }
    cv_.notify_one();
  }

  Result<int> Connect() {
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
        r = poll(&p, 1, kConnectTimeoutMs);
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
      return UnavailableError("tcp: connecting to " + remote_.host + ":" + port + ": " +
                              last_error);
    }
    const int flags = fcntl(connected, F_GETFL);
    fcntl(connected, F_SETFL, flags & ~O_NONBLOCK);
    const int yes = 1;
    setsockopt(connected, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    setsockopt(connected, SOL_SOCKET, SO_SNDBUF, &kSendBufferBytes, sizeof kSendBufferBytes);
    timeval timeout{kStallTimeoutMs / 1000, 0};
    setsockopt(connected, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    setsockopt(connected, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    return connected;
  }

  // Sends `segments` as frames within the limits; stops at the first
  // frame that is not acknowledged OK.
  Status SendFrames(int fd, TransferId transfer, std::span<const Segment> segments,
                    std::span<uint8_t> local) {
    std::vector<Segment> frame;
    frame.reserve(std::min<size_t>(segments.size(), kMaxFrameSegments));
    std::vector<uint8_t> table;  // this call's: Writes run concurrently
    size_t i = 0;
    uint64_t done = 0;  // bytes of segments[i] already framed
    while (i < segments.size()) {
      frame.clear();
      uint64_t frame_bytes = 0;
      while (i < segments.size() && frame.size() < kMaxFrameSegments &&
             frame_bytes < kMaxFrameBytes) {
        const Segment& s = segments[i];
        const uint64_t piece = std::min(s.bytes - done, kMaxFrameBytes - frame_bytes);
        if (piece > 0) {
          frame.push_back(Segment{s.src_offset + done, s.dst_offset + done, piece});
          frame_bytes += piece;
        }
        done += piece;
        if (done == s.bytes) {
          ++i;
          done = 0;
        }
      }
      if (frame.empty()) break;  // only empty segments were left
      const Status status = SendFrame(fd, transfer, frame, frame_bytes, local, table);
      if (!status.ok()) return status;
    }
    return Status::Ok();
  }

  Status SendFrame(int fd, TransferId transfer, std::span<const Segment> frame,
                   uint64_t frame_bytes, std::span<uint8_t> local, std::vector<uint8_t>& table) {
    uint8_t header[kHeaderBytes];
    PutLe(header, kFrameMagic, 4);
    PutLe(header + 4, kFrameVersion, 2);
    PutLe(header + 6, 0, 2);
    PutLe(header + 8, transfer.hi, 8);
    PutLe(header + 16, transfer.lo, 8);
    PutLe(header + 24, frame.size(), 4);
    PutLe(header + 28, frame_bytes, 8);
    table.resize(frame.size() * kTableEntryBytes);
    for (size_t k = 0; k < frame.size(); ++k) {
      PutLe(table.data() + k * kTableEntryBytes, frame[k].dst_offset, 8);
      PutLe(table.data() + k * kTableEntryBytes + 8, frame[k].bytes, 8);
    }
    iovec head[2] = {{header, sizeof header}, {table.data(), table.size()}};
    if (!SendAllV(fd, head, 2)) return UnavailableError(Errno("tcp: sending a frame header"));

    iovec iov[kIovBatch];
    for (size_t k = 0; k < frame.size(); k += kIovBatch) {
      const size_t batch = std::min(kIovBatch, frame.size() - k);
      for (size_t j = 0; j < batch; ++j) {
        iov[j].iov_base = local.data() + frame[k + j].src_offset;
        iov[j].iov_len = frame[k + j].bytes;
      }
      if (!SendAllV(fd, iov, batch)) return UnavailableError(Errno("tcp: sending a payload"));
    }

    uint8_t reply[kReplyBytes];
    size_t got = 0;
    while (got < sizeof reply) {
      const ssize_t r = recv(fd, reply + got, sizeof reply - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
      } else if (r == 0) {
        return UnavailableError("tcp: receiver closed the stream");
      } else if (errno != EINTR) {
        return UnavailableError(Errno("tcp: waiting for the reply"));
      }
    }
    if (GetLe(reply, 4) != kReplyMagic) return UnavailableError("tcp: bad reply magic");
    switch (GetLe(reply + 4, 4)) {
      case kReplyOk:
        return Status::Ok();
      case kReplyRefused:
        return FailedPreconditionError("tcp: receiver refused the write (block not granted to " +
                                       transfer.ToString() + " or outside the region)");
      case kReplyMalformed:
        return InvalidArgumentError("tcp: receiver rejected the segment table");
      default:
        return UnavailableError("tcp: unknown reply status");
    }
  }

  Region* const local_;
  const TcpRegistration remote_;
  const uint32_t max_streams_;
  const std::shared_ptr<TransportStats> stats_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> idle_;  // guarded by mu_
  uint32_t open_ = 0;      // guarded by mu_: idle + in use
};

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportOptions& options)
      : options_(options), stats_(std::make_shared<TransportStats>()) {}

  TransportKind kind() const override { return TransportKind::kTcp; }

  Result<std::unique_ptr<Region>> CreateRegion(const std::string&,
                                               const RegionLayout& layout) override {
    uint64_t bytes = 0;
    if (!LayoutBytes(layout, &bytes)) {
      return InvalidArgumentError("tcp region: empty or oversized layout");
    }
    void* base =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return ResourceExhaustedError(Errno("tcp region: mmap"));
    auto region = std::make_unique<TcpRegion>(static_cast<uint8_t*>(base), layout, stats_);
    if (Status status = region->Start(options_.listen_host); !status.ok()) return status;
    return std::unique_ptr<Region>(std::move(region));
  }

  Result<std::unique_ptr<Target>> Open(std::span<const uint8_t> registration,
                                       Region* local) override {
    KV_CHECK(local != nullptr);
    Result<TcpRegistration> r = DecodeRegistration(registration);
    if (!r.ok()) return r.status();
    return std::unique_ptr<Target>(
        std::make_unique<TcpTarget>(local, std::move(r).value(), options_.tcp_streams, stats_));
  }

  const TransportStats& stats() const override { return *stats_; }

 private:
  const TransportOptions options_;
  const std::shared_ptr<TransportStats> stats_;
};

}  // namespace

Result<std::unique_ptr<Transport>> MakeTcpTransport(const TransportOptions& options) {
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(options));
}

}  // namespace kvrelay::net
