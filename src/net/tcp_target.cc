// tcp_target.cc — TcpRemote: a remote tcp region open for writing or
// reading (see tcp_target.h).
#include "net/tcp_target.h"

#include <algorithm>
#include <system_error>
#include <thread>
#include <utility>

#include "base/check.h"
#include "net/stripe_plan.h"
#include "net/tcp_pending_read.h"
#include "net/tcp_pending_write.h"
#include "os/errno_message.h"

namespace kvrelay::net::tcp {
namespace {

// True if `segments` (of `total` bytes) go as one frame of ForEachFrame's,
// none of them empty: what a pending write or read sends.
bool OneFrame(std::span<const Segment> segments, uint64_t total) {
  return !segments.empty() && segments.size() <= kMaxFrameSegments && total <= kMaxFrameBytes &&
         std::all_of(segments.begin(), segments.end(),
                     [](const Segment& s) { return s.bytes > 0; });
}

}  // namespace

TcpRemote::TcpRemote(Region* local, TcpRegistration remote, uint32_t max_streams,
                     uint64_t stripe_min_bytes, std::shared_ptr<TransportStats> stats)
    : local_(local),
      pool_(std::move(remote), max_streams),
      stripe_min_bytes_(stripe_min_bytes),
      stats_(std::move(stats)) {
  KV_CHECK(stripe_min_bytes_ >= kStripeAlignBytes);
}

template <typename StripeFn>
Status TcpRemote::RunStriped(std::span<const Segment> segments, uint32_t want,
                             const WaitBound& bound, const StripeFn& stripe_fn) {
  Result<int> first = pool_.Acquire(bound);
  if (!first.ok()) return first.status();
  std::vector<int> fds{*first};
  while (fds.size() < want) {
    const int fd = pool_.TryAcquire(bound);
    if (fd < 0) break;
    fds.push_back(fd);
  }
  const std::vector<std::vector<Segment>> stripes =
      SplitIntoStripes(segments, static_cast<uint32_t>(fds.size()));
  // results[i] is written only by stripe i's thread; join orders it
  // before the reads below.
  std::vector<Status> results(fds.size());
  const auto run = [&](size_t i) { results[i] = stripe_fn(fds[i], stripes[i]); };
  std::vector<std::thread> helpers;
  helpers.reserve(fds.size() - 1);
  for (size_t i = 1; i < fds.size(); ++i) {
    try {
      helpers.emplace_back(run, i);
    } catch (const std::system_error&) {
      break;  // no thread to be had: the rest run on this one, after stripe 0
    }
  }
  run(0);
  for (size_t i = 1 + helpers.size(); i < fds.size(); ++i) run(i);
  for (std::thread& t : helpers) t.join();
  Status status = Status::Ok();
  for (size_t i = 0; i < fds.size(); ++i) {
    pool_.Release(fds[i], results[i]);
    if (status.ok() && !results[i].ok()) status = results[i];
  }
  return status;
}

Status TcpRemote::Write(TransferId transfer, std::span<const Segment> segments,
                        Instant deadline) {
  const OpCounters counters{stats_->writes_ok, stats_->writes_failed, stats_->bytes_written};
  const std::span<uint8_t> local = local_->bytes();
  uint64_t total = 0;
  if (Status s = CheckLocal(local, segments, /*local_is_src=*/true, "write", &total); !s.ok()) {
    return CountOutcome(std::move(s), 0, counters);
  }
  const WaitBound bound(deadline);
  if (bound.Expired()) {
    return CountOutcome(DeadlineExceededError("tcp write: the deadline passed before it started"),
                        0, counters);
  }
  const auto stripe = [&](int fd, std::span<const Segment> part) {
    return FramesOnStream(fd, part,
                          [&](int f, std::span<const Segment> frame, uint64_t frame_bytes,
                              std::vector<uint8_t>& table) {
                            return WriteFrame(f, transfer, frame, frame_bytes, local, table,
                                              bound);
                          });
  };
  const uint32_t stripes = StripeCount(total, pool_.max_streams(), stripe_min_bytes_);
  Status status = stripes <= 1
                      ? pool_.Run([&](int fd) { return stripe(fd, segments); }, bound)
                      : RunStriped(segments, stripes, bound, stripe);
  return CountOutcome(std::move(status), total, counters);
}

std::unique_ptr<PendingWrite> TcpRemote::StartWrite(TransferId transfer,
                                                    std::span<const Segment> segments,
                                                    Instant deadline) {
  const std::span<uint8_t> local = local_->bytes();
  uint64_t total = 0;
  if (!CheckLocal(local, segments, /*local_is_src=*/true, "write", &total).ok()) {
    return nullptr;  // Write fails it and says why
  }
  if (!OneFrame(segments, total) ||
      StripeCount(total, pool_.max_streams(), stripe_min_bytes_) > 1 ||
      WaitBound(deadline).Expired()) {
    return nullptr;
  }
  const int fd = pool_.TryAcquireIdle();
  if (fd < 0) return nullptr;
  return std::make_unique<TcpPendingWrite>(&pool_, fd, transfer, local, segments, total,
                                           deadline, stats_);
}

std::unique_ptr<PendingWrite> TcpRemote::StartRead(TransferId transfer,
                                                   std::span<const Segment> segments,
                                                   Instant deadline) {
  const std::span<uint8_t> local = local_->bytes();
  uint64_t total = 0;
  if (!CheckLocal(local, segments, /*local_is_src=*/false, "read", &total).ok() ||
      !OneFrame(segments, total) ||
      StripeCount(total, pool_.max_streams(), stripe_min_bytes_) > 1 ||
      WaitBound(deadline).Expired()) {
    return nullptr;  // Read fails or runs it
  }
  const int fd = pool_.TryAcquireIdle();
  if (fd < 0) return nullptr;
  return std::make_unique<TcpPendingRead>(&pool_, fd, transfer, local, segments, total, deadline,
                                          stats_);
}

Status TcpRemote::Read(TransferId transfer, std::span<const Segment> segments) {
  const OpCounters counters{stats_->reads_ok, stats_->reads_failed, stats_->bytes_read};
  const std::span<uint8_t> local = local_->bytes();
  uint64_t total = 0;
  if (Status s = CheckLocal(local, segments, /*local_is_src=*/false, "read", &total); !s.ok()) {
    return CountOutcome(std::move(s), 0, counters);
  }
  const auto stripe = [&](int fd, std::span<const Segment> part) {
    return FramesOnStream(fd, part,
                          [&](int f, std::span<const Segment> frame, uint64_t frame_bytes,
                              std::vector<uint8_t>& table) {
                            return ReadFrame(f, transfer, frame, frame_bytes, local, table);
                          });
  };
  const uint32_t stripes = StripeCount(total, pool_.max_streams(), stripe_min_bytes_);
  Status status = stripes <= 1 ? pool_.Run([&](int fd) { return stripe(fd, segments); })
                               : RunStriped(segments, stripes, WaitBound(), stripe);
  return CountOutcome(std::move(status), total, counters);
}

Status TcpRemote::WriteFrame(int fd, TransferId transfer, std::span<const Segment> frame,
                             uint64_t frame_bytes, std::span<uint8_t> local,
                             std::vector<uint8_t>& table, const WaitBound& bound) {
  if (!SendFrameHead(fd, kFrameMagic, transfer, frame, frame_bytes, table, bound)) {
    return bound.Failed(ErrnoMessage("tcp: sending a frame header"));
  }
  if (!IoSegments(fd, local.data(), frame, [](const Segment& s) { return s.src_offset; },
                  SendAllV, bound)) {
    return bound.Failed(ErrnoMessage("tcp: sending a payload"));
  }
  return RecvReply(fd, kReplyMagic, transfer, "write", bound);
}

Status TcpRemote::ReadFrame(int fd, TransferId transfer, std::span<const Segment> frame,
                            uint64_t frame_bytes, std::span<uint8_t> local,
                            std::vector<uint8_t>& table) {
  if (!SendFrameHead(fd, kReadMagic, transfer, frame, frame_bytes, table)) {
    return UnavailableError(ErrnoMessage("tcp: sending a read request"));
  }
  if (Status head = RecvReply(fd, kReadHeadMagic, transfer, "read"); !head.ok()) return head;
  if (!IoSegments(fd, local.data(), frame, [](const Segment& s) { return s.dst_offset; },
                  RecvAllV)) {
    return UnavailableError("tcp read: the payload stopped (peer closed or stalled)");
  }
  return RecvReply(fd, kReplyMagic, transfer, "read");
}

}  // namespace kvrelay::net::tcp
