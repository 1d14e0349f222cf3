#include "router/leg_threads.h"

#include <chrono>
#include <system_error>
#include <thread>

namespace kvrelay::router {

Status LegThreads::Spawn(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++running_;
  }
  std::shared_ptr<LegThreads> self = shared_from_this();
  try {
    std::thread([self, fn = std::move(fn)] {
      fn();
      std::lock_guard<std::mutex> lock(self->mu_);
      if (--self->running_ == 0) self->cv_.notify_all();
    }).detach();
  } catch (const std::system_error& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_ == 0) cv_.notify_all();
    return ResourceExhaustedError(std::string("cannot start a leg thread: ") + e.what());
  }
  return Status::Ok();
}

bool LegThreads::WaitIdle(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::nanoseconds(timeout.ns()),
                      [&] { return running_ == 0; });
}

uint64_t LegThreads::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

}  // namespace kvrelay::router
