// http_server.h — HttpServer: an event-driven HTTP/1.1 server (Boost.Beast on
// Asio) that serves any number of connections on a few I/O threads and hands
// each checked request to a route's handler.
//
// Why: kvrelay's engines and router answer requests that run for seconds or
// minutes (a completion, a lifecycle call), and clients that misbehave (idle,
// slow, huge, malformed) must cost a socket, not a thread. docs/design.md
// ("HTTP") argues the library choice.
//
// What it guarantees (each limit answered at once with a status and the
// error body the owner formats, then the connection closed):
//   - body size for every framing: a Content-Length over max_body_bytes, or a
//     chunked body the moment it crosses it: 413;
//   - header bytes (request line included) over max_header_bytes: 431; a
//     request target longer than max_target_bytes: 414; more than
//     max_header_count fields: 431;
//   - a malformed request (bad request line, header, Content-Length or chunk
//     framing): 400;
//   - a header not complete header_timeout after its first byte, or a body
//     not complete body_timeout after its header: 408;
//   - connections over max_connections, or over max_connections_per_client
//     from one address: accepted and closed at once, counted;
//   - a keep-alive connection idle for idle_timeout: closed.
// Handlers run on the I/O threads (Run::kInline: they must not block) or on
// a bounded worker pool (Run::kWorker: for calls that wait on the engine);
// a full worker queue is answered 503 at once.
//
// Client gone: while a response is pending the connection watches its
// socket. A reset is gone. An end of stream is either a close or a
// half-close; to tell which without touching the response, the server writes
// an interim "100 Continue" (HTTP/1.1 clients skip 1xx responses) every
// probe_interval: a closed peer answers it with a reset, a half-closed one
// reads it and waits for its answer. (HTTP/1.0 clients: an end of stream is
// gone.) A streamed response already started writes its `probe` chunk
// instead.
//
// Ownership: the owner (an engine's or the router's server) holds it; Stop()
// or the destructor stops accepting, closes every connection (their
// OnClientGone callbacks run) and joins the threads.
// Threading: Route() before Start(); Stats() and Stop() from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/result.h"
#include "base/time.h"
#include "http/exchange.h"
#include "http/http_request.h"

namespace kvrelay::http {

struct ServerLimits {
  size_t max_body_bytes = size_t{16} << 20;
  size_t max_header_bytes = 16 * 1024;
  size_t max_target_bytes = 8 * 1024;
  size_t max_header_count = 100;
  Duration header_timeout = Duration::Milliseconds(5000);
  Duration body_timeout = Duration::Milliseconds(30000);
  Duration idle_timeout = Duration::Milliseconds(60000);
  // A write that has not completed this long after it started (a client
  // that stopped reading): the connection is closed.
  Duration write_timeout = Duration::Milliseconds(30000);
  uint32_t max_connections = 20000;
  uint32_t max_connections_per_client = 0;   // 0: no per-client bound
  size_t max_stream_backlog_bytes = size_t{8} << 20;
  Duration probe_interval = Duration::Milliseconds(100);
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                // 0: any free port
  int backlog = 4096;
  uint32_t io_threads = 2;
  uint32_t worker_threads = 8;
  uint32_t worker_queue = 4096;     // requests waiting for a worker, at most
  ServerLimits limits;
  // Runs on each I/O thread and worker as it starts (e.g. a scheduler slice).
  std::function<void()> on_thread_start;
  // The body of an error the server answers itself (limits, 404, 405, 503),
  // as the owner formats its errors; `type` is OpenAI's error type.
  std::function<std::string(int status, const std::string& message, const std::string& type)>
      error_body;
  std::string error_content_type = "application/json";
};

// What the server counted since it started (monotonic except *_open).
struct ServerStats {
  uint64_t connections_open = 0;
  uint64_t connections_accepted = 0;
  uint64_t connections_refused_total_cap = 0;    // over max_connections
  uint64_t connections_refused_client_cap = 0;   // over max_connections_per_client
  uint64_t requests = 0;
  uint64_t refused_body_bytes = 0;
  uint64_t refused_header_bytes = 0;    // header bytes, field count or target
  uint64_t refused_malformed = 0;
  uint64_t refused_timeout = 0;         // 408s
  uint64_t refused_busy = 0;            // worker queue full
  uint64_t clients_gone = 0;            // OnClientGone fired
  uint64_t idle_closed = 0;
};

enum class Run : uint8_t { kInline, kWorker };

class HttpServer {
 public:
  using Handler = std::function<void(Request request, std::shared_ptr<Exchange> exchange)>;

  explicit HttpServer(ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes `method` `path` (exact, after percent-decoding) to `handler`. A
  // path with no route is 404; a path routed for other methods is 405.
  void Route(const std::string& method, const std::string& path, Run run, Handler handler);

  // Binds, listens and starts the threads; returns once every thread has
  // run on_thread_start. kUnavailable if the address cannot be bound.
  Status Start();
  uint16_t port() const;
  ServerStats Stats() const;
  // Runs `fn` on an I/O thread soon (never on the caller's); after Stop(),
  // never. It must not block. For owners whose work is driven by other
  // threads (an engine's token stream) to do their HTTP side off them.
  void Post(std::function<void()> fn);
  // Idempotent. Waits for the threads; handlers still running on workers
  // finish first (their exchanges write nothing). A response ended before
  // Stop() is still written out (up to 2 s, then its connection closes);
  // every other connection closes at once.
  void Stop();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvrelay::http
