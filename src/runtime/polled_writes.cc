#include "runtime/polled_writes.h"

#include <algorithm>

namespace kvrelay::runtime {

bool PolledWrites::Start(WriteJob& job) {
  std::unique_ptr<net::PendingWrite> pending =
      job.target->StartWrite(job.transfer, job.segments, job.deadline);
  if (pending == nullptr) return false;
  auto w = std::make_unique<Write>();
  w->target = job.target;
  w->write = std::move(pending);
  w->done = std::move(job.done);
  Step(*w);
  if (!w->over) writes_.push_back(std::move(w));
  return true;
}

Instant PolledWrites::Prepare(Instant now, std::vector<zmq_pollitem_t>* items) {
  std::erase_if(writes_, [](const auto& w) { return w->over; });
  running_.clear();
  Instant next = Instant::Never();
  for (auto& w : writes_) {
    const Instant give_up = w->write->give_up_at();
    if (now >= give_up) {
      Finish(*w, w->write->GiveUp());
      continue;
    }
    next = std::min(next, give_up);
    const short events = w->write->wants_write() ? ZMQ_POLLOUT : ZMQ_POLLIN;
    items->push_back(zmq_pollitem_t{nullptr, w->write->fd(), events, 0});
    running_.push_back(w.get());
  }
  return next;
}

void PolledWrites::Progress(size_t i) { Step(*running_.at(i)); }

void PolledWrites::Step(Write& w) {
  if (w.over) return;
  if (std::optional<Status> s = w.write->Progress()) Finish(w, *s);
}

void PolledWrites::Finish(Write& w, const Status& s) {
  w.over = true;
  w.write.reset();  // its stream goes back to the pool before the outcome is told
  w.done(s);
}

}  // namespace kvrelay::runtime
