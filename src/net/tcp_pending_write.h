// tcp_pending_write.h — TcpPendingWrite: one tcp write frame driven by its
// caller's event loop instead of a blocked thread (net::PendingWrite).
//
// Why: a small write handed to a worker thread costs two thread wake-ups
// on P (the hand-off and the outcome's way back to the rank), about 40 µs
// of a 180 µs one-block pull on a 2-vCPU host (docs/performance.md). The
// rank thread can send a small frame itself without waiting — the socket
// buffer (4 MiB) takes it whole — and wait for the receiver's reply in its
// own poll, beside its control sockets.
//
// The bytes on the wire are those of TcpRemote::Write's one-frame case:
// header and table in one sendmsg, then the payload straight from the
// local region, then the receiver's 8-byte reply. States, in order:
// kHead → kPayload (wants_write: the socket is full) → kReply (waits to
// read) → over. Every step uses MSG_DONTWAIT; none ever blocks. Its owner
// gives it up at give_up_at(): the write's deadline, or kStallTimeoutMs
// after its last progress if that comes first (a Write's socket waits are
// bounded the same way).
//
// Ownership, threading and invariants: TcpPendingIo's (the stream, giving
// up, the one end); made by TcpRemote::StartWrite.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "net/tcp_pending_io.h"

namespace kvrelay::net::tcp {

class TcpPendingWrite final : public TcpPendingIo {
 public:
  // REQUIRES: `segments` are one frame (ForEachFrame would not split
  // them: non-empty, at most kMaxFrameSegments and kMaxFrameBytes) inside
  // `local`; `fd` was taken from `pool`.
  TcpPendingWrite(StreamPool* pool, int fd, TransferId transfer, std::span<uint8_t> local,
                  std::span<const Segment> segments, uint64_t total, Instant deadline,
                  std::shared_ptr<TransportStats> stats);

  bool wants_write() const override { return state_ != State::kReply; }
  std::optional<Status> Progress() override;

 private:
  enum class State : uint8_t { kHead, kPayload, kReply };

  uint8_t header_[kHeaderBytes] = {};
  std::vector<uint8_t> table_;
  std::vector<iovec> iov_;
  size_t next_ = 0;
  uint8_t reply_[kReplyBytes] = {};
  size_t got_ = 0;
  State state_ = State::kHead;
};

}  // namespace kvrelay::net::tcp
