// tcp_target.h — TcpRemote: a remote tcp region open for writing (a
// Target: one frame per Write, several for very large writes, each
// acknowledged) or for reading (a Source, read mode: one read request per
// frame's worth of segments, each answered before the next), over a pool of
// up to max_streams connections (tcp_client.h). See tcp_transport.cc for
// the theory of operation and the frames.
//
// Thread safety: Write and Read may be called from several threads at once.
#pragma once

#include "net/tcp_client.h"
#include "net/tcp_stream.h"

namespace kvrelay::net::tcp {

class TcpRemote final : public Target, public Source {
 public:
  TcpRemote(Region* local, TcpRegistration remote, uint32_t max_streams,
            std::shared_ptr<TransportStats> stats)
      : local_(local), pool_(std::move(remote), max_streams), stats_(std::move(stats)) {}

  Status Write(TransferId transfer, std::span<const Segment> segments) override {
    return Run(/*write=*/true, transfer, segments);
  }
  Status Read(TransferId transfer, std::span<const Segment> segments) override {
    return Run(/*write=*/false, transfer, segments);
  }

 private:
  Status Run(bool write, TransferId transfer, std::span<const Segment> segments) {
    const std::span<uint8_t> local = local_->bytes();
    const OpCounters counters =
        write ? OpCounters{stats_->writes_ok, stats_->writes_failed, stats_->bytes_written}
              : OpCounters{stats_->reads_ok, stats_->reads_failed, stats_->bytes_read};
    return RunFrames(pool_, local, segments, /*local_is_src=*/write, write ? "write" : "read",
                     counters,
                     [&](int fd, std::span<const Segment> frame, uint64_t frame_bytes,
                         std::vector<uint8_t>& table) {
                       return write ? WriteFrame(fd, transfer, frame, frame_bytes, local, table)
                                    : ReadFrame(fd, transfer, frame, frame_bytes, local, table);
                     });
  }

  // One write frame: header and table, the payload straight from the local
  // region, then the receiver's reply.
  Status WriteFrame(int fd, TransferId transfer, std::span<const Segment> frame,
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

  // One read request: header and table; the head (refused or malformed end
  // the exchange there), the payload straight into the local region, and
  // the trailer.
  Status ReadFrame(int fd, TransferId transfer, std::span<const Segment> frame,
                   uint64_t frame_bytes, std::span<uint8_t> local, std::vector<uint8_t>& table) {
    if (!SendFrameHead(fd, kReadMagic, transfer, frame, frame_bytes, table)) {
      return UnavailableError(Errno("tcp: sending a read request"));
    }
    if (Status head = RecvReply(fd, kReadHeadMagic, transfer, "read"); !head.ok()) return head;
    if (!IoSegments(fd, local.data(), frame, [](const Segment& s) { return s.dst_offset; },
                    RecvAllV)) {
      return UnavailableError("tcp read: the payload stopped (peer closed or stalled)");
    }
    return RecvReply(fd, kReplyMagic, transfer, "read");
  }

  Region* const local_;
  StreamPool pool_;
  const std::shared_ptr<TransportStats> stats_;
};


}  // namespace kvrelay::net::tcp
