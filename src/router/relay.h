// relay.h — Relay: one client request through the router: its transfer_id,
// its P and D legs running at once on their own threads, and the client's
// response, written by the HTTP worker that took the request.
//
// Why: RelayLogic (pure) decides; Relay runs it: it feeds the legs' events
// in under one mutex, cancels a leg when the logic says so, and pumps what
// the client should get into httplib's chunked writer, with a probe byte
// (" " for JSON, an SSE comment for a stream) every probe period so that a
// client that went away is noticed and both legs are cancelled.
//
// Sequence: Start() spawns the legs; the HTTP worker calls
// WaitForCommitPoint() (bounded) so a failure that comes early can still be
// a whole reply with its own status, then CommitOrReply(): a whole reply if
// the outcome is known, else the response is committed (200) and Pump()
// writes it; ClientReleased() ends it. Finish() records the outcome once.
//
// Ownership: shared by the HTTP worker (through the chunked provider), the
// two leg threads and the server's registry of live relays (for shutdown).
// Each leg holds its engine Lease until its call ends.
// Threading: see above; every public method is thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "base/mutex.h"
#include "base/time.h"
#include "base/transfer_id.h"
#include "router/engine_pool.h"
#include "router/leg_bodies.h"
#include "router/leg_threads.h"
#include "router/relay_logic.h"
#include "router/router_metrics.h"
#include "router/upstream_call.h"

namespace httplib {
class DataSink;
}

namespace kvrelay::router {

struct RelayOptions {
  UpstreamOptions upstream;
  Duration probe_interval = Duration::Milliseconds(200);
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

  // Starts both legs. On failure (no thread) the relay is decided
  // (prefill_failed) and nothing runs.
  void Start(LegThreads& threads);
  // Waits up to `max` for RelayLogic::ReadyToCommit().
  void WaitForCommitPoint(Duration max);
  // The whole reply if the outcome is known (then call Finish()); otherwise
  // commits (the client will get 200) and returns nullopt.
  std::optional<ClientReply> CommitOrReply();
  // The chunked provider's step: waits up to a probe period for something
  // to write, writes it (or a probe); false if the client is gone.
  bool Pump(httplib::DataSink& sink);
  // The chunked provider's releaser.
  void ClientReleased(bool success);
  // Stop both legs; the client gets "the router is shutting down".
  void Shutdown();
  // Records the outcome (once) and calls on_finish.
  void Finish();

 private:
  void RunPrefill(EnginePool::Lease lease);
  void RunDecode(EnginePool::Lease lease);
  // Performs the cancels the logic asked for.
  void ApplyCancels() EXCLUDES(mu_);
  template <typename F>
  void Feed(F&& f) EXCLUDES(mu_);
  void NoteFirstToken();

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

  UpstreamCall prefill_call_, decode_call_;
  Mutex mu_;
  CondVar cv_;
  RelayLogic logic_ GUARDED_BY(mu_);
  bool ttft_noted_ GUARDED_BY(mu_) = false;
  bool finished_ GUARDED_BY(mu_) = false;
};

}  // namespace kvrelay::router
