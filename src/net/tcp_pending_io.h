// tcp_pending_io.h — TcpPendingIo: what a tcp write frame (TcpPendingWrite)
// and a tcp read request (TcpPendingRead) driven by their caller's event
// loop share: the stream they hold, when they are given up, and the one
// place that ends them.
//
// Why: both are a net::PendingWrite with the same rules — given up at the
// operation's deadline or kStallTimeoutMs after their last progress, ended
// once, their stream kept only when in step, their outcome counted once —
// so the rules live here once and each subclass holds only its exchange.
//
// Ownership: made by TcpRemote with an idle stream of its pool, given back
// (kept or closed, StreamPool::Release) when it ends; its owner keeps the
// TcpRemote alive meanwhile. Threading: one thread.
// Invariants: ended once (End); the outcome counted once in the
// transport's write or read stats; one destroyed before its end counts as
// failed and closes its stream (half an exchange may be on it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "net/tcp_client.h"
#include "net/tcp_stream.h"
#include "os/clock.h"

namespace kvrelay::net::tcp {

class TcpPendingIo : public PendingWrite {
 public:
  enum class Kind : uint8_t { kWrite, kRead };

  ~TcpPendingIo() override;
  TcpPendingIo(const TcpPendingIo&) = delete;
  TcpPendingIo& operator=(const TcpPendingIo&) = delete;

  int fd() const final { return fd_; }
  Instant give_up_at() const final {
    return std::min(deadline_, last_progress_ + Duration::Milliseconds(kStallTimeoutMs));
  }
  Status GiveUp() final;
  Status Abandon(Status why) final;

 protected:
  // REQUIRES: `fd` was taken from `pool`.
  TcpPendingIo(Kind kind, StreamPool* pool, int fd, TransferId transfer, uint64_t total,
               Instant deadline, std::shared_ptr<TransportStats> stats);

  bool over() const { return over_; }
  TransferId transfer() const { return transfer_; }
  const char* what() const { return kind_ == Kind::kWrite ? "write" : "read"; }
  void Progressed() { last_progress_ = MonoNow(); }
  // The one end: `status` is the outcome. `in_step`: a whole reply was
  // read last, so the stream may be kept (Release keeps it unless the
  // reply said otherwise); any other end closes it. Returns `status`.
  Status End(Status status, bool in_step = false);

 private:
  const Kind kind_;
  StreamPool* const pool_;
  const int fd_;
  const TransferId transfer_;
  const uint64_t total_;
  const Instant deadline_;
  const std::shared_ptr<TransportStats> stats_;
  Instant last_progress_ = MonoNow();
  bool over_ = false;
};

}  // namespace kvrelay::net::tcp
