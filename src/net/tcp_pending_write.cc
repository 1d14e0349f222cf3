// tcp_pending_write.cc — TcpPendingWrite: one tcp write frame driven by
// its caller's event loop (see tcp_pending_write.h).
#include "net/tcp_pending_write.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "base/check.h"
#include "os/clock.h"
#include "os/errno_message.h"

namespace kvrelay::net::tcp {

TcpPendingWrite::TcpPendingWrite(StreamPool* pool, int fd, TransferId transfer,
                                 std::span<uint8_t> local, std::span<const Segment> segments,
                                 uint64_t total, Instant deadline,
                                 std::shared_ptr<TransportStats> stats)
    : TcpPendingIo(Kind::kWrite, pool, fd, transfer, total, deadline, std::move(stats)) {
  EncodeFrameHead(kFrameMagic, transfer, segments, total, header_, table_);
  iov_.reserve(segments.size() + 2);
  iov_.push_back({header_, sizeof header_});
  iov_.push_back({table_.data(), table_.size()});
  for (const Segment& s : segments) iov_.push_back({local.data() + s.src_offset, s.bytes});
}

std::optional<Status> TcpPendingWrite::Progress() {
  KV_CHECK(!over());
  while (state_ == State::kHead || state_ == State::kPayload) {
    // The head goes alone, as in TcpRemote::WriteFrame: the receiver
    // checks its grants while the payload is on its way.
    const size_t end = state_ == State::kHead ? 2 : iov_.size();
    msghdr msg{};
    msg.msg_iov = iov_.data() + next_;
    msg.msg_iovlen = std::min(end - next_, kIovBatch);
    const ssize_t r = sendmsg(fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;  // wants_write
      return End(UnavailableError(ErrnoMessage("tcp: sending a frame")));
    }
    Progressed();
    iovec* rest = iov_.data() + next_;
    size_t left = end - next_;
    ConsumeIov(rest, left, static_cast<size_t>(r));
    next_ = end - left;
    if (left == 0) state_ = state_ == State::kHead ? State::kPayload : State::kReply;
  }
  while (true) {
    const ssize_t r = recv(fd(), reply_ + got_, sizeof reply_ - got_, MSG_DONTWAIT);
    if (r == 0) return End(UnavailableError("tcp write: no reply (peer closed)"));
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;  // the reply
      return End(UnavailableError(ErrnoMessage("tcp write: reading the reply")));
    }
    got_ += static_cast<size_t>(r);
    Progressed();
    if (got_ == sizeof reply_) {
      return End(ParseReply(reply_, kReplyMagic, transfer(), "write"), /*in_step=*/true);
    }
  }
}

}  // namespace kvrelay::net::tcp
