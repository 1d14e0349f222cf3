// tcp_stream.h — the tcp transport's wire and socket plumbing: frame and
// registration constants, the registration codec (bounds-checked), frame
// splitting and head encoding, and EINTR-safe send/recv helpers whose
// every wait is bounded by a WaitBound: the stall timeout, cut short by an
// operation's deadline. Shared by the receiver (tcp_region.h) and the
// writer and reader (tcp_target.h); the frame formats are in
// tcp_transport.cc's header comment and docs/wire.md.
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
constexpr uint32_t kReadMagic = 0x5154564B;   // "KVTQ": a read request's header
constexpr uint32_t kReadHeadMagic = 0x4454564B;  // "KVTD": a read response's head
constexpr size_t kHeaderBytes = 36;
constexpr size_t kTableEntryBytes = 16;
constexpr size_t kReplyBytes = 8;
constexpr uint32_t kMaxFrameSegments = 1u << 16;
constexpr uint64_t kMaxFrameBytes = 1ull << 30;
constexpr size_t kMaxConnections = 64;
constexpr int kStallTimeoutMs = 30'000;
constexpr int kConnectTimeoutMs = 5'000;
constexpr int kStreamWaitMs = 60'000;
constexpr int kSendBufferBytes = 4 << 20;
constexpr size_t kMaxHostBytes = 255;
constexpr size_t kIovBatch = 1024;  // <= IOV_MAX

enum ReplyStatus : uint32_t { kReplyOk = 0, kReplyRefused = 1, kReplyMalformed = 2 };

inline std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// How long the socket waits of one operation may last: each at most
// kStallTimeoutMs (a peer that makes no progress for that long is stalled),
// and none past the operation's deadline (steady clock, SteadyNow). The
// default has no deadline (the receiver's side, and reads).
//
// Thread safety: a value; shared read-only by an operation's stripes.
class WaitBound {
 public:
  WaitBound() = default;
  explicit WaitBound(Instant deadline) : deadline_(deadline) {}

