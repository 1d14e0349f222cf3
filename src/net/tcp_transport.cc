// tcp_transport.cc — the tcp transport: our own framed stream. The region's
// owner runs a receiver that writes arriving bytes straight into its region,
// but only into blocks its GrantTable grants to the frame's transfer.
//
// TcpRegion: owned by whoever called CreateRegion (the rank's runtime).
// Holds the KV (anonymous mmap, zero-filled) and the receiver: a listening
// socket on options.listen_host at an ephemeral port, one accept thread and
// one thread per accepted connection (at most kMaxConnections live; more
// are closed at once). The destructor stops everything: wakes the accept
// thread through an eventfd and joins it, shutdown()s every live
// connection and joins its thread; no thread outlives the region.
//
// Frame (writer → receiver, little-endian):
//   header  u32 magic 'KVTF' | u16 version | u16 flags (0) | u64 transfer.hi
//           | u64 transfer.lo | u32 n_segments | u64 total_bytes
//   table   n_segments × { u64 dst_offset | u64 bytes }
//   payload total_bytes: the segments' bytes in table order
// Reply (receiver → writer): u32 magic 'KVTR' | u32 status
//   0 ok (every byte is in the region), 1 refused (a segment outside the
//   region or on a block not granted to the transfer; nothing written, the
//   payload discarded), 2 malformed table (sum of segment bytes differs
//   from total_bytes; payload discarded).
// A header with a bad magic, version, flags or over the limits
// (kMaxFrameSegments, kMaxFrameBytes) closes the connection. All count as
// writes_refused / frames_malformed. A receiver waits forever for the first
// byte of a frame but at most kStallTimeoutMs for each later byte, so a
// stalled peer cannot hold a connection slot mid-frame forever. Each
// connection has its own thread, so the stripes of one striped write
// (below) are received in parallel, each straight into the region.
//
// Read request (reader → receiver, read mode): the frame header with magic
// 'KVTQ' (same fields; total_bytes = the sum of the table's bytes) and the
// table n_segments × { u64 src_offset | u64 bytes } (offsets in the
// receiver's region); no payload. Response (receiver → reader):
//   head    u32 magic 'KVTD' | u32 status: 0 ok, 1 refused (a segment
//           outside the region or on a block the ReadGrantTable does not
//           grant for read to the transfer), 2 malformed (sum ≠ total).
//           Refused and malformed end the response here; the stream stays
//           in step.
//   payload (ok only) total_bytes: the segments' bytes in table order, sent
//           with sendmsg straight from the region.
//   trailer (ok only) u32 magic 'KVTR' | u32 status: 0 ok (every block was
//           still granted for read after the last byte was sent), 1 refused
//           (revoked meanwhile: the reader must not use the bytes).
// Refusals count as reads_refused, bad tables as frames_malformed; a header
// over the limits closes the connection, as for writes. The receiver's
// sockets have a send timeout of kStallTimeoutMs, so a reader that stops
// reading cannot hold a serving thread forever.
//
// Grants are checked when a frame's table arrives, before any byte of it is
// written. A revoke that lands while a granted frame's payload is being
// received does not stop that frame: the bytes still land, then the frame
// is re-checked and answered "refused" so the writer does not report
// success. The connector must therefore not hand a revoked block to new
// KV while a write to it may be mid-frame (today: D frees a load's blocks
// only after the load ends; a frame in flight to them is bounded by the
// stall timeout).
//
// TcpRemote (tcp_target.h), as a Target: owned by the writer, one per
// remote region. A pool of at most
// options.tcp_streams connections, opened lazily (TCP_NODELAY, 4 MiB
// SO_SNDBUF, send/recv timeouts of kStallTimeoutMs). Write takes an idle
// connection or opens one (waiting at most kStreamWaitMs when all are
// busy), sends the segments as frames of at most kMaxFrameSegments
// segments and kMaxFrameBytes bytes (splitting larger ones), header and
// table in one sendmsg, payload with sendmsg over iovecs pointing into the
// local region (no copy), and waits for each frame's reply. A write of at
// least 2 × options.tcp_stripe_min_bytes is striped: cut into contiguous
// byte ranges (stripe_plan.h), each sent as its own frames on its own
// connection from its own thread, in parallel; it succeeds only if every
// stripe's frames were acknowledged. Every wait is bounded by
// min(kStallTimeoutMs, the Write's deadline): past the deadline the write
// fails with kDeadlineExceeded and its connections close (the receiver
// then drops the frames it was receiving, unacknowledged). Any other
// socket error closes that connection and returns kUnavailable; a refused
// frame returns kFailedPrecondition and keeps the connection.
//
// TcpRemote as a Source: owned by the reader, one per remote region. The
// same pool (tcp_client.h) and framing: Read cuts the segments into requests within
// the frame limits, sends each on its stream and receives the payload with
// recvmsg over iovecs pointing into the local region (no copy), each
// request answered before the next. A read of at least 2 ×
// options.tcp_stripe_min_bytes is striped as a write is: each stripe's
// requests on their own connection from their own thread, served in
// parallel by the receiver's per-connection threads; it succeeds only if
// every stripe's reads landed and their trailers said ok. A peer that closes or stalls past
// kStallTimeoutMs fails the Read with kUnavailable; a refused request
// returns kFailedPrecondition and keeps the connection.
//
// Registration bytes (little-endian): u32 magic 'KVTC' | u16 version (1) |
// u16 host length | host | u16 port | u64 total bytes | u64 planes |
// u32 num_blocks | u64 block_stride_bytes. The host is listen_host as
// given: it must be an address the writers can reach.
//
// Stats live in a shared_ptr so Regions and Targets may outlive the
// Transport. Writer side: writes_ok/failed, bytes_written; reader side:
// reads_ok/failed, bytes_read; receiver side: bytes_received,
// writes_refused, bytes_served, reads_refused, frames_malformed.
#include <sys/mman.h>

