// engine_actor.h — EngineActor: the thread that owns an Engine.
//
// Theory of operation: the engine is pure and single-threaded; this actor
// is its only caller. Other threads post closures (add a request, abort
// one, start a lifecycle operation, read a snapshot) to its inbox; rank
// actors post their get_finished() reports. The loop:
//   take closures and reports → run the closures and send what they
//   started at once (Engine::Control) → if the engine has work
//   or reports arrived, Step(reports, now) → dispatch its actions (tokens
//   and finishes to RequestStreams, metadata to every rank actor, OpDone
//   to the caller waiting for it) → spend the step's modelled compute time,
//   running what arrives meanwhile and sending its metadata at once
//   (Engine::Control) → wait for the next input.
// The engine frees blocks itself, at a step, after the ranks report that
// no transfer touches them (vLLM's get_finished() contract).
//
// Ownership: owned by Node; owns the Engine. Threading: public methods are
// thread-safe unless marked; the loop runs on the actor's own thread.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/result.h"
#include "core/connector_metadata.h"
#include "engine/engine.h"
#include "runtime/inbox.h"
#include "runtime/request_stream.h"

namespace kvrelay::runtime {

// The engine thread's steps, for /metrics: how long each step's real work
// took (Engine::Step: the batch's KV bytes, the model's compute) against
// the compute time the step asked for. With the emulated model a step
// lasts max(work, modelled); work above the model (an overrun) means the
// host, not the model, set the step's length. Written by the engine thread
// only; read by any thread.
struct StepCounters {
  std::atomic<uint64_t> steps{0};
  std::atomic<uint64_t> work_ns{0};       // wall time inside Engine::Step
  std::atomic<uint64_t> modelled_ns{0};   // the compute time the steps returned
  // Steps with modelled compute whose work outlasted it (steps with none:
  // reports only, or llama.cpp's, where the compute is the work).
  std::atomic<uint64_t> overruns{0};
};

struct OpResult {
  bool ok = false;
  std::string detail;
  double latency_s = 0;
};

class EngineActor {
 public:
  using MetadataSink = std::function<void(const ConnectorMetadata&)>;

  // `model`: what computes (engine/compute_model.h); null: the emulated
  // model. Owned by the caller; outlives the actor.
  EngineActor(const engine::EngineOptions& options, engine::KvMemory* memory,
              engine::ComputeModel* model = nullptr, size_t inbox_capacity = 65536);
  ~EngineActor();
  EngineActor(const EngineActor&) = delete;
  EngineActor& operator=(const EngineActor&) = delete;

  // REQUIRES: before Start. Called on the engine thread with each step's
  // connector metadata (Node fans it out to every rank actor).
  void SetMetadataSink(MetadataSink sink) { metadata_sink_ = std::move(sink); }
  // REQUIRES: before Start. The loop thread's nice value (0: inherited);
  // one the process may not set is logged and left (thread_priority.h).
  void SetThreadNice(int nice) { thread_nice_ = nice; }
  // REQUIRES: before Start. A step's modelled compute keeps the loop busy:
  // closures that arrive meanwhile run only after it (a GPU's forward pass;
  // vLLM handles aborts between steps). Stop() still cuts it short.
  void SetBusySteps(bool busy) { busy_steps_ = busy; }
  void Start();
  // Finishes every open request and operation as failed, joins the thread.
  void Stop();

  // Adds a request; returns its stream once the engine accepted it, or the
  // engine's error (invalid, duplicate, queue full).
  Result<std::shared_ptr<RequestStream>> Submit(engine::RequestSpec spec);
  // The client went away.
  void Abort(uint64_t client);
  // Starts a lifecycle operation on the engine thread and waits for its
  // OpDone (or `timeout`: then ok=false, detail says so; the operation
  // itself goes on).
  OpResult RunOp(std::function<uint64_t(engine::Engine&)> start,
                 std::chrono::milliseconds timeout);
  // Runs `fn` on the engine thread and returns its result. Fails (nullopt)
  // if the actor has stopped.
  template <class F>
  auto Query(F fn) -> std::optional<decltype(fn(std::declval<const engine::Engine&>()))> {
    using R = decltype(fn(std::declval<const engine::Engine&>()));
    auto p = std::make_shared<std::promise<R>>();
    auto f = p->get_future();
    if (!inbox_.Post([this, p, fn] { p->set_value(fn(*engine_)); })) return std::nullopt;
    return f.get();
  }
  // From rank actors: rank `rank`'s get_finished() report. Reports that
  // arrive between two steps are merged per rank (Step takes one per rank).
  void PostReport(uint32_t rank, RankReport report) EXCLUDES(reports_mu_);

  uint64_t NewClientId() { return next_client_.fetch_add(1); }
  const StepCounters& step_counters() const { return step_counters_; }
  size_t inbox_size() const { return inbox_.size(); }

 private:
  void Loop();
  void Dispatch();
  void CountStep(std::chrono::steady_clock::duration work, Duration modelled);
  void SpendCompute(std::chrono::steady_clock::time_point until, std::deque<Inbox::Fn>* fns);
  void FailAll(const std::string& why);

  std::unique_ptr<engine::Engine> engine_;
  MetadataSink metadata_sink_;
  int thread_nice_ = 0;
  bool busy_steps_ = false;
  std::atomic<bool> stop_requested_{false};  // read by a busy step
  Inbox inbox_;
  Mutex reports_mu_;
  std::vector<RankReport> reports_ GUARDED_BY(reports_mu_);  // one per rank
  bool have_reports_ GUARDED_BY(reports_mu_) = false;
  const uint32_t tp_;
  std::thread thread_;
  std::atomic<uint64_t> next_client_{1};
  StepCounters step_counters_;
  // Engine thread only:
  std::unordered_map<uint64_t, std::shared_ptr<RequestStream>> streams_;
  struct OpWaiter {
    std::shared_ptr<std::promise<OpResult>> promise;
    std::chrono::steady_clock::time_point started;
  };
  std::unordered_map<uint64_t, OpWaiter> ops_;
  bool stopping_ = false;
};

}  // namespace kvrelay::runtime
