// transport.h — the data plane: one interface, three implementations (shm,
// tcp, ucx), chosen by a flag at start-up.
//
// Why this shape: the connector decides *what* to write (a StartWrite: src
// blocks on P, dst blocks on D, a deadline); a transport only moves bytes.
// Every rank owns one registered Region that holds its KV (the engine's
// ByteKvMemory lives in it). Its registration bytes travel in the control
// channel's handshake; a writer on another process Open()s them into a
// Target and copies Segments from its own Region into the remote one. This
// is RDMA's model (register, exchange keys, one-sided put) and the same
// code path serves shared memory, our own TCP stream and UCX.
//
// Read mode (NIXL-style) is the same model the other way round: D
// OpenSource()s P's registration into a Source and Source::Read copies
// Segments from P's Region into its own, one-sided (RDMA's get).
//
// Guarantees, identical across transports:
//   - Target::Write returns OK only when every byte is at the destination
//     (shm: copied; tcp: the receiver wrote it and acknowledged; ucx: the
//     put and a flush completed). A failed Write may have written a prefix.
//   - tcp's receiver writes only into blocks that the region's GrantTable
//     grants to that transfer at that moment; anything else is refused and
//     counted (a peer can never write outside what it was granted). shm and
//     ucx are one-sided, like RDMA: the writer's own connector enforces the
//     grant (it writes only the dst blocks of a pull it received).
//   - Source::Read returns OK only when every byte is in the local region
//     and the remote region was alive (not destroyed, its owner not gone)
//     until after the last byte was taken from it (shm: copied, the owner's
//     lock still held; tcp: the remote receiver sent it, its read grants
//     held throughout, and it said so; ucx: the gets and a flush completed
//     and the region's liveness word, read after them, is unchanged). A
//     failed Read may have written any part of the segments' local bytes.
//   - tcp's receiver serves only reads of blocks that its region's
//     ReadGrantTable grants for read to that transfer, for the whole time
//     it sends them; anything else is refused and counted (reads_refused).
//     shm and ucx are one-sided: the reader's own connector enforces it (it
//     reads only the blocks P named for that transfer).
//
// Threading: Transport, Region, Target and Source are thread-safe; several
// threads may call Target::Write and Source::Read at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/status.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "net/grant_table.h"

