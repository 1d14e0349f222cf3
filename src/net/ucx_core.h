// ucx_core.h — UcxCore: the UCX context, worker and progress thread that a
// UCX transport's regions, targets and sources share; and the small helpers
// around it (status conversion, endpoint error state, a bounded endpoint
// close).
//
// Why its own file: this is the part of the UCX transport that talks to the
// UCX worker — who may call it (the worker mutex), who progresses it (the
// progress thread, and waiting writers), and what outlives what at teardown.
// ucx_transport.cc builds the Transport (regions, the registration format,
// endpoints that put and get) on top of it.
//
// Internal to src/net: only ucx_transport.cc and ucx_core.cc include it.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/result.h"
#include "base/status.h"
#include "net/transport.h"
#include "net/ucx_transport.h"

namespace kvrelay::net::ucx {

using Clock = std::chrono::steady_clock;

inline std::string UcsError(const std::string& what, ucs_status_t status) {
  return what + ": " + ucs_status_string(status);
}

// An error of a put/flush/close: the peer or the path to it is gone.
inline Status UcsToStatus(const std::string& what, ucs_status_t status) {
  return UnavailableError(UcsError(what, status));
}

// What an endpoint's error callback writes. Owned by its UcxEndpoint, or by
// the core if the endpoint outlived the Target (a close that timed out), so
// the callback never writes to freed memory.
struct EpState {
  std::atomic<ucs_status_t> error{UCS_OK};
};

// ---------------------------------------------------------------------------
// UcxCore: the state shared by a transport's regions and targets.
//
// Owned through shared_ptr by UcxTransport, every UcxRegion's Mapping and
// every UcxEndpoint; destroyed with the last of them. Thread-safe: `mu`
// serializes all use of `worker` (and of context-level calls: mem map,
// rkey pack); `stats` are atomics.
// Invariant: while the core lives, the progress thread runs.
class UcxCore {
 public:
  static Result<std::shared_ptr<UcxCore>> Create(const TransportOptions& options);
  ~UcxCore();
  UcxCore(const UcxCore&) = delete;
  UcxCore& operator=(const UcxCore&) = delete;

  // Progresses the worker until every request in `requests` (non-null
  // UCX request handles) has completed, then returns true and sets
  // *status to the first error among them (UCS_OK if none). Returns false
  // if `deadline` passed first (some are still pending). Does not free them.
  // REQUIRES: `mu` not held.
  bool WaitRequests(const std::vector<void*>& requests, Clock::time_point deadline,
                    ucs_status_t* status) EXCLUDES(mu, epoch_mu_);

  // Frees request handles (completed or not; UCX frees a pending one when it
  // completes). REQUIRES: `mu` not held.
  void FreeRequests(const std::vector<void*>& requests) EXCLUDES(mu);

  // Keeps [addr, addr+bytes) reserved until teardown and returns its pages.
  void RetireRange(void* addr, size_t bytes) EXCLUDES(retired_mu_);
  // Keeps the state of an endpoint whose close did not finish until the
  // worker is destroyed (its error callback may still run until then).
  void AdoptOrphan(std::unique_ptr<EpState> state) EXCLUDES(retired_mu_);

  Mutex mu;  // guards every call on worker/context below
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<uint8_t> worker_address;
  TransportStats stats;

 private:
  UcxCore() = default;
  void ProgressLoop() EXCLUDES(mu);
  // Called by the progress thread after a round that made progress.
  void NoteProgress() EXCLUDES(epoch_mu_);

  int efd_ = -1;  // -1: UCX gave no event fd; the loop polls on a timeout
  std::atomic<bool> stop_{false};
  std::thread progress_thread_;

  // Wakes writers blocked in WaitRequests when the progress thread made
  // progress (so a writer need not spin for a slow tcp peer).
  Mutex epoch_mu_;
  CondVar epoch_cv_;
  uint64_t epoch_ GUARDED_BY(epoch_mu_) = 0;

  Mutex retired_mu_;
  std::vector<std::pair<void*, size_t>> retired_ GUARDED_BY(retired_mu_);
  std::vector<std::unique_ptr<EpState>> orphans_ GUARDED_BY(retired_mu_);
};

// Closes `ep`, waiting a bounded time (kEpCloseTimeout); false if the close
// had not finished by then (UCX completes it later, or the worker's
// destruction ends it).
bool CloseEp(UcxCore& core, ucp_ep_h ep) EXCLUDES(core.mu);

}  // namespace kvrelay::net::ucx
