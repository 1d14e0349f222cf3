// writer_pool.h — WriterPool: the threads that run one rank's data-plane
// writes, at most `num_workers` at once.
//
// Why a pool per rank: a write blocks (memcpy, socket, UCX flush) and must
// not stall the rank's event loop; the send table already admits at most
// num_workers writes at once (per-pull admission to a bounded sender
// pool), so the queue never holds more than that. A write whose pull
// deadline has passed when a worker picks it up is failed without touching
// a byte: no write starts after D gave up.
//
// Ownership: owned by a RankActor. Submit from the rank's thread; `done`
// runs on a worker thread (it posts back to the rank's inbox), or on the
// caller's thread for a job it runs itself with RunJob. Stop (and
// the destructor) from the owner's thread only: it joins the workers.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"
#include "net/transport.h"

namespace kvrelay::runtime {

struct WriteJob {
  std::shared_ptr<net::Target> target;
  TransferId transfer;
  std::vector<net::Segment> segments;
  uint64_t bytes = 0;
  Instant deadline;
  // Called on the worker with the outcome (OK, the write's error, or
  // kDeadlineExceeded if it never started).
  std::function<void(const Status&)> done;
};

// A target whose "write" reads the segments from `source` (P's region) into
// this rank's: read mode's reads run on the same pool as writes, and where
// a small write may run on the rank's thread (CopiesInPlace, StartWrite)
// so may a small read (the source's CopiesInPlace, StartRead).
std::shared_ptr<net::Target> ReadAsWrite(std::shared_ptr<net::Source> source);

class WriterPool {
 public:
  WriterPool(uint32_t num_workers, size_t max_queued);
  ~WriterPool();  // stops: queued jobs complete as kCancelled; joins.
  WriterPool(const WriterPool&) = delete;
  WriterPool& operator=(const WriterPool&) = delete;

  // False if the queue is full or the pool stopped (the caller fails the
  // write at once).
  bool Submit(WriteJob job) EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

  // Runs `job` on the calling thread, as a worker would: fails it with
  // kDeadlineExceeded without touching a byte if its deadline has passed,
  // else writes; then calls `done`. Workers run every job through it; a
  // caller runs a small job whose target CopiesInPlace() through it
  // directly (RankActor, `inline_write_bytes`).
  static void RunJob(WriteJob& job);

 private:
  void Run() EXCLUDES(mu_);
  const size_t max_queued_;
  Mutex mu_;
  CondVar cv_;
  std::deque<WriteJob> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  // Started by the constructor, joined and cleared by Stop: the owner's
  // thread only (Stop also reads it under mu_, where it cannot change).
  std::vector<std::thread> threads_;
};

}  // namespace kvrelay::runtime
