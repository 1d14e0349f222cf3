// exchange.h — Exchange: the handle through which a handler answers one
// request, from any thread, whenever its outcome is known.
//
// Why: an engine's completion ends when the engine loop says so, a router's
// when its legs do; neither may hold an I/O thread (or any thread) while it
// waits. The handler keeps the Exchange and answers later: Respond() with a
// whole response (its status chosen then, not before), or StartStream() and
// Write()s then End(). Nothing is written to the client before one of
// these, so a failure that is known late still gets its own status.
//
// The client leaving is seen from the socket (its connection closed or
// reset), not by writing into the response: OnClientGone's callback runs
// once, on an I/O thread, and the handler should cancel the work. A client
// that only half-closes (shut down its sending side, still reading) is not
// gone: it gets its answer (http_server.h explains how the two are told
// apart).
//
// Ownership: shared (std::shared_ptr) by the handler and the connection; it
// names one request of one connection (a generation), so a handle kept past
// its request writes nothing into the connection's next one.
// Threading: every method may be called from any thread, any number of
// times; calls after the response ended (or the client left) do nothing.
// Order: Respond or StartStream first and once; Write and End after
// StartStream.
#pragma once

#include <functional>
#include <string>

namespace kvrelay::http {

class Exchange {
 public:
  virtual ~Exchange() = default;

  // The whole response. Connection kept alive unless the request asked
  // otherwise.
  virtual void Respond(int status, std::string content_type, std::string body) = 0;
  // A chunked response whose body follows in Write()s. `probe` is a chunk
  // the server may write while the client is suspected gone (an SSE comment
  // for a stream; empty: never write one).
  virtual void StartStream(int status, std::string content_type, std::string probe) = 0;
  // Appends to the streamed body. Bounded: if more than the server's
  // max_stream_backlog_bytes wait unsent (a client that stopped reading),
  // the client is treated as gone.
  virtual void Write(std::string bytes) = 0;
  // Ends the streamed body.
  virtual void End() = 0;
  // `fn` runs once if the client goes away before the response ended (at
  // once, on the calling thread, if it already has). Set it once.
  virtual void OnClientGone(std::function<void()> fn) = 0;
  virtual bool client_gone() const = 0;
};

}  // namespace kvrelay::http