#include <memory>

#include "net/stripe_plan.h"
#include "net/tcp_region.h"
#include "net/tcp_stream.h"
#include "net/tcp_target.h"
#include "net/transport.h"
#include "os/errno_message.h"

namespace kvrelay::net {
namespace {

using tcp::DecodeRegistration;
using tcp::LayoutBytes;
using tcp::TcpRegion;
using tcp::TcpRegistration;
using tcp::TcpRemote;

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportOptions& options)
      : options_(options), stats_(std::make_shared<TransportStats>()) {}

  TransportKind kind() const override { return TransportKind::kTcp; }

  Result<std::unique_ptr<Region>> CreateRegion(const std::string&,
                                               const RegionLayout& layout) override {
    uint64_t bytes = 0;
    if (!LayoutBytes(layout, &bytes)) {
      return InvalidArgumentError("tcp region: empty or oversized layout");
    }
    void* base =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return ResourceExhaustedError(ErrnoMessage("tcp region: mmap"));
    auto region = std::make_unique<TcpRegion>(static_cast<uint8_t*>(base), layout, stats_);
    if (Status status = region->Start(options_.listen_host); !status.ok()) return status;
    return std::unique_ptr<Region>(std::move(region));
  }

  Result<std::unique_ptr<Target>> Open(std::span<const uint8_t> registration,
                                       Region* local) override {
    Result<std::unique_ptr<TcpRemote>> remote = OpenRemote(registration, local);
    if (!remote.ok()) return remote.status();
    return std::unique_ptr<Target>(std::move(remote).value());
  }

  Result<std::unique_ptr<Source>> OpenSource(std::span<const uint8_t> registration,
                                             Region* local) override {
    Result<std::unique_ptr<TcpRemote>> remote = OpenRemote(registration, local);
    if (!remote.ok()) return remote.status();
    return std::unique_ptr<Source>(std::move(remote).value());
  }

  const TransportStats& stats() const override { return *stats_; }

 private:
  // Connects lazily: the first Write or Read opens the first stream.
  Result<std::unique_ptr<TcpRemote>> OpenRemote(std::span<const uint8_t> registration,
                                                Region* local) {
    KV_CHECK(local != nullptr);
    Result<TcpRegistration> r = DecodeRegistration(registration);
    if (!r.ok()) return r.status();
    return std::make_unique<TcpRemote>(local, std::move(r).value(), options_.tcp_streams,
                                       options_.tcp_stripe_min_bytes, stats_);
  }

  const TransportOptions options_;
  const std::shared_ptr<TransportStats> stats_;
};

}  // namespace

Result<std::unique_ptr<Transport>> MakeTcpTransport(const TransportOptions& options) {
  if (options.tcp_stripe_min_bytes < kStripeAlignBytes) {
    return InvalidArgumentError("tcp: tcp_stripe_min_bytes below " +
                                std::to_string(kStripeAlignBytes));
  }
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(options));
}

}  // namespace kvrelay::net