  // Milliseconds the next socket wait may take: min(kStallTimeoutMs, the
  // time to the deadline rounded up); 0 once the deadline has passed (the
  // caller then fails instead of waiting).
  int WaitMs() const { return CapMs(kStallTimeoutMs); }
  // The same for a wait of its own limit (connect, a stream from the pool).
  int CapMs(int limit_ms) const {
    if (deadline_ == Instant::Never()) return limit_ms;
    const int64_t left_ns = (deadline_ - SteadyNow()).ns();
    if (left_ns <= 0) return 0;
    return static_cast<int>(std::min<int64_t>(limit_ms, (left_ns + 999'999) / 1'000'000));
  }
  bool Expired() const { return deadline_ != Instant::Never() && SteadyNow() >= deadline_; }

  // The error for a socket operation that failed (`what`): kDeadlineExceeded
  // if the deadline has passed — the wait was cut short by it — else
  // kUnavailable (the peer closed, reset or stalled past kStallTimeoutMs).
  Status Failed(const std::string& what) const {
    if (Expired()) return DeadlineExceededError(what + ": the deadline passed");
    return UnavailableError(what);
  }

 private:
  Instant deadline_ = Instant::Never();
};

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

// Waits for `fd` to be readable (events POLLIN) or writable (POLLOUT):
// forever (timeout_ms < 0) or timeout_ms. False on timeout or error.
inline bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  while (true) {
    const int r = poll(&p, 1, timeout_ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}
inline bool WaitReadable(int fd, int timeout_ms) { return WaitFor(fd, POLLIN, timeout_ms); }

// Receives exactly n bytes. `idle_first` waits forever for the first byte
// (between frames); every other wait is bounded by `bound`.
inline bool RecvAll(int fd, uint8_t* out, size_t n, bool idle_first, const WaitBound& bound = {}) {
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

// Drops the first `done` bytes of iov[0..n) after a partial send or
// receive: whole iovecs are skipped (iov advances, n shrinks), a partial
// one is trimmed.
inline void ConsumeIov(iovec*& iov, size_t& n, size_t done) {
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

// Receives exactly the bytes of iov[0..n) (modified in place), handling
// partial reads: takes what has arrived without waiting, and waits (bounded
// by `bound`) only when nothing has. Fails once `bound`'s deadline passed.
inline bool RecvAllV(int fd, iovec* iov, size_t n, const WaitBound& bound = {}) {
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

// Sends every byte of iov[0..n) (modified in place), handling partial
// sends: each sendmsg takes as much as the socket buffer holds without
// blocking, and the wait for room is bounded by `bound`. Fails once
// `bound`'s deadline passed. MSG_NOSIGNAL: a closed peer is an error, not a
// SIGPIPE.
inline bool SendAllV(int fd, iovec* iov, size_t n, const WaitBound& bound = {}) {
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

inline bool SendAll(int fd, const uint8_t* data, size_t n, const WaitBound& bound = {}) {
  iovec iov{const_cast<uint8_t*>(data), n};
  return SendAllV(fd, &iov, 1, bound);
}

// Options of every data stream, both ends: TCP_NODELAY, a 4 MiB send
// buffer (the side that streams a payload), and send/recv timeouts of
// kStallTimeoutMs (a backstop: the helpers above wait in poll, bounded by
// their WaitBound, and never block in send or recv).
inline void SetStreamOptions(int fd) {
  const int yes = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kSendBufferBytes, sizeof kSendBufferBytes);
  timeval timeout{kStallTimeoutMs / 1000, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
}

// Moves the bytes of `segments` — each at `base` + offset_of(segment),
// `segment.bytes` long — through `io` (SendAllV or RecvAllV, waits bounded
// by `bound`), a batch of kIovBatch iovecs per call: the payload goes
// straight from or into the region, no copy.
template <typename Seg, typename OffsetOf, typename Io>
bool IoSegments(int fd, uint8_t* base, std::span<const Seg> segments, OffsetOf offset_of, Io io,
                const WaitBound& bound = {}) {
  iovec iov[kIovBatch];
  for (size_t k = 0; k < segments.size(); k += kIovBatch) {
    const size_t batch = std::min(kIovBatch, segments.size() - k);
    for (size_t j = 0; j < batch; ++j) {
      iov[j].iov_base = base + offset_of(segments[k + j]);
      iov[j].iov_len = segments[k + j].bytes;
    }
    if (!io(fd, iov, batch, bound)) return false;
  }
  return true;
}

// Cuts `segments` into frames of at most kMaxFrameSegments segments and
// kMaxFrameBytes bytes (splitting a larger segment, both offsets advanced
// alike) and calls frame_fn(frame, frame_bytes) for each in order; stops at
// the first error. Zero-byte segments are dropped.
template <typename FrameFn>
Status ForEachFrame(std::span<const Segment> segments, FrameFn frame_fn) {
  std::vector<Segment> frame;
  frame.reserve(std::min<size_t>(segments.size(), kMaxFrameSegments));
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
    if (Status status = frame_fn(std::span<const Segment>(frame), frame_bytes); !status.ok()) {
      return status;
    }
  }
  return Status::Ok();
}

// Encodes a frame's header and table: a write frame (kFrameMagic, the
// table names each segment's dst_offset) or a read request (kReadMagic,
// src_offset) — the offsets are always in the remote region. `table` is the
// caller's scratch buffer.
inline void EncodeFrameHead(uint32_t magic, TransferId transfer, std::span<const Segment> frame,
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

// Sends a frame's header and table (EncodeFrameHead) in one sendmsg.
inline bool SendFrameHead(int fd, uint32_t magic, TransferId transfer,
                          std::span<const Segment> frame, uint64_t frame_bytes,
                          std::vector<uint8_t>& table, const WaitBound& bound = {}) {
  uint8_t header[kHeaderBytes];
  EncodeFrameHead(magic, transfer, frame, frame_bytes, header, table);
  iovec head[2] = {{header, sizeof header}, {table.data(), table.size()}};
  return SendAllV(fd, head, 2, bound);
}

// A reply: u32 magic | u32 status (kReplyMagic after a write frame or a
// read's payload, kReadHeadMagic before a read's payload).
inline bool SendReply(int fd, uint32_t magic, uint32_t status) {
  uint8_t reply[kReplyBytes];
  PutLe(reply, magic, 4);
  PutLe(reply + 4, status, 4);
  return SendAll(fd, reply, sizeof reply);
}

// Turns a reply received whole into a Status: refused →
// kFailedPrecondition, malformed → kInvalidArgument (the stream is still in
// step after either), a wrong magic or an unknown status → kUnavailable.
// `what` names the operation ("write", "read") in messages.
inline Status ParseReply(const uint8_t (&reply)[kReplyBytes], uint32_t magic, TransferId transfer,
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

// Receives a reply with `magic` (ParseReply); no reply in time →
// kDeadlineExceeded or kUnavailable (see WaitBound::Failed).
inline Status RecvReply(int fd, uint32_t magic, TransferId transfer, const char* what,
                        const WaitBound& bound = {}) {
  uint8_t reply[kReplyBytes];
  if (!RecvAll(fd, reply, sizeof reply, false, bound)) {
    return bound.Failed(std::string("tcp ") + what + ": no reply (peer closed or stalled)");
  }
  return ParseReply(reply, magic, transfer, what);
}

}  // namespace kvrelay::net::tcp