namespace kvrelay::net {

enum class TransportKind : uint8_t { kShm = 0, kTcp = 1, kUcx = 2 };
const char* TransportName(TransportKind kind);
// "shm" | "tcp" | "ucx"; false for anything else.
bool ParseTransport(const std::string& name, TransportKind* out);

// How a rank's region is laid out (ByteKvMemory's layout): `planes`
// (layer × K|V) planes, each `num_blocks` blocks of `block_stride_bytes`.
// Block b of plane p is [(p*num_blocks + b)*stride, +stride).
struct RegionLayout {
  uint64_t planes = 0;
  uint32_t num_blocks = 0;
  uint64_t block_stride_bytes = 0;
  uint64_t bytes() const { return planes * num_blocks * block_stride_bytes; }
  // The block a byte offset falls in.
  uint32_t BlockOf(uint64_t offset) const {
    return static_cast<uint32_t>((offset / block_stride_bytes) % num_blocks);
  }
};

// One contiguous copy: `bytes` at `src_offset` of the region the bytes come
// from to `dst_offset` of the region they go to. Target::Write: src is the
// local region, dst the remote one; Source::Read: src is the remote region,
// dst the local one.
struct Segment {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
  bool operator==(const Segment&) const = default;
};

struct TransportStats {
  std::atomic<uint64_t> writes_ok{0};
  std::atomic<uint64_t> writes_failed{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> bytes_received{0};     // tcp receiver
  std::atomic<uint64_t> writes_refused{0};     // tcp receiver: not granted / out of range
  std::atomic<uint64_t> frames_malformed{0};   // tcp receiver
  std::atomic<uint64_t> reads_ok{0};           // Source::Read, reader side
  std::atomic<uint64_t> reads_failed{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> reads_refused{0};      // tcp receiver: not granted for read / out of range
  std::atomic<uint64_t> bytes_served{0};       // tcp receiver: bytes sent to readers
};

// A rank's registered KV memory.
class Region {
 public:
  virtual ~Region() = default;
  virtual std::span<uint8_t> bytes() = 0;
  virtual const RegionLayout& layout() const = 0;
  // What a remote writer needs to Open() this region (segment name, host
  // and port, rkey and worker address, ...). Opaque outside the transport.
  virtual const std::vector<uint8_t>& registration() const = 0;
  // Which transfer may write each block (tcp's receiver checks it).
  virtual GrantTable& grants() = 0;
  // Which transfers may read each block (read mode; tcp's receiver checks
  // it): P grants a transfer's source blocks when they are ready for D and
  // revokes them when the transfer ends.
  virtual ReadGrantTable& read_grants() = 0;
};

// A write started on its caller's thread that finishes without blocking it
// (Target::StartWrite), or a read (Source::StartRead: a "write" from the
// remote region into the local one): its owner polls fd() — for writing
// while wants_write(), else for reading — and calls Progress() when the fd
// is ready (or in error), until Progress returns the outcome.
// Each step takes only what the socket holds or has without waiting.
//
// Ownership: the caller of StartWrite (StartRead), which also keeps the
// Target (Source) alive for as long as it holds this. Threading: one
// thread (the owner's).
// Invariants: the outcome is returned once, and counted once in the
// transport's stats, like a Write's; destroying one that has not finished
// (or Abandon) ends it as failed and closes its connection, which is then
// out of step.
class PendingWrite {
 public:
  virtual ~PendingWrite() = default;
  virtual int fd() const = 0;
  // What to wait for before the next Progress: room in the socket (true)
  // or the peer's reply, or a read's bytes (false).
  virtual bool wants_write() const = 0;
  // nullopt: not over yet (wait as wants_write() says); else the outcome,
  // the same as Target::Write's (Source::Read's) for these segments.
  virtual std::optional<Status> Progress() = 0;
  // When its owner should give it up (GiveUp) if it has not ended: the
  // deadline it was started with, or earlier once it has made no progress
  // for the transport's stall timeout (as a Write's socket waits are
  // bounded).
  virtual Instant give_up_at() const = 0;
  // Ends it at its give_up_at(): kDeadlineExceeded once the deadline has
  // passed, else kUnavailable (stalled), as a Write's waits end. REQUIRES:
  // Progress has not returned an outcome.
  virtual Status GiveUp() = 0;
  // Ends it now with `why`, a failure (the owner stops, say); returns
  // `why`. REQUIRES: Progress has not returned an outcome.
  virtual Status Abandon(Status why) = 0;
};

// A remote region, open for writing from a local one.
class Target {
 public:
  virtual ~Target() = default;
  // Copies every segment from the local region to the remote one; returns
  // when the bytes are there. `transfer` names the grant the receiver
  // checks (tcp). `deadline` is on the process's monotonic clock
  // (os/clock.h, MonoNow): a Write never waits past
  // it — one already past fails at once without moving a byte, and a wait
  // still running then ends with kDeadlineExceeded (tcp: every socket wait
  // is bounded by min(stall timeout, deadline); ucx: the flush wait; shm
  // never waits). REQUIRES: segments inside both regions.
  virtual Status Write(TransferId transfer, std::span<const Segment> segments,
                       Instant deadline) = 0;
  // The same with no deadline: waits are bounded by the transport's own
  // stall timeouts only. (Derived classes: `using Target::Write;`.)
  Status Write(TransferId transfer, std::span<const Segment> segments) {
    return Write(transfer, segments, Instant::Never());
  }
  // True if Write is only a copy between two local mappings: it never waits
  // on a peer, a socket or a lock another process holds, so its time is the
  // copy's. A caller may then run a small write on its own thread instead
  // of handing it to a worker (a hand-off costs more than a small copy).
  virtual bool CopiesInPlace() const { return false; }
  // A write its caller can drive from its own event loop (PendingWrite),
  // when this one can go that way: tcp, a write that fits one frame and
  // one stream, an idle connection to hand. nullptr otherwise — the
  // transport has no such path, no connection is idle, the write is too
  // large, or its deadline has passed — and the caller uses Write. Nothing
  // has been sent when it returns; the first Progress sends.
  virtual std::unique_ptr<PendingWrite> StartWrite(TransferId /*transfer*/,
                                                   std::span<const Segment> /*segments*/,
                                                   Instant /*deadline*/) {
    return nullptr;
  }
};

// A remote region, open for reading into a local one (read mode).
class Source {
 public:
  virtual ~Source() = default;
  // Copies every segment from the remote region (src_offset) into the
  // local one (dst_offset); returns when the bytes are in local memory.
  // `transfer` names the read grant the remote receiver checks (tcp).
  // REQUIRES: segments inside both regions (kOutOfRange otherwise; tcp
  // finds a remote range error at the remote end: kFailedPrecondition).
  // Errors: kFailedPrecondition (tcp: refused — not granted for read, or
  // revoked while the bytes were sent), kUnavailable (the remote region or
  // its process is gone, the path to it broke or stalled past the stall
  // timeout), kDeadlineExceeded (ucx: gets not complete in time).
  virtual Status Read(TransferId transfer, std::span<const Segment> segments) = 0;
  // As Target::CopiesInPlace: Read is only a copy between two local
  // mappings, so a caller may run a small one on its own thread.
  virtual bool CopiesInPlace() const { return false; }
  // A read its caller can drive from its own event loop, as
  // Target::StartWrite: tcp, a read that fits one frame and one stream, an
  // idle connection to hand. nullptr otherwise, and the caller uses Read.
  // Unlike Read, it is given up at `deadline` (PendingWrite::give_up_at):
  // the time by which the read must have landed, not the one by which it
  // must start.
  virtual std::unique_ptr<PendingWrite> StartRead(TransferId /*transfer*/,
                                                  std::span<const Segment> /*segments*/,
                                                  Instant /*deadline*/) {
    return nullptr;
  }
};

struct TransportOptions {
  std::string listen_host = "127.0.0.1";  // tcp: where the receiver listens
  uint32_t tcp_streams = 4;               // tcp: connections per Target
  // tcp: a Write of at least 2 × this many bytes is striped over up to
  // tcp_streams connections in parallel, each stripe at least this long.
  uint64_t tcp_stripe_min_bytes = 8ull << 20;
  std::string ucx_tls;                    // ucx: UCX_TLS for the context ("" = UCX's default)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;
  // A new registered region of layout.bytes() bytes, zero-filled. `name`
  // is unique per process and rank (shm uses it for the segment name).
  virtual Result<std::unique_ptr<Region>> CreateRegion(const std::string& name,
                                                       const RegionLayout& layout) = 0;
  // Opens a remote region from its registration, to write from `local`.
  // Errors: kInvalidArgument (malformed registration), kUnavailable.
  virtual Result<std::unique_ptr<Target>> Open(std::span<const uint8_t> registration,
                                               Region* local) = 0;
  // Opens a remote region from its registration, to read into `local`.
  // Errors: kInvalidArgument (malformed registration), kUnavailable (shm,
  // ucx: the remote region is already gone).
  virtual Result<std::unique_ptr<Source>> OpenSource(std::span<const uint8_t> registration,
                                                     Region* local) = 0;
  virtual const TransportStats& stats() const = 0;
};


Result<std::unique_ptr<Transport>> MakeShmTransport(const TransportOptions& options);
Result<std::unique_ptr<Transport>> MakeTcpTransport(const TransportOptions& options);
Result<std::unique_ptr<Transport>> MakeUcxTransport(const TransportOptions& options);
Result<std::unique_ptr<Transport>> MakeTransport(TransportKind kind, const TransportOptions& options);

}  // namespace kvrelay::net
