// request_stream.h — RequestStream: one request's output, handed from the
// engine actor to the HTTP thread serving that client.
//
// The engine thread appends tokens and finally a finish; the reader is told
// by its listener (or waits) and reads what arrived since its cursor.
// Bounded by the request's max_tokens (the engine never emits more).
//
// Thread safety: Push/Finish from the engine thread; Wait from one reader at
// a time; SetListener from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "engine/engine.h"

namespace kvrelay::runtime {

class RequestStream {
 public:
  explicit RequestStream(uint64_t client) : client_(client) {}
  uint64_t client() const { return client_; }

  void Push(const engine::TokenOut& t) EXCLUDES(mu_) {
    std::function<void()> listener;
    {
      MutexLock lock(&mu_);
      tokens_.push_back(t);
      cv_.NotifyAll();
      listener = listener_;
    }
    if (listener) listener();
  }
  void Finish(engine::FinishReason reason, std::string error) EXCLUDES(mu_) {
    std::function<void()> listener;
    {
      MutexLock lock(&mu_);
      done_ = true;
      reason_ = reason;
      error_ = std::move(error);
      cv_.NotifyAll();
      listener = listener_;
    }
    if (listener) listener();
  }

  // `fn` runs after every Push and the Finish, on the pushing thread (the
  // engine's): it must only hand off (post), never block. Runs once at once
  // so nothing pushed before it was set is missed. An empty fn clears it
  // (which breaks a reference cycle through the listener's captures).
  void SetListener(std::function<void()> fn) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      listener_ = fn;
    }
    if (fn) fn();
  }

  // Waits up to `timeout` for tokens past `*cursor` or the finish; appends
  // the new tokens to `out`, advances the cursor. True once finished and
  // every token was read.
  bool Wait(size_t* cursor, std::vector<engine::TokenOut>* out,
            std::chrono::milliseconds timeout) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, timeout,
                [&]() REQUIRES(mu_) { return done_ || tokens_.size() > *cursor; });
    for (; *cursor < tokens_.size(); ++*cursor) out->push_back(tokens_[*cursor]);
    return done_;
  }
  engine::FinishReason reason() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return reason_;
  }
  std::string error() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return error_;
  }

 private:
  const uint64_t client_;
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<engine::TokenOut> tokens_ GUARDED_BY(mu_);
  bool done_ GUARDED_BY(mu_) = false;
  engine::FinishReason reason_ GUARDED_BY(mu_) = engine::FinishReason::kLength;
  std::string error_ GUARDED_BY(mu_);
  std::function<void()> listener_ GUARDED_BY(mu_);
};

}  // namespace kvrelay::runtime
