// tcp_target.h — TcpRemote: a remote tcp region open for writing (a
// Target) or for reading (a Source, read mode), over a pool of up to
// max_streams connections (tcp_client.h). See tcp_transport.cc for the
// theory of operation and the frames.
//
// Write: a write of fewer than 2 × stripe_min_bytes bytes runs on one
// stream as frames, each acknowledged before the next. A larger one is cut
// into up to max_streams stripes (stripe_plan.h: contiguous byte ranges,
// each at least stripe_min_bytes) over as many streams as it can have at
// once — the first waited for, the others only if idle or openable now —
// and each stripe runs its frames on its own stream in parallel: stripe 0
// on the caller's thread, every other one on a thread started for this
// write and joined before Write returns (so at most max_streams - 1 extra
// threads per write in flight). The receiver checks each stripe's frames
// against its grants as any frame. Write returns OK only if every stripe
// was acknowledged; otherwise the first failed stripe's error (in stripe
// order), once: a failing stripe does not stop the others, whose bytes may
// land, but the write as a whole is failed and counted once.
//
// Deadlines: every wait of a Write (a stream from the pool, connect, room
// in the socket buffer, the payload's progress, the reply) is bounded by
// min(its own limit — the stall timeout for socket waits —, the deadline)
// and the write fails with kDeadlineExceeded once the deadline has passed,
// even between waits; a deadline already past fails at once without
// touching a socket. Reads have no deadline (the stall timeout only).
//
// Read: one read request per frame's worth of segments, each answered
// before the next, on one stream; a read of at least 2 × stripe_min_bytes
// is striped exactly as a write (each stripe its own read requests on its
// own stream, the region serving every stream on a thread of its own) and
// fails as a write does: the first failed stripe's error, counted once.
//
// Thread safety: Write and Read may be called from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "net/tcp_client.h"
#include "net/tcp_stream.h"

namespace kvrelay::net::tcp {

class TcpRemote final : public Target, public Source {
 public:
  // REQUIRES: stripe_min_bytes ≥ kStripeAlignBytes.
  TcpRemote(Region* local, TcpRegistration remote, uint32_t max_streams,
            uint64_t stripe_min_bytes, std::shared_ptr<TransportStats> stats);

  using Target::Write;
  Status Write(TransferId transfer, std::span<const Segment> segments,
               Instant deadline) override;

  // A write of one frame on one idle stream, driven by the caller's loop
  // (tcp_pending_write.h); see Target::StartWrite for when it is nullptr.
  std::unique_ptr<PendingWrite> StartWrite(TransferId transfer, std::span<const Segment> segments,
                                           Instant deadline) override;

  Status Read(TransferId transfer, std::span<const Segment> segments) override;
  // A read of one frame on one idle stream, driven by the caller's loop
  // (tcp_pending_read.h); see Source::StartRead for when it is nullptr.
  std::unique_ptr<PendingWrite> StartRead(TransferId transfer, std::span<const Segment> segments,
                                          Instant deadline) override;

 private:
  // Runs `segments` as up to `want` stripes, stripe_fn(fd, stripe) each on
  // its own stream, in parallel (a write's or a read's); see the header
  // comment.
  template <typename StripeFn>
  Status RunStriped(std::span<const Segment> segments, uint32_t want, const WaitBound& bound,
                    const StripeFn& stripe_fn);

  // One write frame: header and table, the payload straight from the local
  // region, then the receiver's reply; every wait bounded by `bound`.
  Status WriteFrame(int fd, TransferId transfer, std::span<const Segment> frame,
                    uint64_t frame_bytes, std::span<uint8_t> local, std::vector<uint8_t>& table,
                    const WaitBound& bound);

  // One read request: header and table; the head (refused or malformed end
  // the exchange there), the payload straight into the local region, and
  // the trailer.
  Status ReadFrame(int fd, TransferId transfer, std::span<const Segment> frame,
                   uint64_t frame_bytes, std::span<uint8_t> local, std::vector<uint8_t>& table);

  Region* const local_;
  StreamPool pool_;
  const uint64_t stripe_min_bytes_;
  const std::shared_ptr<TransportStats> stats_;
};

}  // namespace kvrelay::net::tcp
