// engine_server.h — EngineServer: `kvrelay serve`, an engine behind HTTP.
//
// What: the OpenAI-compatible completions and chat completions APIs (with
// SSE streaming and vLLM's kv_transfer_params), the admin calls named as vLLM names them
// (pause, resume, sleep, wake_up, is_sleeping, reset_prefix_cache,
// release_kv_cache_memory, abort_requests, update_weights), /health,
// /metrics (Prometheus text) and /debug/state (JSON), over a runtime Node.
// docs/http.md is the API's reference.
//
// Responses: nothing is written before the outcome is known. A non-streamed
// completion is one response when it ends (200, or 503 with an OpenAI
// error if it failed); a stream starts at its first token (or ends as a
// 503 if it fails before one) and ends as OpenAI's does: the last chunk
// carries finish_reason, then a usage chunk if stream_options.include_usage,
// then "data: [DONE]". An aborted request ends with finish_reason "abort"
// (200), as vLLM's. A client that leaves is seen from its socket
// (http/http_server.h) and its request is aborted.
//
// Bad input gets a 4xx with {"error": {...}} saying what is wrong, and
// nothing is applied.
//
// Ownership: owns the Node and the HTTP server. Threading: handlers run on
// the HTTP server's threads; a completion's output is pumped on its I/O
// threads, posted by the engine's token stream; Start/Stop from the main
// thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "base/result.h"
#include "http/http_server.h"
#include "runtime/node.h"
#include "server/text_codec.h"

namespace kvrelay::server {

struct ServerOptions {
  runtime::NodeOptions node;
  std::string model_name;                 // default "kvrelay-<shape>"
  // Text ↔ ids of the served model (text_codec.h); null: the emulated
  // model's toy tokenizer.
  std::shared_ptr<const TextCodec> codec;
  uint32_t max_prompt_tokens = 0;         // 0: the model's context - 1; longer get 400
  // POST /v1/completions at once per remote address (429 past it); 0: no
  // limit. The default leaves room for a router's max_inflight, both legs.
  uint32_t max_requests_per_client = 8192;
  // The HTTP server (http/http_server.h): address, threads and limits
  // (limits.max_body_bytes: larger bodies get 413). Its I/O threads serve
  // every connection; workers run the handlers that wait on the engine (a
  // completion's submit, an admin call up to op_timeout, a scrape). Its
  // error_body and on_thread_start are the server's own.
  http::ServerOptions http;
  std::chrono::milliseconds op_timeout{600'000};
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
  http::ServerStats HttpStats() const;

 private:
  struct Impl;
  explicit EngineServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvrelay::server
