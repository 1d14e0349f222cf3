// leg_threads.h — LegThreads: starts the legs' threads detached and counts
// them, so shutdown can wait (bounded) for every leg to end.
//
// Why: a leg's thread may outlive the client's response (a cancelled leg
// still tearing its connection down; a P leg finishing after D), so nothing
// request-scoped can join it; the server waits for the count to reach zero.
//
// Ownership: shared (std::shared_ptr) by the server and every running
// thread. Thread safety: any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "base/status.h"
#include "base/time.h"

namespace kvrelay::router {

class LegThreads : public std::enable_shared_from_this<LegThreads> {
 public:
  // Runs `fn` on a new detached thread. kResourceExhausted if the thread
  // cannot be created (fn is not run).
  Status Spawn(std::function<void()> fn);
  // Waits until no thread runs or `timeout` passed; true if none runs.
  bool WaitIdle(Duration timeout);
  uint64_t running() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t running_ = 0;   // guarded by mu_
};

}  // namespace kvrelay::router
