#include "router/relay.h"

#include <httplib.h>

#include "base/check.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace kvrelay::router {

using nlohmann::json;
using runtime::Log;

namespace {

constexpr const char* kCompletionsPath = "/v1/completions";

// True if P's answer names itself differently from what D was told (P
// restarted with new values since its /kv_info was read).
bool PrefillMovedOn(const std::string& body, const EngineInfo& told_d) {
  const json j = json::parse(TrimLeadingSpace(body), nullptr, false);
  if (!j.is_object()) return false;
  auto kv = j.find("kv_transfer_params");
  if (kv == j.end() || !kv->is_object()) return false;
  const json& k = *kv;
  auto differs = [&](const char* field, const json& want) {
    auto it = k.find(field);
    return it != k.end() && *it != want;
  };
  return differs("remote_engine_id", told_d.engine_id) ||
         differs("remote_host", told_d.kv_host) || differs("remote_port", told_d.kv_port) ||
         differs("remote_tp_size", told_d.tp);
}

}  // namespace

Relay::Relay(uint64_t id, const RelayOptions& options, ClientRequest request,
             TransferId transfer, EnginePool::Pair engines, std::shared_ptr<EnginePool> pool,
             std::shared_ptr<RouterMetrics> metrics, Instant arrived, OnFinish on_finish)
    : id_(id),
      options_(options),
      request_(std::move(request)),
      transfer_(transfer),
      pool_(std::move(pool)),
      metrics_(std::move(metrics)),
      arrived_(arrived),
      on_finish_(std::move(on_finish)),
      engines_(std::move(engines)),
      logic_(request_.stream) {
  KV_CHECK(engines_.prefill.valid() && engines_.decode.valid());
  prefill_info_ = engines_.prefill.info();
  prefill_url_ = engines_.prefill.url();
  decode_url_ = engines_.decode.url();
  prefill_body_ = PrefillLegBody(request_.body, transfer_, engines_.decode.info().tp,
                                 engines_.decode.info().engine_id);
  decode_body_ = DecodeLegBody(request_.body, transfer_, prefill_info_);
}

template <typename F>
void Relay::Feed(F&& f) {
  {
    MutexLock lock(&mu_);
    f(logic_);
  }
  cv_.NotifyAll();
  ApplyCancels();
}

void Relay::ApplyCancels() {
  bool p = false, d = false;
  {
    MutexLock lock(&mu_);
    p = logic_.cancel_prefill();
    d = logic_.cancel_decode();
  }
  if (p && !prefill_call_.cancelled()) prefill_call_.Cancel();
  if (d && !decode_call_.cancelled()) decode_call_.Cancel();
}

void Relay::Start(LegThreads& threads) {
  std::shared_ptr<Relay> self = shared_from_this();
  auto p = std::make_shared<EnginePool::Lease>(std::move(engines_.prefill));
  auto d = std::make_shared<EnginePool::Lease>(std::move(engines_.decode));
  Status s = threads.Spawn([self, p] { self->RunPrefill(std::move(*p)); });
  if (!s.ok()) {
    p->Release();
    d->Release();
    LegEnd end;
    end.kind = LegEnd::Kind::kTransportError;
    end.error = s.message();
    Feed([&](RelayLogic& l) { l.PrefillEnded(end); });
    return;
  }
  s = threads.Spawn([self, d] { self->RunDecode(std::move(*d)); });
  if (!s.ok()) {
    d->Release();
    LegEnd end;
    end.kind = LegEnd::Kind::kTransportError;
    end.error = s.message();
    Feed([&](RelayLogic& l) { l.DecodeEnded(end); });
  }
}

void Relay::RunPrefill(EnginePool::Lease lease) {
  LegEnd end = prefill_call_.Post(lease.url(), kCompletionsPath, prefill_body_,
                                  UpstreamCall::Sink{}, options_.upstream);
  if (end.kind == LegEnd::Kind::kTransportError && end.connection_failed) {
    pool_->ReportConnectionFailure(lease.index());
    metrics_->LegConnectionFailure(lease.index());
  } else if (end.kind == LegEnd::Kind::kResponse && end.status == 200 &&
             PrefillMovedOn(end.body, prefill_info_)) {
    runtime::LogOnce("router", "moved:" + lease.url(),
                     "engine " + lease.url() +
                         " answered with kv_transfer_params unlike its /kv_info; rechecking");
    pool_->RequestRecheck(lease.index());
  }
  lease.Release();
  Feed([&](RelayLogic& l) { l.PrefillEnded(end); });
}

