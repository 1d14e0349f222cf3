// chaos_monitor.h — what `kvrelay chaos` reads from running engines: a
// monitor thread that records the oldest live send, load and (read mode)
// lease each engine ever showed (the "every pull answered or given up
// within its bound" check), and the end-of-case snapshot of one engine.
//
// Why a monitor: a transfer that outlives its bound and then ends is gone
// by the time the case ends; only sampling during the case sees it. The
// sample period bounds how much of a violation can be missed.
//
// Ownership: the runner owns an EngineMonitor; its thread is joined by
// Stop() or the destructor. Threading: Worst() may be called from any
// thread; engines that do not answer (killed) are skipped, not errors.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "bench/chaos_verdict.h"

namespace kvrelay {

class EngineMonitor {
 public:
  EngineMonitor(std::vector<std::string> urls, double period_s);
  ~EngineMonitor() { Stop(); }
  EngineMonitor(const EngineMonitor&) = delete;
  EngineMonitor& operator=(const EngineMonitor&) = delete;
  void Stop();
  using Worst = TransferAges;
  Worst WorstOf(const std::string& url) const EXCLUDES(mu_);

 private:
  void Run() EXCLUDES(mu_);
  const std::vector<std::string> urls_;
  const double period_s_;
  std::atomic<bool> stop_{false};
  mutable Mutex mu_;
  std::map<std::string, Worst> worst_ GUARDED_BY(mu_);
  std::thread thread_;
};

// The oldest live send, load and lease in a /debug/state body (a lease's
// age is how long P has held or waited for its KV); false if it is not one.
bool OldestTransfers(const std::string& debug_state_json, TransferAges* ages);
// The sum of every series of Prometheus metric `name` (exact name, any
// labels) in `text`.
double MetricSum(const std::string& text, const std::string& name);

// One engine now: /debug/state and /metrics (reachable=false if either
// fails). Fills everything but the monitor's maxima and `restarted`.
EngineEnd ReadEngineEnd(const std::string& name, const std::string& url);

}  // namespace kvrelay
