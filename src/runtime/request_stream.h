// request_stream.h — RequestStream: one request's output, handed from the
// engine actor to the HTTP thread serving that client.
//
// The engine thread appends tokens and finally a finish; the HTTP thread
// waits for news and reads what arrived since its cursor. Bounded by the
// request's max_tokens (the engine never emits more).
//
// Thread safety: Push/Finish from the engine thread; Wait from one reader.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kvrelay::runtime {

class RequestStream {
 public:
  explicit RequestStream(uint64_t client) : client_(client) {}
  uint64_t client() const { return client_; }

  void Push(const engine::TokenOut& t) {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.push_back(t);
    cv_.notify_all();
  }
  void Finish(engine::FinishReason reason, std::string error) {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    reason_ = reason;
    error_ = std::move(error);
    cv_.notify_all();
  }

  // Waits up to `timeout` for tokens past `*cursor` or the finish; appends
  // the new tokens to `out`, advances the cursor. True once finished and
  // every token was read.
  bool Wait(size_t* cursor, std::vector<engine::TokenOut>* out,
            std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return done_ || tokens_.size() > *cursor; });
    for (; *cursor < tokens_.size(); ++*cursor) out->push_back(tokens_[*cursor]);
    return done_;
  }
  engine::FinishReason reason() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  const uint64_t client_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<engine::TokenOut> tokens_;
  bool done_ = false;
  engine::FinishReason reason_ = engine::FinishReason::kLength;
  std::string error_;
};

}  // namespace kvrelay::runtime