void Relay::RunDecode(EnginePool::Lease lease) {
  UpstreamCall::Sink sink;
  sink.on_status = [this](int status) { Feed([&](RelayLogic& l) { l.DecodeStatus(status); }); };
  sink.on_data = [this](std::string_view bytes) {
    bool stop = false;
    Feed([&](RelayLogic& l) {
      l.DecodeData(bytes);
      stop = l.cancel_decode();
    });
    return !stop;
  };
  LegEnd end = decode_call_.Post(lease.url(), kCompletionsPath, decode_body_, sink,
                                 options_.upstream);
  if (end.kind == LegEnd::Kind::kTransportError && end.connection_failed) {
    pool_->ReportConnectionFailure(lease.index());
    metrics_->LegConnectionFailure(lease.index());
  }
  lease.Release();
  Feed([&](RelayLogic& l) { l.DecodeEnded(end); });
}

void Relay::WaitForCommitPoint(Duration max) {
  MutexLock lock(&mu_);
  cv_.WaitFor(&mu_, std::chrono::nanoseconds(max.ns()),
              [&]() REQUIRES(mu_) { return logic_.ReadyToCommit(); });
}

std::optional<ClientReply> Relay::CommitOrReply() {
  bool first_token = false;
  std::optional<ClientReply> reply;
  {
    MutexLock lock(&mu_);
    if (!logic_.decided()) {
      logic_.Commit();
      return std::nullopt;
    }
    reply = logic_.Reply();
    if (logic_.stream() && logic_.outcome() == Outcome::kOk && !ttft_noted_) {
      ttft_noted_ = first_token = true;
    }
  }
  if (first_token) metrics_->FirstToken((runtime::MonoNow() - arrived_).seconds());
  return reply;
}

bool Relay::Pump(httplib::DataSink& sink) {
  std::string out;
  bool finished = false, has_tokens = false, first_token = false, cancel = false;
  {
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, std::chrono::nanoseconds(options_.probe_interval.ns()),
                [&]() REQUIRES(mu_) { return logic_.HasBody(); });
    const Duration waited = runtime::MonoNow() - arrived_;
    if (options_.max_queue_wait > Duration::Zero() && waited >= options_.max_queue_wait &&
        !logic_.decided()) {
      logic_.QueueWaitExpired(waited.seconds());
      cancel = logic_.decided();
    }
    if (logic_.HasBody()) out = logic_.TakeBody(&finished, &has_tokens);
    if (has_tokens && !ttft_noted_) ttft_noted_ = first_token = true;
  }
  if (cancel) ApplyCancels();
  // Nothing new: a probe, which also finds a client that went away.
  if (out.empty() && !finished) out = request_.stream ? ": keep-alive\n\n" : " ";
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    Feed([](RelayLogic& l) { l.ClientGone(); });
    return false;
  }
  if (first_token) metrics_->FirstToken((runtime::MonoNow() - arrived_).seconds());
  if (finished) sink.done();
  return true;
}

void Relay::ClientReleased(bool success) {
  if (!success) Feed([](RelayLogic& l) { l.ClientGone(); });
  Finish();
}

void Relay::Shutdown() {
  Feed([](RelayLogic& l) { l.Shutdown(); });
}

void Relay::Finish() {
  Outcome outcome;
  std::string message;
  {
    MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    if (!logic_.decided()) logic_.ClientGone();
    outcome = logic_.outcome();
    message = logic_.failure_message();
  }
  cv_.NotifyAll();
  ApplyCancels();
  const double seconds = (runtime::MonoNow() - arrived_).seconds();
  metrics_->RequestFinished(outcome, seconds);
  if (outcome != Outcome::kOk && outcome != Outcome::kBadRequest) {
    Log("router", "request %llu (transfer %s, P %s, D %s): %s after %.3f s%s%s",
        static_cast<unsigned long long>(id_), transfer_.ToString().c_str(),
        prefill_url_.c_str(), decode_url_.c_str(), std::string(OutcomeName(outcome)).c_str(),
        seconds, message.empty() ? "" : ": ", message.c_str());
  }
  if (on_finish_) on_finish_(*this);
}

}  // namespace kvrelay::router
