// client_slots.cc — see client_slots.h.
#include "server/client_slots.h"

#include "base/check.h"

namespace kvrelay::server {

void ClientSlots::Lease::Free() {
  if (slots_ != nullptr) slots_->Release(client_);
  slots_ = nullptr;
}

std::optional<ClientSlots::Lease> ClientSlots::Acquire(const std::string& client) {
  if (max_ == 0) return Lease(nullptr, client);
  MutexLock lock(&mu_);
  uint32_t& n = held_[client];
  if (n >= max_) {
    if (n == 0) held_.erase(client);
    return std::nullopt;
  }
  ++n;
  return Lease(this, client);
}

void ClientSlots::Release(const std::string& client) {
  MutexLock lock(&mu_);
  auto it = held_.find(client);
  KV_CHECK(it != held_.end() && it->second > 0);
  if (--it->second == 0) held_.erase(it);
}

uint32_t ClientSlots::held(const std::string& client) const {
  MutexLock lock(&mu_);
  auto it = held_.find(client);
  return it == held_.end() ? 0 : it->second;
}

}  // namespace kvrelay::server
