// tcp_region.cc — TcpRegion: a rank's KV memory on the tcp transport and
// its receiver (see tcp_region.h).
#include "net/tcp_region.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <system_error>
#include <utility>

#include "base/check.h"
#include "os/errno_message.h"

namespace kvrelay::net::tcp {

TcpRegion::TcpRegion(uint8_t* base, const RegionLayout& layout,
                     std::shared_ptr<TransportStats> stats)
    : base_(base),
      layout_(layout),
      grants_(layout.num_blocks),
      read_grants_(layout.num_blocks),
      stats_(std::move(stats)) {}

TcpRegion::~TcpRegion() {
  if (accept_thread_.joinable()) {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    const uint64_t one = 1;
    // An eventfd write of 1 cannot fail short of a bug; the join below
    // would hang if it did, so check it.
    KV_CHECK_EQ(write(wake_fd_, &one, sizeof one), static_cast<ssize_t>(sizeof one));
    accept_thread_.join();
  }
  {
    MutexLock lock(&mu_);
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

Status TcpRegion::Start(const std::string& host) {
  if (!HostOk(host)) return InvalidArgumentError("tcp: bad listen_host '" + host + "'");
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return UnavailableError(ErrnoMessage("eventfd"));
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
      last_error = ErrnoMessage("socket");
      continue;
    }
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      last_error = ErrnoMessage("bind/listen");
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
    return UnavailableError(ErrnoMessage("getsockname"));
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

void TcpRegion::AcceptLoop() {
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
    // Send timeout and buffer too: a read streams a payload to a peer
    // that may stall.
    SetStreamOptions(fd);
    MutexLock lock(&mu_);
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

void TcpRegion::ReapLocked() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (it->done) {
      it->thread.join();  // it has set done and only returns now
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpRegion::Serve(Conn& c, int fd) {
  std::vector<uint8_t> table;
  std::vector<FrameSegment> segments;
  std::vector<uint8_t> scratch;
  while (ServeFrame(fd, table, segments, scratch)) {
  }
  MutexLock lock(&mu_);
  close(fd);
  c.fd = -1;
  c.done = true;
}

bool TcpRegion::Discard(int fd, uint64_t n, std::vector<uint8_t>& scratch) {
  if (scratch.empty()) scratch.resize(64 << 10);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, scratch.size()));
    if (!RecvAll(fd, scratch.data(), chunk, false)) return false;
    n -= chunk;
  }
  return true;
}

template <typename Table>
bool TcpRegion::Granted(const Table& table, TransferId transfer, uint64_t offset,
                        uint64_t bytes) const {
  const uint64_t plane_bytes = layout_.num_blocks * layout_.block_stride_bytes;
  const uint64_t last = offset + bytes - 1;
  const uint32_t first_block = layout_.BlockOf(offset);
  const uint32_t last_block = layout_.BlockOf(last);
  const uint64_t first_plane = offset / plane_bytes;
  const uint64_t last_plane = last / plane_bytes;
  if (first_plane == last_plane) return table.Allows(transfer, first_block, last_block);
  // Spans planes: the tail of the first, all of any in between, the head
  // of the last.
  const uint32_t end_block = layout_.num_blocks - 1;
  if (!table.Allows(transfer, first_block, end_block)) return false;
  if (last_plane - first_plane >= 2 && !table.Allows(transfer, 0, end_block)) return false;
  return table.Allows(transfer, 0, last_block);
}

template <typename Table>
bool TcpRegion::AllGranted(const Table& table, TransferId transfer,
                           const std::vector<FrameSegment>& segments) const {
  for (const FrameSegment& s : segments) {
    if (s.bytes > 0 && !Granted(table, transfer, s.offset, s.bytes)) return false;
  }
  return true;
}

bool TcpRegion::ServeFrame(int fd, std::vector<uint8_t>& table,
                           std::vector<FrameSegment>& segments, std::vector<uint8_t>& scratch) {
  uint8_t header[kHeaderBytes];
  if (!RecvAll(fd, header, sizeof header, true)) return false;
  const uint32_t magic = static_cast<uint32_t>(GetLe(header, 4));
  const uint16_t version = static_cast<uint16_t>(GetLe(header + 4, 2));
  const uint16_t flags = static_cast<uint16_t>(GetLe(header + 6, 2));
  const TransferId transfer{GetLe(header + 8, 8), GetLe(header + 16, 8)};
  const uint32_t n = static_cast<uint32_t>(GetLe(header + 24, 4));
  const uint64_t total = GetLe(header + 28, 8);
  if ((magic != kFrameMagic && magic != kReadMagic) || version != kFrameVersion ||
      flags != 0 || n > kMaxFrameSegments || total > kMaxFrameBytes) {
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
    if (s.offset > region_bytes || s.bytes > region_bytes - s.offset) in_region = false;
    segments.push_back(s);
  }
  const bool malformed = !sum_ok || sum != total;
  if (magic == kReadMagic) return ServeRead(fd, transfer, segments, total, malformed, in_region);
  if (malformed) {
    stats_->frames_malformed.fetch_add(1, std::memory_order_relaxed);
    return Discard(fd, total, scratch) && SendReply(fd, kReplyMagic, kReplyMalformed);
  }
  if (!in_region || !AllGranted(grants_, transfer, segments)) {
    stats_->writes_refused.fetch_add(1, std::memory_order_relaxed);
    return Discard(fd, total, scratch) && SendReply(fd, kReplyMagic, kReplyRefused);
  }
  // Straight into the region, a batch of segments per recvmsg.
  if (!IoSegments(fd, base_, std::span<const FrameSegment>(segments),
                  [](const FrameSegment& s) { return s.offset; }, RecvAllV)) {
    return false;
  }
  // Release: a thread that sees the count sees the bytes (the writer's
  // reply is causal too, but through another process tools cannot see).
  stats_->bytes_received.fetch_add(total, std::memory_order_release);
  // Revoked while the payload was arriving: the bytes landed, but the
  // writer must not count the write as done.
  if (!AllGranted(grants_, transfer, segments)) {
    stats_->writes_refused.fetch_add(1, std::memory_order_relaxed);
    return SendReply(fd, kReplyMagic, kReplyRefused);
  }
  return SendReply(fd, kReplyMagic, kReplyOk);
}

bool TcpRegion::ServeRead(int fd, TransferId transfer,
                          const std::vector<FrameSegment>& segments, uint64_t total,
                          bool malformed, bool in_region) {
  if (malformed) {
    stats_->frames_malformed.fetch_add(1, std::memory_order_relaxed);
    return SendReply(fd, kReadHeadMagic, kReplyMalformed);
  }
  if (!in_region || !AllGranted(read_grants_, transfer, segments)) {
    stats_->reads_refused.fetch_add(1, std::memory_order_relaxed);
    return SendReply(fd, kReadHeadMagic, kReplyRefused);
  }
  if (!SendReply(fd, kReadHeadMagic, kReplyOk) ||
      !IoSegments(fd, base_, std::span<const FrameSegment>(segments),
                  [](const FrameSegment& s) { return s.offset; }, SendAllV)) {
    return false;  // the reader went away or stalled past kStallTimeoutMs
  }
  stats_->bytes_served.fetch_add(total, std::memory_order_relaxed);
  // Revoked while the bytes were going out: they may be of blocks P
  // already reuses, so the reader must not count the read as done.
  if (!AllGranted(read_grants_, transfer, segments)) {
    stats_->reads_refused.fetch_add(1, std::memory_order_relaxed);
    return SendReply(fd, kReplyMagic, kReplyRefused);
  }
  return SendReply(fd, kReplyMagic, kReplyOk);
}

}  // namespace kvrelay::net::tcp
