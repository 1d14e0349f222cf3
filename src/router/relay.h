// relay.h — Relay: one client request through the router: its transfer_id,
// its P and D legs in flight at once, and the client's response.
//
// Why: RelayLogic (pure) decides; Relay runs it. The legs are asynchronous
// HTTP calls (http/http_client.h) whose callbacks feed the logic under one
// mutex; Relay cancels a leg when the logic says so and writes what the
// client should get into its Exchange — a whole response once the outcome
// is known, or (a stream) the 200 head at the first event and each event
// as it comes. No thread waits for a leg, and nothing is written to the
// client before the logic allows it, so a failure known late still gets its
// own status.
//
// Sequence: Start() starts both legs; their callbacks and the exchange's
// client-gone callback call Feed(); CheckQueueWait() (the server's sweep)
// may fail it; Shutdown() ends it. Finish() records the outcome once, when
// the client's response is over. A request that did not end well has its
// transfer released at P (POST /kv_release) once P's leg is over, so a D
// that died before pulling does not leave P holding the KV.
//
// Ownership: shared by the server's registry of live relays and the legs'
// pending calls. Each leg holds its engine Lease until its call ends.
// Threading: every public method is thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/mutex.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "http/exchange.h"
#include "http/http_client.h"
#include "router/engine_pool.h"
#include "router/leg_bodies.h"
#include "router/relay_logic.h"
#include "router/router_metrics.h"

namespace kvrelay::router {

struct UpstreamOptions {
  Duration connect_timeout = Duration::Seconds(3);
  // The longest silence tolerated while waiting for a leg's answer. The
  // engines write nothing while a request waits (queued, paused) and a
  // non-streamed leg answers only at its end, so this is a last resort
  // against a hung engine; --max-queue-wait-s bounds the common case.
  Duration idle_timeout = Duration::Seconds(3600);
  size_t max_body_bytes = size_t{16} << 20;
};

struct RelayOptions {
  UpstreamOptions upstream;
  // RelayLogic::QueueWaitExpired after this long without a token (0: never).
  Duration max_queue_wait = Duration::Seconds(300);
};

class Relay : public std::enable_shared_from_this<Relay> {
 public:
  // Called once when the client's side is over (the outcome is final).
  using OnFinish = std::function<void(Relay&)>;

  Relay(uint64_t id, const RelayOptions& options, ClientRequest request, TransferId transfer,
        EnginePool::Pair engines, std::shared_ptr<EnginePool> pool,
        std::shared_ptr<RouterMetrics> metrics, Instant arrived, OnFinish on_finish);

  uint64_t id() const { return id_; }
  const TransferId& transfer() const { return transfer_; }

  // Starts both legs on `calls`, answering through `exchange`.
  void Start(http::ClientContext& calls, std::shared_ptr<http::Exchange> exchange);
  // Fails the request if it has waited max_queue_wait for a token.
  void CheckQueueWait(Instant now);
  // Stop both legs; the client gets "the router is shutting down".
  void Shutdown();

 private:
  using Lease = std::shared_ptr<EnginePool::Lease>;
  // Starts P's leg (prefill) or D's on `calls`; its end is fed to the logic.
  void StartLeg(http::ClientContext& calls, Lease lease, bool prefill);
  // Feeds an event to the logic, writes what it allows, cancels what it
  // asks, and finishes when the response is over.
  template <typename F>
  void Feed(F&& f) EXCLUDES(mu_);
  // Writes to the client what the logic allows now.
  void Drive() REQUIRES(mu_);
  // Records the time to the client's first token (once; reported by Feed).
  void NoteFirstToken() REQUIRES(mu_);
  void ApplyCancels() EXCLUDES(mu_);
  // Tells P to end the transfer (POST /kv_release) once the logic asks.
  void MaybeRelease() EXCLUDES(mu_);
  void Finish() EXCLUDES(mu_);
  // The outcome into the metrics, once (counted_).
  void CountOutcome() REQUIRES(mu_);

  const uint64_t id_;
  const RelayOptions options_;
  const ClientRequest request_;
  const TransferId transfer_;
  const std::shared_ptr<EnginePool> pool_;
  const std::shared_ptr<RouterMetrics> metrics_;
  const Instant arrived_;
  OnFinish on_finish_;
  std::string prefill_body_, decode_body_;
  EnginePool::Pair engines_;   // moved into the legs by Start()
  EngineInfo prefill_info_;    // what D was told about P
  std::string prefill_url_, decode_url_;

  Mutex mu_;
  RelayLogic logic_ GUARDED_BY(mu_);
  std::shared_ptr<http::Exchange> exchange_ GUARDED_BY(mu_);
  std::shared_ptr<http::ClientCall> prefill_call_ GUARDED_BY(mu_);
  std::shared_ptr<http::ClientCall> decode_call_ GUARDED_BY(mu_);
  bool prefill_cancelled_ GUARDED_BY(mu_) = false;
  bool decode_cancelled_ GUARDED_BY(mu_) = false;
  http::ClientContext* calls_ GUARDED_BY(mu_) = nullptr;   // set by Start
  bool release_started_ GUARDED_BY(mu_) = false;
  bool replied_ GUARDED_BY(mu_) = false;    // the client's response is over
  bool ttft_noted_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
  // The outcome is in the metrics: counted just before the response's last
  // byte goes, so a client that has its answer sees it counted.
  bool counted_ GUARDED_BY(mu_) = false;
  double first_token_s_ GUARDED_BY(mu_) = -1;   // to report, outside the lock
};

}  // namespace kvrelay::router
