// tcp_pending_io.cc — TcpPendingIo: the end of a polled tcp write or read
// (see tcp_pending_io.h).
#include "net/tcp_pending_io.h"

#include <string>
#include <utility>

#include "base/check.h"

namespace kvrelay::net::tcp {

TcpPendingIo::TcpPendingIo(Kind kind, StreamPool* pool, int fd, TransferId transfer,
                           uint64_t total, Instant deadline,
                           std::shared_ptr<TransportStats> stats)
    : kind_(kind),
      pool_(pool),
      fd_(fd),
      transfer_(transfer),
      total_(total),
      deadline_(deadline),
      stats_(std::move(stats)) {}

TcpPendingIo::~TcpPendingIo() {
  if (!over_) {
    Abandon(CancelledError(std::string("tcp ") + what() + ": abandoned before its end"))
        .IgnoreError();
  }
}

Status TcpPendingIo::GiveUp() {
  KV_CHECK(!over_);
  // At the deadline: "tcp read: given up: the deadline passed"; else
  // stalled: "... given up: no progress for the stall timeout".
  const WaitBound bound(deadline_);
  return End(bound.Failed(std::string("tcp ") + what() + ": given up" +
                          (bound.Expired() ? "" : ": no progress for the stall timeout")));
}

Status TcpPendingIo::Abandon(Status why) {
  KV_CHECK(!over_);
  KV_CHECK(!why.ok());
  return End(std::move(why));
}

Status TcpPendingIo::End(Status status, bool in_step) {
  KV_CHECK(!over_);
  over_ = true;
  pool_->Release(fd_, in_step ? status
                              : CancelledError(std::string("tcp ") + what() +
                                               " ended out of step"));
  const bool write = kind_ == Kind::kWrite;
  return CountOutcome(std::move(status), total_,
                      {write ? stats_->writes_ok : stats_->reads_ok,
                       write ? stats_->writes_failed : stats_->reads_failed,
                       write ? stats_->bytes_written : stats_->bytes_read});
}

}  // namespace kvrelay::net::tcp
