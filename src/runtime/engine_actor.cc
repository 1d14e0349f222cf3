#include "runtime/engine_actor.h"

#include <algorithm>
#include <deque>

#include "os/clock.h"
#include "os/log.h"
#include "os/thread_priority.h"

namespace kvrelay::runtime {

EngineActor::EngineActor(const engine::EngineOptions& options, engine::KvMemory* memory,
                         engine::ComputeModel* model, size_t inbox_capacity)
    : engine_(std::make_unique<engine::Engine>(options, memory, model)),
      inbox_(inbox_capacity),
      reports_(options.tp),
      tp_(options.tp) {}

EngineActor::~EngineActor() { Stop(); }

void EngineActor::Start() {
  KV_CHECK(!thread_.joinable());
  thread_ = std::thread([this] {
    NameThisThread("kv-engine");
    if (thread_nice_ != 0) {
      if (Status s = SetThisThreadNice(thread_nice_); !s.ok()) {
        Log("engine", "loop thread keeps its priority: %s", s.ToString().c_str());
      }
    }
    Loop();
  });
}

void EngineActor::Stop() {
  if (!thread_.joinable()) return;
  stop_requested_.store(true);
  inbox_.Post([this] { stopping_ = true; });
  thread_.join();
}

Result<std::shared_ptr<RequestStream>> EngineActor::Submit(engine::RequestSpec spec) {
  auto stream = std::make_shared<RequestStream>(spec.client);
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  const bool posted = inbox_.Post([this, p, stream, spec = std::move(spec)]() mutable {
    const uint64_t client = spec.client;
    Status s = engine_->AddRequest(std::move(spec), MonoNow());
    if (s.ok()) streams_[client] = stream;
    p->set_value(std::move(s));
  });
  if (!posted) return Status(StatusCode::kUnavailable, "engine is shutting down");
  Status s = f.get();
  if (!s.ok()) return s;
  return stream;
}

void EngineActor::Abort(uint64_t client) {
  inbox_.Post([this, client] { engine_->AbortRequest(client); });
}

OpResult EngineActor::RunOp(std::function<uint64_t(engine::Engine&)> start,
                            std::chrono::milliseconds timeout) {
  auto p = std::make_shared<std::promise<OpResult>>();
  auto f = p->get_future();
  const auto started = std::chrono::steady_clock::now();
  if (!inbox_.Post([this, p, start = std::move(start), started] {
        const uint64_t op = start(*engine_);
        ops_[op] = OpWaiter{p, started};
      })) {
    return OpResult{false, "engine is shutting down", 0};
  }
  if (f.wait_for(timeout) != std::future_status::ready) {
    return OpResult{false, "timed out after " + std::to_string(timeout.count()) +
                               " ms; the operation goes on",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
                        .count()};
  }
  return f.get();
}

void EngineActor::PostReport(uint32_t rank, RankReport report) {
  KV_CHECK_LT(rank, tp_);
  {
    MutexLock lock(&reports_mu_);
    RankReport& r = reports_[rank];
    r.finished_sending.insert(r.finished_sending.end(), report.finished_sending.begin(),
                              report.finished_sending.end());
    r.finished_recving.insert(r.finished_recving.end(), report.finished_recving.begin(),
                              report.finished_recving.end());
    r.released.insert(r.released.end(), report.released.begin(), report.released.end());
    have_reports_ = true;
  }
  inbox_.Kick();
}

void EngineActor::Loop() {
  std::deque<Inbox::Fn> fns;
  std::vector<RankReport> reports(tp_);
  while (true) {
    inbox_.Take(&fns);
    if (!fns.empty()) {
      for (auto& fn : fns) fn();
      fns.clear();
      // As in SpendCompute: what just arrived (an abort, an operation)
      // sends its metadata now, not after the next step's real work
      // (Step writes the batch's KV before it builds its metadata).
      engine_->Control();
      Dispatch();
    }
    bool have = false;
    {
      MutexLock lock(&reports_mu_);
      if (have_reports_) {
        reports.swap(reports_);
        have_reports_ = false;
        have = true;
      }
    }
    if (stopping_) break;
    if (engine_->HasWork() || have) {
      const auto t0 = std::chrono::steady_clock::now();
      const Duration compute =
          engine_->Step(have ? std::span<const RankReport>(reports) : std::span<const RankReport>(),
                        MonoNow());
      CountStep(std::chrono::steady_clock::now() - t0, compute);
      if (have) {
        for (RankReport& r : reports) r = RankReport{};
      }
      Dispatch();
      SpendCompute(t0 + std::chrono::nanoseconds(compute.ns()), &fns);
      continue;
    }
    // No step to run (idle, paused, asleep): requests queued behind it
    // still meet their max_queue_wait.
    engine_->Tick(MonoNow());
    Dispatch();
    inbox_.WaitUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
  }
  // Closures posted while stopping still run, so no caller waits forever.
  inbox_.Close();
  inbox_.Take(&fns);
  for (auto& fn : fns) fn();
  FailAll("engine stopped");
}

// The modelled compute time of a step: no step starts before `until`, but
// what arrives meanwhile runs now — the scheduler is free while the model
// computes — and Control() sends the metadata of an abort or an operation
// at once. An abort on P thus reaches the ranks within the inbox's wake-up,
// not after the rest of the step. With busy steps (SetBusySteps) it just
// waits: the model of an engine that handles inputs only between steps.
void EngineActor::SpendCompute(std::chrono::steady_clock::time_point until,
                               std::deque<Inbox::Fn>* fns) {
  if (busy_steps_) {
    // Busy: nothing runs until the step ends (or Stop asks), in slices so
    // a Stop is seen within one.
    constexpr auto kSlice = std::chrono::milliseconds(5);
    while (!stop_requested_.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_until(std::min(until, std::chrono::steady_clock::now() + kSlice));
    }
    return;
  }
  while (!stopping_ && std::chrono::steady_clock::now() < until) {
    inbox_.WaitUntil(until);
    inbox_.Take(fns);
    if (fns->empty()) continue;  // a kick: reports wait for the next step
    for (auto& fn : *fns) fn();
    fns->clear();
    engine_->Control();
    Dispatch();
  }
}

void EngineActor::CountStep(std::chrono::steady_clock::duration work, Duration modelled) {
  const auto work_ns =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(work).count());
  const auto modelled_ns = static_cast<uint64_t>(std::max<int64_t>(0, modelled.ns()));
  step_counters_.steps.fetch_add(1, std::memory_order_relaxed);
  step_counters_.work_ns.fetch_add(work_ns, std::memory_order_relaxed);
  step_counters_.modelled_ns.fetch_add(modelled_ns, std::memory_order_relaxed);
  if (modelled_ns > 0 && work_ns > modelled_ns) {
    step_counters_.overruns.fetch_add(1, std::memory_order_relaxed);
  }
}

