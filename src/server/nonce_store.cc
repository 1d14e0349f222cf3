// nonce_store.cc — see nonce_store.h.
#include "server/nonce_store.h"

#include "base/check.h"

namespace kvrelay::server {

NonceStore::NonceStore(size_t max_nonces, Duration ttl) : max_nonces_(max_nonces), ttl_(ttl) {
  KV_CHECK_GT(max_nonces_, 0u);
}

void NonceStore::Prune(Instant now) {
  // fifo_ may hold entries already consumed; live_ is the truth.
  while (!fifo_.empty() &&
         (now - fifo_.front().second >= ttl_ || live_.size() > max_nonces_ ||
          live_.count(fifo_.front().first) == 0 ||
          live_.at(fifo_.front().first) != fifo_.front().second)) {
    auto it = live_.find(fifo_.front().first);
    if (it != live_.end() && it->second == fifo_.front().second) live_.erase(it);
    fifo_.pop_front();
  }
}

void NonceStore::Add(const std::string& nonce, Instant now) {
  Prune(now);
  if (live_.size() >= max_nonces_ && !fifo_.empty()) {
    auto it = live_.find(fifo_.front().first);
    if (it != live_.end() && it->second == fifo_.front().second) live_.erase(it);
    fifo_.pop_front();
    Prune(now);
  }
  live_[nonce] = now;
  fifo_.emplace_back(nonce, now);
  if (fifo_.size() > 2 * max_nonces_) {  // consumed entries in the middle: compact
    std::deque<std::pair<std::string, Instant>> kept;
    for (auto& e : fifo_) {
      auto it = live_.find(e.first);
      if (it != live_.end() && it->second == e.second) kept.push_back(std::move(e));
    }
    fifo_ = std::move(kept);
  }
}

bool NonceStore::Consume(const std::string& nonce, Instant now) {
  Prune(now);
  auto it = live_.find(nonce);
  if (it == live_.end()) return false;
  const bool fresh = now - it->second < ttl_;
  live_.erase(it);
  return fresh;
}

}  // namespace kvrelay::server
