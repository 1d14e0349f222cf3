// tcp_client.h — StreamPool: the connections from one process to one remote
// tcp region's receiver, for writes and reads alike (TcpRemote): at most
// max_streams, opened lazily, reused while in step.
//
// Each operation (or each stripe of a striped write) takes a stream for
// itself — an idle one, or a new one while fewer than max_streams are open;
// otherwise Acquire waits at most min(kStreamWaitMs, the operation's
// deadline) and TryAcquire does not wait — runs its frames on it and gives
// it back. A stream is reused only if the operation left it in step: it
// succeeded, or the peer refused or rejected a frame whole
// (kFailedPrecondition, kInvalidArgument). Any other error closes it. An
// idle stream found readable was closed by the peer (region gone, receiver
// restarted) and is dropped.
//
// Sockets: TCP_NODELAY, 4 MiB SO_SNDBUF, send/recv timeouts of
// kStallTimeoutMs, connect bounded by min(kConnectTimeoutMs, the deadline).
//
// CheckLocal, CountOutcome, RunFrames: the local half of a Write or a Read.
//
// Thread safety: Run may be called from several threads at once.
// Ownership: owned by its Target or Source; destroying it while an
// operation runs is a bug (checked).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "base/mutex.h"
#include "net/tcp_stream.h"

namespace kvrelay::net::tcp {

class StreamPool {
 public:
  StreamPool(TcpRegistration remote, uint32_t max_streams);
  ~StreamPool();
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  uint32_t max_streams() const { return max_streams_; }

  // Runs op(fd) -> Status on a stream of the pool and returns its status
  // (or why no stream could be had: kResourceExhausted, kUnavailable,
  // kDeadlineExceeded).
  template <typename Op>
  Status Run(Op op, const WaitBound& bound = {}) EXCLUDES(mu_) {
    Result<int> fd = Acquire(bound);
    if (!fd.ok()) return fd.status();
    Status status = op(*fd);
    Release(*fd, status);
    return status;
  }

  // A stream for one operation, waiting for one at most min(kStreamWaitMs,
  // the deadline). Give it back with Release.
  Result<int> Acquire(const WaitBound& bound) EXCLUDES(mu_);
  // A stream if one is idle or may be opened now, else -1 (never waits for
  // another operation to give one back).
  int TryAcquire(const WaitBound& bound) EXCLUDES(mu_);
  // An idle stream, else -1: never connects and never waits (for a caller
  // that must not block, PendingWrite). An idle stream the peer closed is
  // dropped, as in Take.
  int TryAcquireIdle() EXCLUDES(mu_);
  // Gives back a stream from Acquire/TryAcquire after an operation that
  // ended with `status`: kept if that left it in step, else closed.
  void Release(int fd, const Status& status) EXCLUDES(mu_);

 private:
  Result<int> Take(const WaitBound& bound, bool wait) EXCLUDES(mu_);

  // The last idle stream still in step, else -1. An idle stream has
  // nothing to read; readable means the receiver closed it (region gone,
  // receiver restarted): it is dropped and the next one tried.
  int PopLiveIdle() REQUIRES(mu_);

  Result<int> Connect(const WaitBound& bound);

  const TcpRegistration remote_;
  const uint32_t max_streams_;

  Mutex mu_;
  CondVar cv_;
  std::vector<int> idle_ GUARDED_BY(mu_);
  uint32_t open_ GUARDED_BY(mu_) = 0;  // idle + in use
};

// What a Write and a Read share on the local side: every segment's local
// range (src for a write, dst for a read) is checked before any byte moves
// (CheckLocal), the frames of a segment list run on one stream
// (FramesOnStream), and each operation's outcome is counted once in
// `ok`/`failed`/`bytes` (CountOutcome).
struct OpCounters {
  std::atomic<uint64_t>& ok;
  std::atomic<uint64_t>& failed;
  std::atomic<uint64_t>& bytes;
};

// kOutOfRange if a segment's local range lies outside `local`; else sets
// *total to the segments' bytes.
Status CheckLocal(std::span<uint8_t> local, std::span<const Segment> segments, bool local_is_src,
                  const char* what, uint64_t* total);

Status CountOutcome(Status status, uint64_t total, OpCounters counters);

// Runs frame_fn(fd, frame, frame_bytes, table) for each frame of
// `segments` (ForEachFrame) on stream `fd`, in order; stops at the first
// error.
template <typename FrameFn>
Status FramesOnStream(int fd, std::span<const Segment> segments, FrameFn frame_fn) {
  std::vector<uint8_t> table;  // this call's: operations and stripes run concurrently
  return ForEachFrame(segments, [&](std::span<const Segment> frame, uint64_t frame_bytes) {
    return frame_fn(fd, frame, frame_bytes, table);
  });
}

}  // namespace kvrelay::net::tcp
