#include "router/growing_thread_pool.h"

#include "base/check.h"

namespace kvrelay::router {

GrowingThreadPool::GrowingThreadPool(size_t max_threads) : max_threads_(max_threads) {
  KV_CHECK_GT(max_threads, 0u);
}

GrowingThreadPool::~GrowingThreadPool() { shutdown(); }

void GrowingThreadPool::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(fn));
  if (jobs_.size() > idle_ && threads_.size() < max_threads_) {
    threads_.emplace_back([this] { Work(); });
  }
  cv_.notify_one();
}

void GrowingThreadPool::Work() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++idle_;
      cv_.wait(lock, [&] { return shutdown_ || !jobs_.empty(); });
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
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

}  // namespace kvrelay::router
