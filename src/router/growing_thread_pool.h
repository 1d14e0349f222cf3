// growing_thread_pool.h — GrowingThreadPool: httplib's task queue for the
// router's HTTP server: threads are started as connections need them, up
// to a maximum, and kept for reuse.
//
// Why: the router serves up to --max-inflight (4096 by default) slow
// requests at once, each holding a thread while it relays; httplib's own
// ThreadPool would start all of them up front. Connections beyond the
// maximum wait in the queue for a thread (httplib accepts eagerly and its
// enqueue cannot refuse; the maximum leaves room above --max-inflight so the
// excess gets its 503 promptly).
//
// Ownership: created by httplib::Server::new_task_queue and owned by the
// server's listen loop. Thread safety: enqueue/shutdown from any thread.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include <httplib.h>

#include "base/mutex.h"

namespace kvrelay::router {

class GrowingThreadPool : public httplib::TaskQueue {
 public:
  explicit GrowingThreadPool(size_t max_threads);
  ~GrowingThreadPool() override;

  void enqueue(std::function<void()> fn) override EXCLUDES(mu_);
  // Runs what is queued, then joins every thread.
  void shutdown() override EXCLUDES(mu_);

 private:
  void Work() EXCLUDES(mu_);

  const size_t max_threads_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  size_t idle_ GUARDED_BY(mu_) = 0;   // threads waiting for a job
  bool shutdown_ GUARDED_BY(mu_) = false;
};

}  // namespace kvrelay::router
