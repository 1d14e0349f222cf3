// tcp_pending_read.cc — TcpPendingRead: one tcp read request driven by its
// caller's event loop (see tcp_pending_read.h).
#include "net/tcp_pending_read.h"

#include <sys/socket.h>

#include <cerrno>
#include <utility>

#include "base/check.h"
#include "os/errno_message.h"

namespace kvrelay::net::tcp {

TcpPendingRead::TcpPendingRead(StreamPool* pool, int fd, TransferId transfer,
                               std::span<uint8_t> local, std::span<const Segment> segments,
                               uint64_t total, Instant deadline,
                               std::shared_ptr<TransportStats> stats)
    : TcpPendingIo(Kind::kRead, pool, fd, transfer, total, deadline, std::move(stats)) {
  EncodeFrameHead(kReadMagic, transfer, segments, total, header_, table_);
  request_ = {{header_, sizeof header_}, {table_.data(), table_.size()}};
  payload_.reserve(segments.size());
  for (const Segment& s : segments) payload_.push_back({local.data() + s.dst_offset, s.bytes});
}

std::optional<Status> TcpPendingRead::Progress() {
  KV_CHECK(!over());
  while (state_ == State::kRequest) {
    msghdr msg{};
    msg.msg_iov = request_.data() + next_;
    msg.msg_iovlen = request_.size() - next_;
    const ssize_t r = sendmsg(fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;  // wants_write
      return End(UnavailableError(ErrnoMessage("tcp: sending a read request")));
    }
    Progressed();
    iovec* rest = request_.data() + next_;
    size_t left = request_.size() - next_;
    ConsumeIov(rest, left, static_cast<size_t>(r));
    next_ = request_.size() - left;
    if (left == 0) {
      // Nothing can have come back yet: wait for the fd to be readable.
      state_ = State::kHead;
      next_ = 0;
      return std::nullopt;
    }
  }
  while (true) {
    if (state_ == State::kPayload) {
      while (next_ < payload_.size()) {
        msghdr msg{};
        msg.msg_iov = payload_.data() + next_;
        msg.msg_iovlen = std::min(payload_.size() - next_, kIovBatch);
        const ssize_t r = recvmsg(fd(), &msg, MSG_DONTWAIT);
        if (r == 0) return End(UnavailableError("tcp read: the payload stopped (peer closed)"));
        if (r < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
          return End(UnavailableError(ErrnoMessage("tcp read: receiving the payload")));
        }
        Progressed();
        iovec* rest = payload_.data() + next_;
        size_t left = payload_.size() - next_;
        ConsumeIov(rest, left, static_cast<size_t>(r));
        next_ = payload_.size() - left;
      }
      state_ = State::kTrailer;
    }
    std::optional<Status> failed;
    if (!RecvReplyBytes(&failed)) return failed;
    if (state_ == State::kTrailer) {
      // Refused here: revoked while the bytes went out; they do not count.
      return End(ParseReply(reply_, kReplyMagic, transfer(), "read"), /*in_step=*/true);
    }
    // The head: refused or malformed end the exchange, the stream in step.
    if (Status head = ParseReply(reply_, kReadHeadMagic, transfer(), "read"); !head.ok()) {
      return End(std::move(head), /*in_step=*/true);
    }
    state_ = State::kPayload;
  }
}

bool TcpPendingRead::RecvReplyBytes(std::optional<Status>* failed) {
  while (got_ < sizeof reply_) {
    const ssize_t r = recv(fd(), reply_ + got_, sizeof reply_ - got_, MSG_DONTWAIT);
    if (r == 0) {
      *failed = End(UnavailableError("tcp read: no reply (peer closed)"));
      return false;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        *failed = End(UnavailableError(ErrnoMessage("tcp read: receiving a reply")));
      }
      return false;  // else not over: wait for the rest
    }
    got_ += static_cast<size_t>(r);
    Progressed();
  }
  got_ = 0;  // taken: the next reply starts afresh
  return true;
}

}  // namespace kvrelay::net::tcp
