// inbox.h — Inbox: an actor's bounded queue of closures, with a wakeup fd.
//
// Why closures: each actor (engine, rank connector) owns its state and is
// the only thread that touches it; everyone else asks it to do something
// by posting a closure that runs on its thread. The bound keeps a stuck
// actor from growing memory without limit: Post blocks while the inbox is
// full (backpressure), TryPost refuses.
//
// The eventfd lets an actor that also waits on sockets (zmq_poll) wake on
// a post; actors without sockets wait on the condition variable.
//
// Thread safety: Post/TryPost from any thread; Take from the owner.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>

#include "base/check.h"
#include "base/mutex.h"

namespace kvrelay::runtime {

class Inbox {
 public:
  using Fn = std::function<void()>;
  explicit Inbox(size_t capacity) : capacity_(capacity) {
    fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    KV_CHECK_GE(fd_, 0);
  }
  ~Inbox() { close(fd_); }
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Blocks while full. False once closed (the closure is dropped).
  bool Post(Fn fn) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    not_full_.Wait(&mu_, [&]() REQUIRES(mu_) { return closed_ || q_.size() < capacity_; });
    if (closed_) return false;
    q_.push_back(std::move(fn));
    Notify();
    return true;
  }
  // False if full or closed.
  bool TryPost(Fn fn) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (closed_ || q_.size() >= capacity_) return false;
    q_.push_back(std::move(fn));
    Notify();
    return true;
  }
  // Owner: moves every queued closure into `out`.
  void Take(std::deque<Fn>* out) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    out->swap(q_);
    q_.clear();
    uint64_t v;
    while (read(fd_, &v, sizeof v) == sizeof v) {
    }
    not_full_.NotifyAll();
  }
  // Owner: waits until something is queued, `wake` is set, or `until`.
  template <class Clock, class Dur>
  void WaitUntil(std::chrono::time_point<Clock, Dur> until) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    nonempty_.WaitUntil(&mu_, until,
                        [&]() REQUIRES(mu_) { return !q_.empty() || kicked_ || closed_; });
    kicked_ = false;
  }
  // Wakes the owner without a closure (e.g. new reports elsewhere).
  void Kick() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    kicked_ = true;
    Notify();
  }
  void Close() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    closed_ = true;
    Notify();
    not_full_.NotifyAll();
  }
  bool closed() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return closed_;
  }
  size_t size() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return q_.size();
  }
  int fd() const { return fd_; }

 private:
  void Notify() REQUIRES(mu_) {
    nonempty_.NotifyOne();
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof one);
  }
  const size_t capacity_;
  mutable Mutex mu_;
  CondVar nonempty_, not_full_;
  std::deque<Fn> q_ GUARDED_BY(mu_);
  bool kicked_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  int fd_ = -1;
};

}  // namespace kvrelay::runtime
