// polled_writes.h — PolledWrites: the small writes a rank's own loop drives,
// beside its control sockets, instead of handing them to a worker — and,
// in read mode, D's small reads (a read is a WriteJob whose target is
// ReadAsWrite(source), whose StartWrite is the source's StartRead).
//
// Why: waking a worker and being woken back costs two thread hand-offs,
// more than a small tcp write on an idle stream. Such a write goes out as
// one frame sent without waiting (net::PendingWrite); its reply is read
// when the rank's zmq_poll says the stream is readable. The rules a pool
// write keeps hold here too: abandoned at its give_up_at() —
// kDeadlineExceeded at its deadline (a write's pull deadline, a read's
// lease view), kUnavailable when it stalled first — and its outcome
// reported exactly once, through its job's `done`.
//
// Ownership: one per RankActor. Threading: the rank's thread only; `done`
// runs on it.
#pragma once

#include <zmq.h>

#include <memory>
#include <vector>

#include "base/time.h"
#include "runtime/writer_pool.h"

namespace kvrelay::runtime {

class PolledWrites {
 public:
  // Starts `job` if its target offers a polled write now; false (and `job`
  // untouched) if not: no such path, no idle stream, or already too late.
  // Its first step runs now; `job.done` may run before Start returns.
  bool Start(WriteJob& job);
  // Before a poll: drops the ended writes, ends those past give_up_at(), and
  // appends one poll item per running write; returns the earliest
  // give_up_at() left (Never if none).
  Instant Prepare(Instant now, std::vector<zmq_pollitem_t>* items);
  // After the poll: the write behind the `i`-th item Prepare appended is
  // ready (or failed: it finds out).
  void Progress(size_t i);
  // Shutdown: every write still waiting is dropped, its stream closed.
  void Clear() { writes_.clear(); running_.clear(); }

 private:
  struct Write {
    std::shared_ptr<net::Target> target;  // declared first: outlives `write`
    std::unique_ptr<net::PendingWrite> write;
    std::function<void(const Status&)> done;
    bool over = false;
  };
  void Step(Write& w);
  void Finish(Write& w, const Status& s);

  std::vector<std::unique_ptr<Write>> writes_;
  std::vector<Write*> running_;  // in the order Prepare appended their items
};

}  // namespace kvrelay::runtime
