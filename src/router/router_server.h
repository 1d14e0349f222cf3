// router_server.h — RouterServer: `kvrelay router`, the P/D proxy. Clients
// talk to it as to one engine (POST /v1/completions and
// /v1/chat/completions, GET /v1/models); it
// runs each request as a P leg and a D leg at once (relay.h) over the
// engines of an EnginePool.
//
// Routes:
//   POST /v1/completions  the client's body, relayed (docs: leg_bodies.h,
//                         relay_logic.h). 400 for a body that is not a
//                         JSON object, 413 over max_body_bytes, 429 over
//                         max_requests_per_client from one remote
//                         address, 503 over max_inflight or with no P or
//                         D up.
//   POST /v1/chat/completions  the same; both legs go to the engines' chat
//                         route.
//   GET  /v1/models       proxied to a D that is up.
//   GET  /health          {"status":"ok"|"degraded","prefill":[...],
//                         "decode":[...]} with each engine's url, up and
//                         outstanding legs; 503 when no P or no D is up.
//   GET  /engines         [{"url","role","up","outstanding","kv_info"}].
//   GET  /metrics         Prometheus text (router_metrics.h).
//
// Threads: the HTTP server's I/O threads and workers (http/http_server.h);
// leg_threads for every leg's call (http::ClientContext): no thread waits
// for a leg; the pool's monitor; a sweep that fails relays past
// --max-queue-wait-s.
// Stop(): refuse new requests (503), cancel every relay (its client gets
// "the router is shutting down" as its whole reply, or as the last event of
// a stream already begun), wait (bounded) for those responses to end, stop
// the HTTP server, then the legs' threads.
//
// Ownership: owns the listener and the monitor thread; shares the pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/result.h"
#include "base/time.h"
#include "http/http_server.h"
#include "router/engine_pool.h"
#include "router/relay.h"

namespace kvrelay::router {

struct RouterOptions {
  uint32_t max_inflight = 4096;            // client requests at once
  uint32_t max_requests_per_client = 1024;  // per remote address, 429 past it; 0: no limit
  // The HTTP server (http/http_server.h): address (port 0: any free
  // port), threads and limits (limits.max_body_bytes: larger bodies get
  // 413); its error_body is the router's own.
  http::ServerOptions http;
  // The threads the legs' calls run on: no thread waits for a leg.
  uint32_t leg_threads = 2;
  RelayOptions relay;
  Duration recheck_interval = Duration::Seconds(1);
  Duration drain_timeout = Duration::Seconds(5);
};

class RouterServer {
 public:
  // Binds and starts serving. REQUIRES: the pool's discovery is complete.
  static Result<std::unique_ptr<RouterServer>> Start(const RouterOptions& options,
                                                     std::shared_ptr<EnginePool> pool);
  ~RouterServer();
  void Stop();
  uint16_t port() const;
  http::ServerStats HttpStats() const;

 private:
  struct Impl;
  explicit RouterServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvrelay::router
