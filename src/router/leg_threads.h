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

#include <cstdint>
#include <functional>
#include <memory>

#include "base/mutex.h"
#include "base/status.h"
#include "base/time.h"

namespace kvrelay::router {

class LegThreads : public std::enable_shared_from_this<LegThreads> {
 public:
  // Runs `fn` on a new detached thread. kResourceExhausted if the thread
  // cannot be created (fn is not run).
  Status Spawn(std::function<void()> fn) EXCLUDES(mu_);
  // Waits until no thread runs or `timeout` passed; true if none runs.
  bool WaitIdle(Duration timeout) EXCLUDES(mu_);
  uint64_t running() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  CondVar cv_;
  uint64_t running_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvrelay::router
