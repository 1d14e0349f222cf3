// open_requests.cc — see open_requests.h.
#include "server/open_requests.h"

#include "base/check.h"

namespace kvrelay::server {

void OpenRequests::Register(const std::string& id, uint64_t client,
                            std::optional<TransferId> transfer) {
  MutexLock lock(&mu_);
  KV_CHECK(open_.insert(client).second);  // client ids are the server's, never reused
  client_of_id_[id] = client;
  if (transfer) transfer_of_client_[client] = *transfer;
  submitting_.insert(client);
}

bool OpenRequests::Submitted(const std::string& id, uint64_t client, bool accepted) {
  MutexLock lock(&mu_);
  KV_CHECK(submitting_.erase(client) == 1);
  const bool again = aborted_early_.erase(client) == 1;
  if (!accepted) {
    auto it = client_of_id_.find(id);
    if (it != client_of_id_.end() && it->second == client) client_of_id_.erase(it);
    transfer_of_client_.erase(client);
    CloseLocked(client);
    return false;
  }
  return again;
}

void OpenRequests::TakeLocked(uint64_t client, Found* found) {
  if (submitting_.count(client) != 0) {
    aborted_early_.insert(client);
    return;
  }
  found->clients.push_back(client);
  if (auto t = transfer_of_client_.find(client); t != transfer_of_client_.end()) {
    found->transfers.push_back(t->second);
  }
}

OpenRequests::Found OpenRequests::Abort(const std::vector<std::string>& ids, bool all) {
  MutexLock lock(&mu_);
  Found found;
  if (all) {
    for (uint64_t client : open_) TakeLocked(client, &found);
  } else {
    for (const std::string& id : ids) {
      if (auto it = client_of_id_.find(id); it != client_of_id_.end()) {
        TakeLocked(it->second, &found);
      }
    }
  }
  return found;
}

std::optional<TransferId> OpenRequests::Release(const std::string& id, uint64_t client) {
  MutexLock lock(&mu_);
  KV_CHECK(submitting_.count(client) == 0);  // the response starts after Submitted
  auto it = client_of_id_.find(id);
  if (it != client_of_id_.end() && it->second == client) client_of_id_.erase(it);
  CloseLocked(client);
  std::optional<TransferId> transfer;
  if (auto t = transfer_of_client_.find(client); t != transfer_of_client_.end()) {
    transfer = t->second;
    transfer_of_client_.erase(t);
  }
  return transfer;
}

void OpenRequests::CloseLocked(uint64_t client) {
  open_.erase(client);
  if (open_.empty()) none_open_.NotifyAll();
}

bool OpenRequests::WaitUntilNoneOpen(std::chrono::milliseconds timeout) {
  MutexLock lock(&mu_);
  return none_open_.WaitFor(&mu_, timeout, [this]() REQUIRES(mu_) { return open_.empty(); });
}

size_t OpenRequests::open() const {
  MutexLock lock(&mu_);
  return open_.size();
}

size_t OpenRequests::submitting() const {
  MutexLock lock(&mu_);
  return submitting_.size();
}

}  // namespace kvrelay::server