void EngineActor::Dispatch() {
  while (auto a = engine_->PollAction()) {
    if (auto* t = std::get_if<engine::TokenOut>(&*a)) {
      auto it = streams_.find(t->client);
      if (it != streams_.end()) it->second->Push(*t);
    } else if (auto* d = std::get_if<engine::RequestDone>(&*a)) {
      auto it = streams_.find(d->client);
      if (it != streams_.end()) {
        it->second->Finish(d->reason, d->error);
        streams_.erase(it);
      }
    } else if (auto* m = std::get_if<engine::MetadataOut>(&*a)) {
      if (metadata_sink_) metadata_sink_(m->meta);
    } else if (auto* o = std::get_if<engine::OpDone>(&*a)) {
      auto it = ops_.find(o->op);
      if (it != ops_.end()) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                       it->second.started)
                             .count();
        it->second.promise->set_value(OpResult{o->ok, o->detail, s});
        ops_.erase(it);
      }
    }
  }
}

void EngineActor::FailAll(const std::string& why) {
  for (auto& [client, stream] : streams_) stream->Finish(engine::FinishReason::kError, why);
  streams_.clear();
  for (auto& [op, w] : ops_) w.promise->set_value(OpResult{false, why, 0});
  ops_.clear();
}

}  // namespace kvrelay::runtime
