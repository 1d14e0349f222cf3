#include "router/growing_thread_pool.h"

#include "base/check.h"

namespace kvrelay::router {

GrowingThreadPool::GrowingThreadPool(size_t max_threads) : max_threads_(max_threads) {
  KV_CHECK_GT(max_threads, 0u);
}

GrowingThreadPool::~GrowingThreadPool() { shutdown(); }

void GrowingThreadPool::enqueue(std::function<void()> fn) {
  MutexLock lock(&mu_);
  jobs_.push_back(std::move(fn));
  if (jobs_.size() > idle_ && threads_.size() < max_threads_) {
    threads_.emplace_back([this] { Work(); });
  }
  cv_.NotifyOne();
}

void GrowingThreadPool::Work() {
  while (true) {
    std::function<void()> job;
    {
      MutexLock lock(&mu_);
      ++idle_;
      cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return shutdown_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;   // shutdown_ and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void GrowingThreadPool::shutdown() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    shutdown_ = true;
    threads.swap(threads_);
  }
  cv_.NotifyAll();
  for (std::thread& t : threads) t.join();
}

}  // namespace kvrelay::router
