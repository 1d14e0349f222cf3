// nonce_store.h — NonceStore: the single-use, expiring nonces that admin
// HTTP calls sign (docs/http.md, "Authentication").
//
// Why: a signed admin call must not be replayable. The server hands out a
// nonce (GET /auth/nonce); a call is accepted only with a MAC over a nonce
// that is in this store, and Consume() removes it, so the same signed
// request cannot be accepted twice, and a nonce older than `ttl` is gone.
//
// Bounded: at most `max_nonces` outstanding; issuing one more drops the
// oldest (a client whose nonce was dropped gets 401 and asks again).
//
// Pure: time arrives as `now`, nonces from the caller.
// Thread safety: none; AdminAuth serialises access.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <unordered_map>

#include "base/time.h"

namespace kvrelay::server {

class NonceStore {
 public:
  NonceStore(size_t max_nonces, Duration ttl);

  void Add(const std::string& nonce, Instant now);
  // True exactly once for a nonce added less than `ttl` before `now`.
  bool Consume(const std::string& nonce, Instant now);
  size_t size() const { return live_.size(); }

 private:
  void Prune(Instant now);

  const size_t max_nonces_;
  const Duration ttl_;
  std::unordered_map<std::string, Instant> live_;  // nonce → issued at
  std::deque<std::pair<std::string, Instant>> fifo_;  // issue order
};

}  // namespace kvrelay::server
