// tcp_target.h — TcpTarget: a remote tcp region open for writing: a pool
// of up to max_streams connections (tcp_client.h), one frame per Write
// (several for very large writes), each acknowledged before Write returns
// (see tcp_transport.cc for the theory of operation).
//
// Thread safety: Write may be called from several writer threads at once.
#pragma once

#include "net/tcp_client.h"
#include "net/tcp_stream.h"

namespace kvrelay::net::tcp {

class TcpTarget final : public Target {
 public:
  TcpTarget(Region* local, TcpRegistration remote, uint32_t max_streams,
            std::shared_ptr<TransportStats> stats)
      : local_(local), pool_(std::move(remote), max_streams), stats_(std::move(stats)) {}

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
    const Status status = pool_.Run([&](int fd) {
      std::vector<uint8_t> table;  // this call's: Writes run concurrently
      return ForEachFrame(segments, [&](std::span<const Segment> frame, uint64_t frame_bytes) {
        return SendFrame(fd, transfer, frame, frame_bytes, local, table);
      });
    });
    if (status.ok()) {
      stats_->writes_ok.fetch_add(1, std::memory_order_relaxed);
      stats_->bytes_written.fetch_add(total, std::memory_order_relaxed);
    } else {
      stats_->writes_failed.fetch_add(1, std::memory_order_relaxed);
    }
    return status;
  }

 private:
  // One frame: header and table, the payload straight from the local
  // region, then the receiver's reply.
  Status SendFrame(int fd, TransferId transfer, std::span<const Segment> frame,
                   uint64_t frame_bytes, std::span<uint8_t> local, std::vector<uint8_t>& table) {
    if (!SendFrameHead(fd, kFrameMagic, transfer, frame, frame_bytes, table)) {
      return UnavailableError(Errno("tcp: sending a frame header"));
    }
    if (!IoSegments(fd, local.data(), frame, [](const Segment& s) { return s.src_offset; },
                    SendAllV)) {
      return UnavailableError(Errno("tcp: sending a payload"));
    }
    return RecvReply(fd, kReplyMagic, transfer, "write");
  }

  Region* const local_;
  StreamPool pool_;
  const std::shared_ptr<TransportStats> stats_;
};


}  // namespace kvrelay::net::tcp
