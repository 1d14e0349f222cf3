// tcp_stream.cc — the tcp transport's wire and socket plumbing (see
// tcp_stream.h).
#include "net/tcp_stream.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace kvrelay::net::tcp {

int WaitBound::CapMs(int limit_ms) const {
  if (deadline_ == Instant::Never()) return limit_ms;
  const int64_t left_ns = (deadline_ - MonoNow()).ns();
  if (left_ns <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(limit_ms, (left_ns + 999'999) / 1'000'000));
}

Status WaitBound::Failed(const std::string& what) const {
  if (Expired()) return DeadlineExceededError(what + ": the deadline passed");
  return UnavailableError(what);
}

bool HostOk(const std::string& host) {
  if (host.empty() || host.size() > kMaxHostBytes) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == ':' || c == '_' || c == '%';
    if (!ok) return false;
  }
  return true;
}

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

bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  while (true) {
    const int r = poll(&p, 1, timeout_ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool WaitReadable(int fd, int timeout_ms) { return WaitFor(fd, POLLIN, timeout_ms); }

bool RecvAll(int fd, uint8_t* out, size_t n, bool idle_first, const WaitBound& bound) {
  size_t got = 0;
  while (got < n) {
    const int ms = idle_first && got == 0 ? -1 : bound.WaitMs();
    if (ms == 0 || !WaitReadable(fd, ms)) return false;
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

void ConsumeIov(iovec*& iov, size_t& n, size_t done) {
  while (n > 0 && done >= iov->iov_len) {
    done -= iov->iov_len;
    ++iov;
    --n;
  }
  if (n > 0) {
    iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + done;
    iov->iov_len -= done;
  }
}

bool RecvAllV(int fd, iovec* iov, size_t n, const WaitBound& bound) {
  while (n > 0) {
    if (bound.Expired()) return false;
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min(n, kIovBatch);
    const ssize_t r = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        const int ms = bound.WaitMs();
        if (ms == 0 || !WaitReadable(fd, ms)) return false;
        continue;
      }
      return false;
    }
    ConsumeIov(iov, n, static_cast<size_t>(r));
  }
  return true;
}

bool SendAllV(int fd, iovec* iov, size_t n, const WaitBound& bound) {
  while (n > 0) {
    if (bound.Expired()) return false;
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min(n, kIovBatch);
    const ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        const int ms = bound.WaitMs();
        if (ms == 0 || !WaitFor(fd, POLLOUT, ms)) return false;  // stalled, or the deadline
        continue;
      }
      return false;
    }
    ConsumeIov(iov, n, static_cast<size_t>(r));
  }
  return true;
}

bool SendAll(int fd, const uint8_t* data, size_t n, const WaitBound& bound) {
  iovec iov{const_cast<uint8_t*>(data), n};
  return SendAllV(fd, &iov, 1, bound);
}

void SetStreamOptions(int fd) {
  const int yes = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSendBufferBytes, sizeof kSendBufferBytes);
  timeval timeout{kStallTimeoutMs / 1000, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
}

void EncodeFrameHead(uint32_t magic, TransferId transfer, std::span<const Segment> frame,
                     uint64_t frame_bytes, uint8_t (&header)[kHeaderBytes],
                     std::vector<uint8_t>& table) {
  const bool remote_is_src = magic == kReadMagic;
  PutLe(header, magic, 4);
  PutLe(header + 4, kFrameVersion, 2);
  PutLe(header + 6, 0, 2);
  PutLe(header + 8, transfer.hi, 8);
  PutLe(header + 16, transfer.lo, 8);
  PutLe(header + 24, frame.size(), 4);
  PutLe(header + 28, frame_bytes, 8);
  table.resize(frame.size() * kTableEntryBytes);
  for (size_t k = 0; k < frame.size(); ++k) {
    uint8_t* e = table.data() + k * kTableEntryBytes;
    PutLe(e, remote_is_src ? frame[k].src_offset : frame[k].dst_offset, 8);
    PutLe(e + 8, frame[k].bytes, 8);
  }
}

bool SendFrameHead(int fd, uint32_t magic, TransferId transfer, std::span<const Segment> frame,
                   uint64_t frame_bytes, std::vector<uint8_t>& table, const WaitBound& bound) {
  uint8_t header[kHeaderBytes];
  EncodeFrameHead(magic, transfer, frame, frame_bytes, header, table);
  iovec head[2] = {{header, sizeof header}, {table.data(), table.size()}};
  return SendAllV(fd, head, 2, bound);
}

bool SendReply(int fd, uint32_t magic, uint32_t status) {
  uint8_t reply[kReplyBytes];
  PutLe(reply, magic, 4);
  PutLe(reply + 4, status, 4);
  return SendAll(fd, reply, sizeof reply);
}

Status ParseReply(const uint8_t (&reply)[kReplyBytes], uint32_t magic, TransferId transfer,
                  const char* what) {
  if (GetLe(reply, 4) != magic) return UnavailableError(std::string("tcp ") + what + ": bad reply magic");
  switch (GetLe(reply + 4, 4)) {
    case kReplyOk:
      return Status::Ok();
    case kReplyRefused:
      return FailedPreconditionError(std::string("tcp: the peer refused the ") + what +
                                     " (block not granted to " + transfer.ToString() +
                                     " or outside the region)");
    case kReplyMalformed:
      return InvalidArgumentError(std::string("tcp ") + what + ": the peer rejected the segment table");
    default:
      return UnavailableError(std::string("tcp ") + what + ": unknown reply status");
  }
}

Status RecvReply(int fd, uint32_t magic, TransferId transfer, const char* what,
                 const WaitBound& bound) {
  uint8_t reply[kReplyBytes];
  if (!RecvAll(fd, reply, sizeof reply, false, bound)) {
    return bound.Failed(std::string("tcp ") + what + ": no reply (peer closed or stalled)");
  }
  return ParseReply(reply, magic, transfer, what);
}

}  // namespace kvrelay::net::tcp
