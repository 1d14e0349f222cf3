// engine_server.h — EngineServer: `kvrelay serve`, an engine behind HTTP.
//
// What: the OpenAI-compatible completions API (with SSE streaming and
// vLLM's kv_transfer_params), the admin calls named as vLLM names them
// (pause, resume, sleep, wake_up, is_sleeping, reset_prefix_cache,
// release_kv_cache_memory, abort_requests, update_weights), /health,
// /metrics (Prometheus text) and /debug/state (JSON), over a runtime Node.
// docs/http.md is the API's reference.
//
// Client disconnects: a response is written in chunks while the request
// runs (SSE events, or JSON's leading whitespace for a non-streaming
// request) so a client that went away is noticed within one probe period
// and its request is aborted.
//
// Bad input gets a 4xx with {"error": {...}} saying what is wrong, and
// nothing is applied.
//
// Ownership: owns the Node and the HTTP listener. Threading: handlers run
// on the HTTP server's pool; Start/Stop from the main thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "base/result.h"
#include "runtime/node.h"

namespace kvrelay::server {

struct ServerOptions {
  runtime::NodeOptions node;
  std::string http_host = "127.0.0.1";
  uint16_t http_port = 8100;
  std::string model_name;                 // default "kvrelay-<shape>"
  size_t max_body_bytes = 1u << 20;       // larger bodies get 413
  uint32_t max_prompt_tokens = 0;         // 0: the model's context - 1; longer get 400
  // POST /v1/completions at once per remote address (429 past it); 0: no
  // limit. The default leaves room for a router's max_inflight, both legs.
  uint32_t max_requests_per_client = 8192;
  uint32_t http_threads = 512;            // concurrent connections served
  std::chrono::milliseconds op_timeout{600'000};
  std::chrono::milliseconds disconnect_probe{200};
  // P: an abort of an open P leg (abort_requests, a client gone) also ends
  // its send straight at the ranks, ahead of the engine (the fast abort).
  bool fast_abort = true;
};

class EngineServer {
 public:
  static Result<std::unique_ptr<EngineServer>> Start(const ServerOptions& options);
  ~EngineServer();
  // Blocks until Stop() (from another thread or a signal handler's thread).
  void Wait();
  // Stops accepting, drains the node (bounded), joins everything.
  void Stop();
  uint16_t port() const;

 private:
  struct Impl;
  explicit EngineServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvrelay::server
