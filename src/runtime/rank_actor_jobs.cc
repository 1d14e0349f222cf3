// rank_actor_jobs.cc — RankActor's data-plane jobs: a write P runs for a
// pull (StartWriteJob) and a read D runs under a lease (StartReadJob), the
// checks on the peer's block ids before planning, and where each job runs.
//
// Why a file of its own: rank_actor.cc is the control channel (sockets,
// frames, heartbeats), rank_actor_handshake.cc the handshakes; this is the
// part that moves bytes and decides which thread moves them. A small write
// or read that cannot block runs on the rank's thread: a local copy (shm)
// at once, a tcp frame or read request as a polled job the loop drives
// (sent without waiting, the rest polled beside the control sockets).
// Every other job goes to the rank's WriterPool and its outcome comes back
// through the inbox.
//
// Thread safety: every function here runs on the rank's thread, except the
// jobs' `done` callbacks of pool jobs, which run on a worker and only count
// and post back (CountWrite, CountRead and the counters are atomics).
#include <memory>
#include <string>

#include "net/write_plan.h"
#include "os/clock.h"
#include "os/log.h"
#include "runtime/rank_actor.h"

namespace kvrelay::runtime {


std::optional<WriteJob> RankActor::PlanJob(const RankGeometry& p, const RankGeometry& d,
                                           const std::vector<BlockId>& src,
                                           const std::vector<BlockId>& dst, bool read) {
  if (!net::BlocksFit(src, p.blocks, dst, d.blocks)) {  // the peer's ids
    ++driver_malformed_;
    LogOnce("rank", read ? "bad_src" : "bad_dst",
            "rank " + std::to_string(options_.rank) +
                (read ? ": a grant named blocks outside P's pool (or a different count than "
                        "the load); failing its read"
                      : ": a pull named blocks outside D's pool (or a different count than "
                        "the send holds); failing its write"));
    return std::nullopt;
  }
  WriteJob job;
  job.segments = net::PlanWrite(options_.shape, p.tp, p.rank, p.blocks, d.tp, d.rank, d.blocks,
                                src, dst);
  for (const net::Segment& seg : job.segments) job.bytes += seg.bytes;
  return job;
}

void RankActor::StartReadJob(StartRead r) {
  const ProducerPeer* p = session_.ProducerOf(r.peer);
  auto it = p == nullptr ? conns_.end() : conns_.find({p->engine, p->rank});
  if (it == conns_.end() || it->second.source == nullptr) {
    deferred_read_done_.emplace_back(r.read, false);  // gone, or not readable
    return;
  }
  const Conn& c = it->second;
  std::optional<WriteJob> planned =
      PlanJob({p->tp, p->rank, p->num_blocks}, {options_.tp, options_.rank, options_.num_blocks},
              r.src, r.dst, /*read=*/true);
  if (!planned) {
    deferred_read_done_.emplace_back(r.read, false);
    return;
  }
  WriteJob job = std::move(*planned);
  job.target = ReadAsWrite(c.source);
  job.transfer = r.transfer;
  job.deadline = r.deadline;
  const ReadId id = r.read;
  const uint64_t bytes = job.bytes;
  const std::pair<uint32_t, uint32_t> key{c.engine, c.rank};
  const std::weak_ptr<net::Source> source = c.source;
  // A small read runs on this thread, as a small write does (below): an
  // shm copy at once, its outcome queued before Pump looks again; a tcp
  // request as a PendingWrite the loop drives, its outcome on a later turn.
  if (bytes <= options_.inline_write_bytes) {
    job.done = [this, id, bytes, key, source](const Status& s) {
      CountRead(s, bytes);
      OnReadJobDone(id, key, source, s.ok(), s.code() == StatusCode::kUnavailable);
    };
    if (job.target->CopiesInPlace()) {
      ++counters_.reads_inline;
      WriterPool::RunJob(job);
      return;
    }
    // r.deadline is the last instant a read may start; one that started
    // must land by the lease view, read_margin later (docs/read-mode.md,
    // "The read margin"), so a polled read is given up there.
    if (MonoNow() < r.deadline) {
      job.deadline = r.deadline + options_.timings.read_margin;
      if (polled_.Start(job)) {
        ++counters_.reads_inline;
        return;
      }
      job.deadline = r.deadline;
    }
  }
  job.done = [this, id, bytes, key, source](const Status& s) {
    CountRead(s, bytes);
    const bool ok = s.ok();
    const bool broken = s.code() == StatusCode::kUnavailable;
    inbox_.Post(
        [this, id, ok, broken, key, source] { OnReadJobDone(id, key, source, ok, broken); });
  };
  if (!writers_->Submit(std::move(job))) deferred_read_done_.emplace_back(id, false);
}

void RankActor::CountRead(const Status& s, uint64_t bytes) {
  if (s.ok()) {
    ++counters_.reads_ok;
    counters_.bytes_read += bytes;
  } else {
    ++counters_.reads_failed;
    LogOnce("rank", "read:" + std::string(StatusCodeName(s.code())),
            "rank " + std::to_string(options_.rank) + ": a read failed: " + s.ToString());
  }
}

void RankActor::OnReadJobDone(ReadId id, std::pair<uint32_t, uint32_t> key,
                              const std::weak_ptr<net::Source>& source, bool ok, bool broken) {
  deferred_read_done_.emplace_back(id, ok);
  // A source that lost its P stays failed: reopen on the next handshake.
  // Only the source this read used: one reopened since (P restarted) is
  // left alone.
  auto conn = conns_.find(key);
  if (broken && conn != conns_.end() && conn->second.source != nullptr &&
      conn->second.source == source.lock()) {
    conn->second.source.reset();
    session_.OnSourceBroken(key.first, key.second);
  }
}

void RankActor::StartWriteJob(StartWrite w) {
  const ConsumerPeer* d = session_.ConsumerOf(w.peer);
  auto t = targets_.find(w.peer.index);
  if (d == nullptr || t == targets_.end() || t->second.peer != w.peer ||
      t->second.target == nullptr) {
    deferred_write_done_.emplace_back(w.write, false);  // gone, or its target broke
    return;
  }
  std::optional<WriteJob> planned =
      PlanJob({options_.tp, options_.rank, options_.num_blocks}, {d->tp, d->rank, d->num_blocks},
              w.src, w.dst, /*read=*/false);
  if (!planned) {
    deferred_write_done_.emplace_back(w.write, false);
    return;
  }
  WriteJob job = std::move(*planned);
  const std::shared_ptr<net::Target> target = t->second.target;
  job.target = target;
  job.transfer = w.transfer;
  job.deadline = w.deadline;
  const WriteId id = w.write;
  const PeerId peer = w.peer;
  const uint64_t bytes = job.bytes;
  const Instant started = MonoNow();
  // On this thread: the outcome is queued before Pump looks again, so the
  // answer leaves in this same turn of the loop.
  auto here = [this, id, peer, bytes, started](const Status& s) {
    CountWrite(s, bytes, started);
    OnWriteJobDone(id, peer, s.ok(), s.code() == StatusCode::kUnavailable);
  };
  if (bytes <= options_.inline_write_bytes && target->CopiesInPlace()) {
    ++counters_.writes_inline;  // a copy between local mappings, now
    job.done = here;
    WriterPool::RunJob(job);
    return;
  }
  if (bytes <= options_.inline_write_bytes) {
    job.done = here;  // a tcp frame sent without waiting, its reply polled
    if (polled_.Start(job)) {
      ++counters_.writes_inline;
      return;
    }
  }
  job.done = [this, id, peer, bytes, started](const Status& s) {
    CountWrite(s, bytes, started);
    const bool ok = s.ok();
    const bool broken = s.code() == StatusCode::kUnavailable;
    inbox_.Post([this, id, ok, broken, peer] { OnWriteJobDone(id, peer, ok, broken); });
  };
  if (!writers_->Submit(std::move(job))) deferred_write_done_.emplace_back(id, false);
}

void RankActor::CountWrite(const Status& s, uint64_t bytes, Instant started) {
  if (s.ok()) {
    ++counters_.writes_ok;
    counters_.bytes_written += bytes;
    if (sink_.write) sink_.write((MonoNow() - started).seconds());
  } else {
    ++counters_.writes_failed;
    LogOnce("rank", "write:" + std::string(StatusCodeName(s.code())),
            "rank " + std::to_string(options_.rank) + ": a write failed: " + s.ToString());
  }
}

void RankActor::OnWriteJobDone(WriteId id, PeerId peer, bool ok, bool broken) {
  deferred_write_done_.emplace_back(id, ok);
  // A transport that lost its peer stays failed: reopen on the next
  // handshake (D resends one every heartbeat).
  auto t = targets_.find(peer.index);
  if (broken && t != targets_.end() && t->second.peer == peer) {
    t->second.target.reset();
    session_.OnTargetBroken(peer);
  }
}

}  // namespace kvrelay::runtime
