#include "router/relay.h"

#include "base/check.h"
#include "os/clock.h"
#include "os/log.h"

namespace kvrelay::router {

using nlohmann::json;
using kvrelay::Log;

namespace {

constexpr const char* kReleasePath = "/kv_release";
// P answers a release at once (it posts to its ranks and returns).
constexpr Duration kReleaseTimeout = Duration::Seconds(10);

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

LegEnd ToLegEnd(const Result<http::ClientResponse>& r) {
  LegEnd end;
  if (r.ok()) {
    end.kind = LegEnd::Kind::kResponse;
    end.status = r->status;
    end.body = r->body;
    return end;
  }
  if (r.status().code() == StatusCode::kCancelled) {
    end.kind = LegEnd::Kind::kCancelled;
    return end;
  }
  end.kind = LegEnd::Kind::kTransportError;
  end.error = r.status().message();
  // Cannot connect, or the connection broke: the engine may be down or
  // restarted (a timeout or an answer the router refused is not that).
  end.connection_failed = r.status().code() == StatusCode::kUnavailable;
  return end;
}

http::ClientOptions CallOptions(const UpstreamOptions& u) {
  http::ClientOptions o;
  o.connect_timeout = u.connect_timeout;
  o.idle_timeout = u.idle_timeout;
  o.max_body_bytes = u.max_body_bytes;
  return o;
}

http::ClientRequest Post(const std::string& path, const std::string& body) {
  http::ClientRequest r;
  r.method = "POST";
  r.target = path;
  r.body = body;
  return r;
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
  bool finish = false;
  double ttft_s = -1;
  {
    MutexLock lock(&mu_);
    f(logic_);
    Drive();
    finish = replied_ && !finished_;
    std::swap(ttft_s, first_token_s_);
  }
  if (ttft_s >= 0) metrics_->FirstToken(ttft_s);
  ApplyCancels();
  MaybeRelease();
  if (finish) Finish();
}

void Relay::MaybeRelease() {
  http::ClientContext* calls = nullptr;
  {
    MutexLock lock(&mu_);
    if (release_started_ || calls_ == nullptr || !logic_.release_prefill()) return;
    release_started_ = true;
    calls = calls_;
  }
  Result<http::Endpoint> to = http::ParseBaseUrl(prefill_url_);
  if (!to.ok()) return;   // its leg could not start either
  http::ClientRequest r;
  r.method = "POST";
  r.target = kReleasePath;
  r.body = json{{"transfer_id", transfer_.ToString()}}.dump();
  http::ClientOptions o = CallOptions(options_.upstream);
  o.idle_timeout = kReleaseTimeout;
  std::shared_ptr<RouterMetrics> metrics = metrics_;
  const std::string url = prefill_url_;
  calls->Start(*to, std::move(r), o, {}, [metrics, url](Result<http::ClientResponse> res) {
    const bool ok = res.ok() && res->status == 200;
    metrics->TransferReleased(ok);
    if (!ok) {
      // P is down (its restart holds nothing) or too old to know the call:
      // its --abort-timeout-s ends the send.
      kvrelay::LogOnce("router", "release:" + url,
                       "engine " + url + " did not take a transfer release (" +
                           (res.ok() ? "HTTP " + std::to_string(res->status)
                                     : res.status().message()) +
                           "); it ends unpulled transfers at its --abort-timeout-s");
    }
  });
}

void Relay::Drive() {
  if (replied_ || !exchange_) return;
  if (!logic_.committed()) {
    if (!logic_.ReadyToCommit()) return;
    if (logic_.decided()) {
      ClientReply r = logic_.Reply();
      CountOutcome();
      exchange_->Respond(r.status, r.content_type, std::move(r.body));
      replied_ = true;
      if (logic_.stream() && logic_.outcome() == Outcome::kOk) NoteFirstToken();
      return;
    }
    logic_.Commit();
    exchange_->StartStream(200, "text/event-stream", ": keep-alive\n\n");
  }
  if (!logic_.HasBody()) return;
  bool finished = false, has_tokens = false;
  std::string out = logic_.TakeBody(&finished, &has_tokens);
  if (finished) CountOutcome();
  if (!out.empty()) exchange_->Write(std::move(out));
  if (has_tokens) NoteFirstToken();
  if (finished) {
    exchange_->End();
    replied_ = true;
  }
}

void Relay::NoteFirstToken() {
  if (ttft_noted_) return;
  ttft_noted_ = true;
  first_token_s_ = (kvrelay::MonoNow() - arrived_).seconds();
}

void Relay::ApplyCancels() {
  std::shared_ptr<http::ClientCall> p, d;
  {
    MutexLock lock(&mu_);
    if (logic_.cancel_prefill() && !prefill_cancelled_ && prefill_call_) {
      prefill_cancelled_ = true;
      p = prefill_call_;
    }
    if (logic_.cancel_decode() && !decode_cancelled_ && decode_call_) {
      decode_cancelled_ = true;
      d = decode_call_;
    }
  }
  if (p) p->Cancel();
  if (d) d->Cancel();
}

void Relay::Start(http::ClientContext& calls, std::shared_ptr<http::Exchange> exchange) {
  {
    MutexLock lock(&mu_);
    exchange_ = exchange;
    calls_ = &calls;
  }
  std::weak_ptr<Relay> weak = weak_from_this();
  exchange->OnClientGone([weak] {
    if (std::shared_ptr<Relay> r = weak.lock()) r->Feed([](RelayLogic& l) { l.ClientGone(); });
  });
  StartLeg(calls, std::make_shared<EnginePool::Lease>(std::move(engines_.prefill)), true);
  StartLeg(calls, std::make_shared<EnginePool::Lease>(std::move(engines_.decode)), false);
}

void Relay::StartLeg(http::ClientContext& calls, Lease lease, bool prefill) {
  auto ended = [prefill](const LegEnd& end) {
    return [prefill, end](RelayLogic& l) { prefill ? l.PrefillEnded(end) : l.DecodeEnded(end); };
  };
  Result<http::Endpoint> to = http::ParseBaseUrl(lease->url());
  if (!to.ok()) {
    lease->Release();
    LegEnd end;
    end.kind = LegEnd::Kind::kTransportError;
    end.error = to.status().message();
    return Feed(ended(end));
  }
  std::shared_ptr<Relay> self = shared_from_this();
  http::ClientSink sink;
  if (!prefill) {   // D's answer comes in as it is written
    sink.on_status = [self](int status) {
      self->Feed([&](RelayLogic& l) { l.DecodeStatus(status); });
    };
    sink.on_data = [self](std::string_view bytes) {
      bool stop = false;
      self->Feed([&](RelayLogic& l) {
        l.DecodeData(bytes);
        stop = l.cancel_decode();
      });
      return !stop;
    };
  }
  auto done = [self, lease, prefill, ended](Result<http::ClientResponse> r) {
    const LegEnd end = ToLegEnd(r);
    if (end.kind == LegEnd::Kind::kTransportError && end.connection_failed) {
      self->pool_->ReportConnectionFailure(lease->index());
      self->metrics_->LegConnectionFailure(lease->index());
    } else if (prefill && end.kind == LegEnd::Kind::kResponse && end.status == 200 &&
               PrefillMovedOn(end.body, self->prefill_info_)) {
      kvrelay::LogOnce("router", "moved:" + lease->url(),
                       "engine " + lease->url() +
                           " answered with kv_transfer_params unlike its /kv_info; rechecking");
      self->pool_->RequestRecheck(lease->index());
    }
    lease->Release();
    self->Feed(ended(end));
  };
  std::shared_ptr<http::ClientCall> call =
      calls.Start(*to, Post(request_.path, prefill ? prefill_body_ : decode_body_),
                  CallOptions(options_.upstream), std::move(sink), std::move(done));
  {
    MutexLock lock(&mu_);
    (prefill ? prefill_call_ : decode_call_) = std::move(call);
  }
  ApplyCancels();   // a cancel decided before the call existed
}

void Relay::CheckQueueWait(Instant now) {
  if (options_.max_queue_wait <= Duration::Zero()) return;
  const Duration waited = now - arrived_;
  if (waited < options_.max_queue_wait) return;
  Feed([&](RelayLogic& l) { l.QueueWaitExpired(waited.seconds()); });
}

void Relay::Shutdown() {
  Feed([](RelayLogic& l) { l.Shutdown(); });
}

void Relay::CountOutcome() {
  if (counted_) return;
  counted_ = true;
  metrics_->RequestFinished(logic_.outcome(), (kvrelay::MonoNow() - arrived_).seconds());
}

void Relay::Finish() {
  Outcome outcome;
  std::string message;
  {
    MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    CountOutcome();   // if no response was written (the client left, a shutdown)
    outcome = logic_.outcome();
    message = logic_.failure_message();
  }
  const double seconds = (kvrelay::MonoNow() - arrived_).seconds();
  if (outcome != Outcome::kOk && outcome != Outcome::kBadRequest) {
    Log("router", "request %llu (transfer %s, P %s, D %s): %s after %.3f s%s%s",
        static_cast<unsigned long long>(id_), transfer_.ToString().c_str(),
        prefill_url_.c_str(), decode_url_.c_str(), std::string(OutcomeName(outcome)).c_str(),
        seconds, message.empty() ? "" : ": ", message.c_str());
  }
  if (on_finish_) on_finish_(*this);
}

}  // namespace kvrelay::router
