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

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "net/byte_codec.h"
#include "net/transport.h"
#include "os/clock.h"


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

// How long the socket waits of one operation may last: each at most
// kStallTimeoutMs (a peer that makes no progress for that long is stalled),
// and none past the operation's deadline (steady clock, MonoNow). The
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
  int CapMs(int limit_ms) const;
  bool Expired() const { return deadline_ != Instant::Never() && MonoNow() >= deadline_; }

  // The error for a socket operation that failed (`what`): kDeadlineExceeded
  // if the deadline has passed — the wait was cut short by it — else
  // kUnavailable (the peer closed, reset or stalled past kStallTimeoutMs).
  Status Failed(const std::string& what) const;

 private:
  Instant deadline_ = Instant::Never();
};

// Host names and numeric addresses (IPv6 with a scope too); no spaces or
// control characters.
bool HostOk(const std::string& host);

struct TcpRegistration {
  std::string host;
  uint16_t port = 0;
  uint64_t total_bytes = 0;
  RegionLayout layout;
};

std::vector<uint8_t> EncodeRegistration(const TcpRegistration& r);

Result<TcpRegistration> DecodeRegistration(std::span<const uint8_t> in);

// Waits for `fd` to be readable (events POLLIN) or writable (POLLOUT):
// forever (timeout_ms < 0) or timeout_ms. False on timeout or error.
bool WaitFor(int fd, short events, int timeout_ms);
bool WaitReadable(int fd, int timeout_ms);

// Receives exactly n bytes. `idle_first` waits forever for the first byte
// (between frames); every other wait is bounded by `bound`.
bool RecvAll(int fd, uint8_t* out, size_t n, bool idle_first, const WaitBound& bound = {});

// Drops the first `done` bytes of iov[0..n) after a partial send or
// receive: whole iovecs are skipped (iov advances, n shrinks), a partial
// one is trimmed.
void ConsumeIov(iovec*& iov, size_t& n, size_t done);

// Receives exactly the bytes of iov[0..n) (modified in place), handling
// partial reads: takes what has arrived without waiting, and waits (bounded
// by `bound`) only when nothing has. Fails once `bound`'s deadline passed.
bool RecvAllV(int fd, iovec* iov, size_t n, const WaitBound& bound = {});

// Sends every byte of iov[0..n) (modified in place), handling partial
// sends: each sendmsg takes as much as the socket buffer holds without
// blocking, and the wait for room is bounded by `bound`. Fails once
// `bound`'s deadline passed. MSG_NOSIGNAL: a closed peer is an error, not a
// SIGPIPE.
bool SendAllV(int fd, iovec* iov, size_t n, const WaitBound& bound = {});

bool SendAll(int fd, const uint8_t* data, size_t n, const WaitBound& bound = {});

// Options of every data stream, both ends: TCP_NODELAY, a 4 MiB send
// buffer (the side that streams a payload), and send/recv timeouts of
// kStallTimeoutMs (a backstop: the helpers above wait in poll, bounded by
// their WaitBound, and never block in send or recv).
void SetStreamOptions(int fd);

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
void EncodeFrameHead(uint32_t magic, TransferId transfer, std::span<const Segment> frame,
                     uint64_t frame_bytes, uint8_t (&header)[kHeaderBytes],
                     std::vector<uint8_t>& table);

// Sends a frame's header and table (EncodeFrameHead) in one sendmsg.
bool SendFrameHead(int fd, uint32_t magic, TransferId transfer, std::span<const Segment> frame,
                   uint64_t frame_bytes, std::vector<uint8_t>& table,
                   const WaitBound& bound = {});

// A reply: u32 magic | u32 status (kReplyMagic after a write frame or a
// read's payload, kReadHeadMagic before a read's payload).
bool SendReply(int fd, uint32_t magic, uint32_t status);

// Turns a reply received whole into a Status: refused →
// kFailedPrecondition, malformed → kInvalidArgument (the stream is still in
// step after either), a wrong magic or an unknown status → kUnavailable.
// `what` names the operation ("write", "read") in messages.
Status ParseReply(const uint8_t (&reply)[kReplyBytes], uint32_t magic, TransferId transfer,
                  const char* what);

// Receives a reply with `magic` (ParseReply); no reply in time →
// kDeadlineExceeded or kUnavailable (see WaitBound::Failed).
Status RecvReply(int fd, uint32_t magic, TransferId transfer, const char* what,
                 const WaitBound& bound = {});

}  // namespace kvrelay::net::tcp
