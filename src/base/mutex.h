// mutex.h — Mutex, MutexLock and CondVar: std::mutex and
// std::condition_variable with clang's thread-safety annotations.
//
// Why: std::mutex carries no annotations, so clang cannot check which data
// a lock protects. These thin wrappers are what every lock in kvrelay's
// threaded layers uses, so that -Wthread-safety (see thread_annotations.h)
// proves each GUARDED_BY member is touched only under its lock. They add
// no cost: every method is an inline call to the std type.
//
//   Mutex mu_;
//   CondVar cv_;
//   bool done_ GUARDED_BY(mu_) = false;
//
//   void Finish() EXCLUDES(mu_) {
//     MutexLock lock(&mu_);
//     done_ = true;
//     cv_.NotifyAll();
//   }
//   void AwaitDone() EXCLUDES(mu_) {
//     MutexLock lock(&mu_);
//     while (!done_) cv_.Wait(&mu_);
//   }
//
// Waiting with a predicate: the predicate runs with the lock held, but the
// analysis checks a lambda as a function of its own, so a lambda that reads
// guarded members says so: `cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return done_; })`.
//
// Timed waits are generic over the caller's std::chrono types (this layer
// reads no clock itself). A Mutex is not recursive; it is neither copyable
// nor movable. Ownership: embedded in the object whose members it guards.
// Thread safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <mutex>
#include <utility>

#include "base/thread_annotations.h"

namespace kvrelay {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds this lock (where it cannot see it,
  // e.g. a callback run under it). Checks nothing at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex from construction to the end of the scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable waited on with a held Mutex. Each wait releases the
// mutex while blocked and holds it again when it returns (spurious wakeups
// included, as with std::condition_variable).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Returns once `pred()` is true.
  template <class Pred>
  void Wait(Mutex* mu, Pred pred) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock, std::move(pred));
    lock.release();
  }

  // False if `timeout` (a std::chrono::duration) passed without a notify.
  template <class Timeout>
  bool WaitFor(Mutex* mu, const Timeout& timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool notified = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return notified;
  }
  // Waits until `pred()` or `timeout`; returns `pred()`.
  template <class Timeout, class Pred>
  bool WaitFor(Mutex* mu, const Timeout& timeout, Pred pred) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool ok = cv_.wait_for(lock, timeout, std::move(pred));
    lock.release();
    return ok;
  }

  // False if `deadline` (a std::chrono::time_point) passed without a notify.
  template <class Deadline>
  bool WaitUntil(Mutex* mu, const Deadline& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool notified = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return notified;
  }
  // Waits until `pred()` or `deadline`; returns `pred()`.
  template <class Deadline, class Pred>
  bool WaitUntil(Mutex* mu, const Deadline& deadline, Pred pred) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool ok = cv_.wait_until(lock, deadline, std::move(pred));
    lock.release();
    return ok;
  }

 private:
  std::condition_variable cv_;
};

}  // namespace kvrelay
