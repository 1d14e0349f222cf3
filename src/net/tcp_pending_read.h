// tcp_pending_read.h — TcpPendingRead: one tcp read request driven by its
// caller's event loop instead of a blocked thread (a net::PendingWrite
// reached through Source::StartRead).
//
// Why: in read mode a small read handed to a worker costs D two thread
// wake-ups (the hand-off and the outcome's way back to the rank), as a
// small write costs P in push mode (tcp_pending_write.h). D's rank can send
// the request itself and take the head, the payload and the trailer in its
// own poll, beside its control sockets.
//
// The bytes on the wire are those of TcpRemote::Read's one-frame case: the
// request's header and table in one sendmsg, then the server's 8-byte head
// (refused or malformed end the exchange there, the stream in step), the
// payload straight into the local region, and the 8-byte trailer (refused:
// revoked while the bytes went out, so they must not count). States, in
// order: kRequest (wants_write: the socket is full) → kHead → kPayload →
// kTrailer → over. The step that finishes the request returns without
// reading (the server has not answered yet); every later one takes all the
// socket has. Every step uses MSG_DONTWAIT; none ever blocks. Its
// owner gives it up at give_up_at(): the read's deadline, or
// kStallTimeoutMs after its last progress if that comes first.
//
// Ownership, threading and invariants: TcpPendingIo's (the stream, giving
// up, the one end); made by TcpRemote::StartRead. Also: nothing lands in
// the local region after the read ended (only a recv on its stream writes
// there, and an unfinished read's stream is closed).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "net/tcp_pending_io.h"

namespace kvrelay::net::tcp {

class TcpPendingRead final : public TcpPendingIo {
 public:
  // REQUIRES: `segments` are one frame (non-empty, none empty, at most
  // kMaxFrameSegments and kMaxFrameBytes), their dst ranges inside `local`;
  // `fd` was taken from `pool`.
  TcpPendingRead(StreamPool* pool, int fd, TransferId transfer, std::span<uint8_t> local,
                 std::span<const Segment> segments, uint64_t total, Instant deadline,
                 std::shared_ptr<TransportStats> stats);

  bool wants_write() const override { return state_ == State::kRequest; }
  std::optional<Status> Progress() override;

 private:
  enum class State : uint8_t { kRequest, kHead, kPayload, kTrailer };

  // Receives into reply_ without waiting: true once it holds a whole reply.
  // On EOF or an error ends the read and sets *failed to the outcome.
  bool RecvReplyBytes(std::optional<Status>* failed);

  uint8_t header_[kHeaderBytes] = {};
  std::vector<uint8_t> table_;
  std::vector<iovec> request_;  // header and table
  std::vector<iovec> payload_;  // the local destination of each segment
  size_t next_ = 0;             // first unfinished iovec of the current state's list
  uint8_t reply_[kReplyBytes] = {};
  size_t got_ = 0;
  State state_ = State::kRequest;
};

}  // namespace kvrelay::net::tcp
