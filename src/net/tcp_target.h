// tcp_target.h — TcpTarget: a remote tcp region open for writing: a pool
// of up to max_streams connections, one frame per Write (several for very
// large writes), each acknowledged before Write returns (see
// tcp_transport.cc for the theory of operation).
//
// Thread safety: Write may be called from several writer threads at once.
#pragma once

#include "net/tcp_stream.h"

namespace kvrelay::net::tcp {

class TcpTarget final : public Target {
 public:
  TcpTarget(Region* local, TcpRegistration remote, uint32_t max_streams,
            std::shared_ptr<TransportStats> stats)
      : local_(local),
        remote_(std::move(remote)),
        max_streams_(std::max<uint32_t>(max_streams, 1)),
        stats_(std::move(stats)) {}
  ~TcpTarget() override {
    std::lock_guard<std::mutex> lock(mu_);
    KV_CHECK_MSG(open_ == idle_.size(), "TcpTarget destroyed during a Write");
    for (int fd : idle_) close(fd);
  }
  TcpTarget(const TcpTarget&) = delete;
  TcpTarget& operator=(const TcpTarget&) = delete;

  Status Write(TransferId transfer, std::span<const Segment> segments) override {
    const std::span<uint8_t> local = local_->bytes();
    uint64_t total = 0;
    for (const Segment& s : segments) {
      if (s.src_offset > local.size() || s.bytes > local.size() - s.src_offset) {
        stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
        return Status(StatusCode::kOutOfRange,
                      "tcp write: source segment [" + std::to_string(s.src_offset) + ", " +
                          std::to_string(s.bytes) + " bytes) outside the local region");
      }
      total += s.bytes;
    }
    Result<int> fd = Acquire();
    if (!fd.ok()) {
      stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
      return fd.status();
    }
    const Status status = SendFrames(*fd, transfer, segments, local);
    // A refused or malformed frame was consumed whole by the receiver: the
    // stream is still in sync and the connection can be reused.
    Release(*fd, status.ok() || status.code() == StatusCode::kFailedPrecondition ||
                     status.code() == StatusCode::kInvalidArgument);
    if (status.ok()) {
      stats_->writes_ok.fetch_add(1, std::memory_order_relaxed);
      stats_->bytes_written.fetch_add(total, std::memory_order_relaxed);
    } else {
      stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
    }
    return status;
  }

