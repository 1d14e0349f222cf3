// ucx_core.cc — UcxCore: context, worker, progress thread; see ucx_core.h.
#include "net/ucx_core.h"

#include <poll.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/check.h"

namespace kvrelay::net::ucx {
namespace {

// How long closing an endpoint may take before we let UCX finish it alone.
constexpr auto kEpCloseTimeout = std::chrono::seconds(5);
// The progress thread's poll() bound: the efd wakes it; this only covers
// an event consumed by a writer's progress call between arm and poll.
constexpr int kProgressPollTimeoutMs = 50;
// Progress calls per hold of the worker mutex by the progress thread, so
// a busy target does not starve writers.
constexpr int kProgressBurst = 64;
// A waiting writer spins this many idle progress calls before it blocks
// (briefly) for the progress thread to report progress.
constexpr int kWriterIdleSpins = 64;
constexpr auto kWriterBlockBound = std::chrono::milliseconds(1);

}  // namespace

Result<std::shared_ptr<UcxCore>> UcxCore::Create(const TransportOptions& options) {
  std::shared_ptr<UcxCore> core(new UcxCore());

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UnavailableError(UcsError("ucx: ucp_config_read", st));
  if (!options.ucx_tls.empty()) {
    st = ucp_config_modify(config, "TLS", options.ucx_tls.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return UnavailableError(UcsError("ucx: TLS=" + options.ucx_tls, st));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;  // one worker, serialized by our mutex
  params.name = "kvrelay";
  st = ucp_init(&params, config, &core->context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    core->context = nullptr;
    return UnavailableError(UcsError("ucx: ucp_init", st));
  }

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(core->context, &wparams, &core->worker);
  if (st != UCS_OK) {
    core->worker = nullptr;
    return UnavailableError(UcsError("ucx: ucp_worker_create", st));
  }

  ucp_address_t* address = nullptr;
  size_t address_len = 0;
  st = ucp_worker_get_address(core->worker, &address, &address_len);
  if (st != UCS_OK) return UnavailableError(UcsError("ucx: ucp_worker_get_address", st));
  const auto* p = reinterpret_cast<const uint8_t*>(address);
  core->worker_address.assign(p, p + address_len);
  ucp_worker_release_address(core->worker, address);
  if (core->worker_address.empty() || core->worker_address.size() > kUcxMaxBlobBytes) {
    return UnavailableError("ucx: worker address of " + std::to_string(address_len) +
                            " bytes (limit " + std::to_string(kUcxMaxBlobBytes) + ")");
  }

  int efd = -1;
  if (ucp_worker_get_efd(core->worker, &efd) == UCS_OK) core->efd_ = efd;

  core->progress_thread_ = std::thread([c = core.get()] { c->ProgressLoop(); });
  return core;
}

UcxCore::~UcxCore() {
  if (progress_thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    ucp_worker_signal(worker);  // safe from any thread; wakes the poll()
    progress_thread_.join();
  }
  // Every endpoint and memory handle holds a reference to this core, so
  // they are gone by now.
  if (worker != nullptr) ucp_worker_destroy(worker);
  if (context != nullptr) ucp_cleanup(context);
  for (auto& [addr, bytes] : retired_) munmap(addr, bytes);
}

void UcxCore::ProgressLoop() {
  while (!stop_.load(std::memory_order_acquire)) {
    unsigned progressed = 0;
    ucs_status_t armed = UCS_ERR_UNSUPPORTED;
    {
      MutexLock lock(&mu);
      int burst = 0;
      unsigned n = 0;
      while (burst < kProgressBurst && (n = ucp_worker_progress(worker)) != 0) {
        progressed += n;
        ++burst;
      }
      // Arm only when drained: a full burst means more work is waiting.
      if (burst < kProgressBurst && efd_ >= 0) {
        armed = ucp_worker_arm(worker);
      } else if (burst >= kProgressBurst) {
        armed = UCS_ERR_BUSY;
      }
    }
    if (progressed != 0) NoteProgress();
    if (armed == UCS_ERR_BUSY) continue;
    if (stop_.load(std::memory_order_acquire)) break;
    pollfd pfd{};
    pfd.fd = efd_;
    pfd.events = POLLIN;
    // Without an armed efd this is a plain bounded wait for the next round.
    poll(armed == UCS_OK ? &pfd : nullptr, armed == UCS_OK ? 1 : 0,
         kProgressPollTimeoutMs);
  }
}

void UcxCore::NoteProgress() {
  {
    MutexLock lock(&epoch_mu_);
    ++epoch_;
  }
  epoch_cv_.NotifyAll();
}

bool UcxCore::WaitRequests(const std::vector<void*>& requests, Clock::time_point deadline,
                           ucs_status_t* status) {
  size_t next = 0;  // requests before `next` have completed
  ucs_status_t& first_error = *status;
  first_error = UCS_OK;
  int idle = 0;
  for (;;) {
    uint64_t epoch_seen;
    {
      MutexLock lock(&epoch_mu_);
      epoch_seen = epoch_;
    }
    unsigned progressed;
    {
      MutexLock lock(&mu);
      progressed = ucp_worker_progress(worker);
      while (next < requests.size()) {
        ucs_status_t st = ucp_request_check_status(requests[next]);
        if (st == UCS_INPROGRESS) break;
        if (st != UCS_OK && first_error == UCS_OK) first_error = st;
        ++next;
      }
    }
    if (next == requests.size()) return true;
    if (Clock::now() >= deadline) return false;
    if (progressed != 0) {
      idle = 0;
      continue;
    }
    if (++idle < kWriterIdleSpins) {
      std::this_thread::yield();
      continue;
    }
    // Nothing to do here for a while: let the progress thread (woken by the
    // worker's efd) drive, and come back when it made progress.
    MutexLock lock(&epoch_mu_);
    epoch_cv_.WaitFor(&epoch_mu_, kWriterBlockBound,
                      [&]() REQUIRES(epoch_mu_) { return epoch_ != epoch_seen; });
  }
}

void UcxCore::AdoptOrphan(std::unique_ptr<EpState> state) {
  MutexLock lock(&retired_mu_);
  orphans_.push_back(std::move(state));
}

void UcxCore::FreeRequests(const std::vector<void*>& requests) {
  MutexLock lock(&mu);
  for (void* r : requests) ucp_request_free(r);
}

void UcxCore::RetireRange(void* addr, size_t bytes) {
  // Private anonymous memory: DONTNEED drops the pages; the range stays
  // ours and reads as zeros.
  madvise(addr, bytes, MADV_DONTNEED);
  MutexLock lock(&retired_mu_);
  retired_.emplace_back(addr, bytes);
}

bool CloseEp(UcxCore& core, ucp_ep_h ep) EXCLUDES(core.mu) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // Every Write flushed before returning, so a flush close has nothing to
  // push except after a failed or timed-out Write; it tells the peer we
  // are leaving. With error mode PEER a dead peer fails the close, which
  // completes the request.
  param.flags = 0;
  void* req;
  {
    MutexLock lock(&core.mu);
    req = ucp_ep_close_nbx(ep, &param);
  }
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return true;
  std::vector<void*> reqs{req};
  ucs_status_t ignored;  // an error closing is the peer's problem, not ours
  bool done = core.WaitRequests(reqs, Clock::now() + kEpCloseTimeout, &ignored);
  core.FreeRequests(reqs);
  return done;
}

}  // namespace kvrelay::net::ucx
