#include "router/leg_threads.h"

#include <chrono>
#include <system_error>
#include <thread>

namespace kvrelay::router {

Status LegThreads::Spawn(std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    ++running_;
  }
  std::shared_ptr<LegThreads> self = shared_from_this();
  try {
    std::thread([self, fn = std::move(fn)] {
      fn();
      LegThreads& t = *self;
      MutexLock lock(&t.mu_);
      if (--t.running_ == 0) t.cv_.NotifyAll();
    }).detach();
  } catch (const std::system_error& e) {
    MutexLock lock(&mu_);
    if (--running_ == 0) cv_.NotifyAll();
    return ResourceExhaustedError(std::string("cannot start a leg thread: ") + e.what());
  }
  return Status::Ok();
}

bool LegThreads::WaitIdle(Duration timeout) {
  MutexLock lock(&mu_);
  return cv_.WaitFor(&mu_, std::chrono::nanoseconds(timeout.ns()),
                     [&]() REQUIRES(mu_) { return running_ == 0; });
}

uint64_t LegThreads::running() const {
  MutexLock lock(&mu_);
  return running_;
}

}  // namespace kvrelay::router