 private:
  Result<int> Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (!cv_.wait_for(lock, kStreamWait,
                        [&] { return !idle_.empty() || open_ < max_streams_; })) {
        return ResourceExhaustedError("tcp: all " + std::to_string(max_streams_) +
                                      " streams busy");
      }
      if (idle_.empty()) break;
      const int fd = idle_.back();
      idle_.pop_back();
      // An idle stream has nothing to read; readable means the receiver
      // closed it (region gone, receiver restarted): drop it, try again.
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 0) == 0) return fd;
      close(fd);
      --open_;
    }
    ++open_;
    lock.unlock();
    Result<int> fd = Connect();
    if (!fd.ok()) {
      lock.lock();
      --open_;
      cv_.notify_one();
    }
    return fd;
  }

  void Release(int fd, bool reusable) {
    std::lock_guard<std::mutex> lock(mu_);
    if (reusable) {
      idle_.push_back(fd);
    } else {
      close(fd);
      --open_;
    }
    cv_.notify_one();
  }

  Result<int> Connect() {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* addrs = nullptr;
    const std::string port = std::to_string(remote_.port);
    if (const int err = getaddrinfo(remote_.host.c_str(), port.c_str(), &hints, &addrs);
        err != 0) {
      return UnavailableError("tcp: resolving " + remote_.host + ": " + gai_strerror(err));
    }
    std::string last_error = "no address";
    int connected = -1;
    for (addrinfo* a = addrs; a != nullptr && connected < 0; a = a->ai_next) {
      const int fd =
          socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (fd < 0) {
        last_error = Errno("socket");
        continue;
      }
      if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
        last_error = Errno("connect");
        close(fd);
        continue;
      }
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      int r;
      do {
        r = poll(&p, 1, kConnectTimeoutMs);
      } while (r < 0 && errno == EINTR);
      if (r <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        if (r == 0) {
          last_error = "connect: timed out";
        } else {
          if (err != 0) errno = err;
          last_error = Errno("connect");
        }
        close(fd);
        continue;
      }
      connected = fd;
    }
    freeaddrinfo(addrs);
    if (connected < 0) {
      return UnavailableError("tcp: connecting to " + remote_.host + ":" + port + ": " +
                              last_error);
    }
    const int flags = fcntl(connected, F_GETFL);
    fcntl(connected, F_SETFL, flags & ~O_NONBLOCK);
    const int yes = 1;
    setsockopt(connected, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    setsockopt(connected, SOL_SOCKET, SO_SNDBUF, &kSendBufferBytes, sizeof kSendBufferBytes);
    timeval timeout{kStallTimeoutMs / 1000, 0};
    setsockopt(connected, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    setsockopt(connected, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    return connected;
  }

  // Sends `segments` as frames within the limits; stops at the first
  // frame that is not acknowledged OK.
  Status SendFrames(int fd, TransferId transfer, std::span<const Segment> segments,
                    std::span<uint8_t> local) {
    std::vector<Segment> frame;
    frame.reserve(std::min<size_t>(segments.size(), kMaxFrameSegments));
    std::vector<uint8_t> table;  // this call's: Writes run concurrently
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
      const Status status = SendFrame(fd, transfer, frame, frame_bytes, local, table);
      if (!status.ok()) return status;
    }
    return Status::Ok();
  }

  Status SendFrame(int fd, TransferId transfer, std::span<const Segment> frame,
                   uint64_t frame_bytes, std::span<uint8_t> local, std::vector<uint8_t>& table) {
    uint8_t header[kHeaderBytes];
    PutLe(header, kFrameMagic, 4);
    PutLe(header + 4, kFrameVersion, 2);
    PutLe(header + 6, 0, 2);
    PutLe(header + 8, transfer.hi, 8);
    PutLe(header + 16, transfer.lo, 8);
    PutLe(header + 24, frame.size(), 4);
    PutLe(header + 28, frame_bytes, 8);
    table.resize(frame.size() * kTableEntryBytes);
    for (size_t k = 0; k < frame.size(); ++k) {
      PutLe(table.data() + k * kTableEntryBytes, frame[k].dst_offset, 8);
      PutLe(table.data() + k * kTableEntryBytes + 8, frame[k].bytes, 8);
    }
    iovec head[2] = {{header, sizeof header}, {table.data(), table.size()}};
    if (!SendAllV(fd, head, 2)) return UnavailableError(Errno("tcp: sending a frame header"));

    iovec iov[kIovBatch];
    for (size_t k = 0; k < frame.size(); k += kIovBatch) {
      const size_t batch = std::min(kIovBatch, frame.size() - k);
      for (size_t j = 0; j < batch; ++j) {
        iov[j].iov_base = local.data() + frame[k + j].src_offset;
        iov[j].iov_len = frame[k + j].bytes;
      }
      if (!SendAllV(fd, iov, batch)) return UnavailableError(Errno("tcp: sending a payload"));
    }

    uint8_t reply[kReplyBytes];
    size_t got = 0;
    while (got < sizeof reply) {
      const ssize_t r = recv(fd, reply + got, sizeof reply - got, 0);
      if (r > 0) {
        got += static_cast<size_t>(r);
      } else if (r == 0) {
        return UnavailableError("tcp: receiver closed the stream");
      } else if (errno != EINTR) {
        return UnavailableError(Errno("tcp: waiting for the reply"));
      }
    }
    if (GetLe(reply, 4) != kReplyMagic) return UnavailableError("tcp: bad reply magic");
    switch (GetLe(reply + 4, 4)) {
      case kReplyOk:
        return Status::Ok();
      case kReplyRefused:
        return FailedPreconditionError("tcp: receiver refused the write (block not granted to " +
                                       transfer.ToString() + " or outside the region)");
      case kReplyMalformed:
        return InvalidArgumentError("tcp: receiver rejected the segment table");
      default:
        return UnavailableError("tcp: unknown reply status");
    }
  }

  Region* const local_;
  const TcpRegistration remote_;
  const uint32_t max_streams_;
  const std::shared_ptr<TransportStats> stats_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> idle_;  // guarded by mu_
  uint32_t open_ = 0;      // guarded by mu_: idle + in use
};


}  // namespace kvrelay::net::tcp
