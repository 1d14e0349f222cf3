// client_slots.h — ClientSlots: at most N requests at once per client
// (remote address), for the engine's and the router's HTTP servers.
//
// Why: one client must not be able to take every HTTP worker, queue slot or
// relay of a server by opening connections; past its share it gets 429 at
// once, before anything is parsed or applied (`--max-requests-per-client`).
//
// A Lease is one admitted request; the slot is free again when the Lease is
// destroyed (move-only; keep it alive exactly as long as the request is,
// e.g. inside the response's content provider).
//
// Ownership: one per server; Leases must not outlive it. Thread-safe: any
// thread may Acquire, and destroy Leases.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "base/mutex.h"

namespace kvrelay::server {

class ClientSlots {
 public:
  class Lease {
   public:
    Lease(Lease&& other) noexcept : slots_(other.slots_), client_(std::move(other.client_)) {
      other.slots_ = nullptr;
    }
    Lease& operator=(Lease&& other) noexcept {
      if (this != &other) {
        Free();
        slots_ = other.slots_;
        client_ = std::move(other.client_);
        other.slots_ = nullptr;
      }
      return *this;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Free(); }

   private:
    void Free();
    friend class ClientSlots;
    Lease(ClientSlots* slots, std::string client) : slots_(slots), client_(std::move(client)) {}
    ClientSlots* slots_;   // nullptr once moved from (or with no limit)
    std::string client_;
  };

  // `max_per_client` 0: no limit (every Acquire succeeds, nothing is kept).
  explicit ClientSlots(uint32_t max_per_client) : max_(max_per_client) {}
  ClientSlots(const ClientSlots&) = delete;
  ClientSlots& operator=(const ClientSlots&) = delete;

  // A slot for `client`, or nullopt if it already holds max_per_client.
  std::optional<Lease> Acquire(const std::string& client);

  uint32_t max_per_client() const { return max_; }
  // Requests `client` holds now (tests, debug).
  uint32_t held(const std::string& client) const;

 private:
  void Release(const std::string& client) EXCLUDES(mu_);
  const uint32_t max_;
  mutable Mutex mu_;
  std::unordered_map<std::string, uint32_t> held_ GUARDED_BY(mu_);   // no zero entries
};

}  // namespace kvrelay::server
