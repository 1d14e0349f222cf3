// engine_pool.h — EnginePool: the engines behind the router, what each
// one's /kv_info said, whether it is up, and how many legs are in flight to
// it; picks the P and D of each request.
//
// Why: the router must know each engine's engine_id, kv host/port and tp to
// build the D leg, must spread load (least outstanding legs, round-robin on
// ties: engine_picker.h), and must stop sending to an engine that went away
// and notice when it is back, possibly restarted with new values.
//
// Life of an engine entry:
//   unknown  --DiscoverOnce answers-->  up
//   up       --ReportConnectionFailure-->  down (recheck at once)
//   up       --RequestRecheck-->  up, rechecked at once (values may change)
//   down     --a recheck answers and fits-->  up (with the new values)
// The monitor (MonitorLoop, on its own thread) rechecks engines asked for at
// once and engines that are down every `interval`. An engine whose answer
// no longer fits (another role or model) stays down, logged.
//
// An engine given in both --prefill and --decode is one entry (its load is
// shared). Outstanding counts are held by Lease objects: a Lease is taken
// for each leg by Pick() and gives its count back when destroyed.
//
// Ownership: shared (std::shared_ptr) by the server, the relays and the
// leases, so a late leg never outlives it. Thread safety: every method may
// be called from any thread; the fetcher runs without the lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "base/result.h"
#include "base/time.h"
#include "router/engine_info.h"

namespace kvrelay::router {

// GET url/kv_info with the given timeout, parsed.
Result<EngineInfo> FetchEngineInfo(const std::string& url, Duration timeout);

class EnginePool : public std::enable_shared_from_this<EnginePool> {
 public:
  using Fetcher = std::function<Result<EngineInfo>(const std::string& url)>;

  // kInvalidArgument for a malformed URL or an empty list.
  static Result<std::shared_ptr<EnginePool>> Create(const std::vector<std::string>& prefill,
                                                    const std::vector<std::string>& decode,
                                                    Fetcher fetcher);

  // One leg's claim on an engine: counts as outstanding until destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }
    void Release();
    bool valid() const { return pool_ != nullptr; }
    size_t index() const { return index_; }
    const std::string& url() const { return url_; }
    const EngineInfo& info() const { return info_; }   // as known at Pick()

   private:
    friend class EnginePool;
    std::shared_ptr<EnginePool> pool_;
    size_t index_ = 0;
    std::string url_;
    EngineInfo info_;
  };
  struct Pair {
    Lease prefill, decode;
  };

  // Asks every engine not yet known for its /kv_info, once. OK when every
  // engine is known; kUnavailable listing those that did not answer;
  // kFailedPrecondition (not worth retrying) when an engine's role does not
  // fit its list or engines disagree on the model or transport.
  Status DiscoverOnce();

  // A P and a D for one request (least outstanding, round-robin on ties),
  // each counted outstanding. kUnavailable if no P or no D is up.
  Result<Pair> Pick();
  // A D that is up (least outstanding), not counted: for GET /v1/models.
  std::optional<std::string> AnyDecodeUrl();

  // A leg to engine `index` failed to connect or lost its connection: down
  // until its /kv_info answers again.
  void ReportConnectionFailure(size_t index);
  // Re-read engine `index`'s /kv_info soon (it may have restarted).
  void RequestRecheck(size_t index);

  // Rechecks engines (see the header comment) until StopMonitor().
  void MonitorLoop(Duration interval);
  void StopMonitor();

  size_t size() const { return UrlsSize(); }
  const std::string& url(size_t index) const { return UrlOf(index); }
  uint64_t outstanding(size_t index) const;
  bool up(size_t index) const;
  // GET /engines: [{"url","role","up","outstanding","kv_info"}].
  nlohmann::json EnginesJson() const;
  // For GET /health: {"prefill":[{"url","up","outstanding"}],"decode":[...]},
  // and whether at least one P and one D are up.
  nlohmann::json HealthJson(bool* serving) const;

 private:
  struct Entry {
    std::string url;
    bool prefill = false, decode = false;   // lists it was given in
    std::optional<EngineInfo> info;         // last good answer
    bool up = false;
    bool recheck = false;                   // recheck at once
    uint64_t outstanding = 0;
  };
  EnginePool(std::vector<Entry> engines, Fetcher fetcher);
  Status Fits(const Entry& e, const EngineInfo& info) const REQUIRES(mu_);
  void Recheck(bool all_down) EXCLUDES(mu_);
  void Return(size_t index) EXCLUDES(mu_);
  const char* RoleOf(const Entry& e) const;
  // engines_'s size and each entry's url never change after construction,
  // so they are read without the lock (the analysis cannot know that).
  size_t UrlsSize() const NO_THREAD_SAFETY_ANALYSIS { return engines_.size(); }
  const std::string& UrlOf(size_t index) const NO_THREAD_SAFETY_ANALYSIS {
    return engines_[index].url;
  }

  const Fetcher fetcher_;
  mutable Mutex mu_;
  CondVar monitor_cv_;
  bool monitor_stop_ GUARDED_BY(mu_) = false;
  std::vector<Entry> engines_ GUARDED_BY(mu_);  // fixed size (see UrlOf)
  std::vector<size_t> prefill_, decode_;  // indices into engines_; fixed at construction
  size_t prefill_cursor_ GUARDED_BY(mu_) = 0;
  size_t decode_cursor_ GUARDED_BY(mu_) = 0;
  // The first engine's answer: model and transport all must share.
  std::optional<EngineInfo> reference_ GUARDED_BY(mu_);
};

}  // namespace kvrelay::router
