// connection.h — Connection: one accepted HTTP/1.1 connection of HttpServer,
// as a state machine over its socket (internal to src/http).
//
// Why: every rule of http_server.h about limits, timeouts, keep-alive,
// responses chosen late and clients that leave is a transition here, in one
// place. The phases:
//
//   kIdle ──readable──▶ kHeader ──header ok──▶ kBody ──body ok──▶ kHandling
//     ▲                   │ limit/malformed/timeout: refuse, close   │
//     └──── response written, keep-alive, peer still open ◀──────────┘
//   any phase ──reset, error, Stop()──▶ kClosed
//
// While kHandling the connection watches the socket (readable: a pipelined
// byte is kept for the next request; end of stream: probing starts, see
// http_server.h; reset: the client is gone) and writes whatever the
// exchange queued, in order, bounded by max_stream_backlog_bytes.
//
// Ownership: shared; the pending asynchronous operations hold it, the
// exchange of the current request holds a weak reference. Threading: every
// member runs on the connection's strand; the exchange posts onto it.
// Invariants: at most one write in flight; a response is written only for
// the current request generation; the host's Closed() is called exactly once.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "base/mutex.h"
#include "http/exchange.h"
#include "http/http_request.h"
#include "http/http_server.h"
#include "http/request_rules.h"

namespace kvrelay::http {

// The server's counters, shared with its connections.
struct ServerCounters {
  std::atomic<uint64_t> connections_open{0}, connections_accepted{0},
      connections_refused_total_cap{0}, connections_refused_client_cap{0}, requests{0},
      refused_body_bytes{0}, refused_header_bytes{0}, refused_malformed{0}, refused_timeout{0},
      refused_busy{0}, clients_gone{0}, idle_closed{0};
};

// Whether the server still runs: an exchange holds its connection and posts
// onto its strand only under this lock, so never onto a destroyed
// io_context, and never is a connection's last owner once it is gone.
struct Liveness {
  Mutex mu;
  bool alive GUARDED_BY(mu) = true;
};

// What a connection needs from its server.
class ConnectionHost {
 public:
  virtual ~ConnectionHost() = default;
  virtual const ServerOptions& options() const = 0;
  virtual ServerCounters& counters() = 0;
  virtual const std::shared_ptr<Liveness>& liveness() const = 0;
  // Routes the request: runs its handler inline or queues it for a worker;
  // answers 404/405/503 itself through the exchange.
  virtual void Dispatch(Request request, std::shared_ptr<Exchange> exchange) = 0;
  // The connection closed (once per connection).
  virtual void Closed(uint64_t id, const std::string& remote_addr) = 0;
  virtual bool stopping() const = 0;
};

class ExchangeHandle;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ConnectionHost* host, uint64_t id, boost::asio::ip::tcp::socket socket,
             std::string remote_addr);
  // Starts reading the first request (call once, on any thread).
  void Start();
  // Closes the connection (server stop); any thread.
  void Shutdown();

  // --- called on the strand by ExchangeHandle --------------------------------
  void DoRespond(uint64_t seq, int status, std::string content_type, std::string body);
  void DoStartStream(uint64_t seq, int status, std::string content_type, std::string probe);
  void DoWrite(uint64_t seq, std::string bytes);
  void DoEnd(uint64_t seq);
  boost::asio::ip::tcp::socket::executor_type executor() { return socket_.get_executor(); }

 private:
  enum class Phase : uint8_t { kIdle, kHeader, kBody, kHandling, kClosed };
  enum class Resp : uint8_t { kNone, kStream, kDone };

  void WaitIdle();
  void OnReadable(const boost::system::error_code& ec);
  void ReadHeader();
  void OnHeader(const boost::system::error_code& ec);
  void ReadBody();
  void OnBody(const boost::system::error_code& ec);
  void OnRequest();
  void Watch();
  void Probe();
  // A read failed (or its phase timed out): the answer, then the close.
  void OnReadError(const boost::system::error_code& ec, const char* what, Duration bound);
  void Refuse(const Refusal& r);
  void Queue(std::string bytes);
  void Flush();
  void OnWritten(const boost::system::error_code& ec, size_t n);
  void ResponseWritten();
  void Linger();
  void ClientGone();
  void Close();
  void ArmTimer(Duration d);
  bool Current(uint64_t seq) const { return seq == seq_ && phase_ == Phase::kHandling; }
  std::string Head(int status, const std::string& content_type, bool chunked,
                   std::optional<size_t> length) const;

  ConnectionHost* const host_;
  const uint64_t id_;
  boost::asio::ip::tcp::socket socket_;
  const std::string remote_;
  boost::asio::steady_timer timer_, write_timer_, probe_timer_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;

  Phase phase_ = Phase::kIdle;
  Resp resp_ = Resp::kNone;
  uint64_t seq_ = 0;            // the current request's generation
  bool timed_out_ = false;      // the phase timer fired
  uint64_t timer_gen_ = 0;      // the phase timer's arming (a stale fire is ignored)
  uint64_t write_gen_ = 0;
  bool keep_alive_ = true;
  bool http11_ = true;
  bool chunked_ = false;        // the streamed response is chunked
  bool watching_ = false;       // an async_wait for readable is pending
  bool peer_eof_ = false;       // the client's sending side ended
  bool gone_ = false;
  bool closed_ = false;
  bool lingering_ = false;
  std::shared_ptr<ExchangeHandle> exchange_;   // the current request's
  std::string probe_chunk_;
  std::deque<std::string> out_;
  size_t out_bytes_ = 0;        // queued, not yet written
  bool writing_ = false;
  std::string in_flight_;
  size_t lingered_bytes_ = 0;
};

// The Exchange of one request: posts onto its connection's strand.
class ExchangeHandle : public Exchange {
 public:
  ExchangeHandle(std::weak_ptr<Connection> conn, uint64_t seq, std::shared_ptr<Liveness> live)
      : conn_(std::move(conn)), seq_(seq), live_(std::move(live)) {}
  void Respond(int status, std::string content_type, std::string body) override;
  void StartStream(int status, std::string content_type, std::string probe) override;
  void Write(std::string bytes) override;
  void End() override;
  void OnClientGone(std::function<void()> fn) override EXCLUDES(mu_);
  bool client_gone() const override { return gone_.load(std::memory_order_acquire); }
  // The connection saw the client leave (on its strand).
  void FireGone() EXCLUDES(mu_);

 private:
  template <typename F>
  void Post(F&& f);
  const std::weak_ptr<Connection> conn_;
  const uint64_t seq_;
  const std::shared_ptr<Liveness> live_;
  std::atomic<bool> gone_{false};
  Mutex mu_;
  std::function<void()> on_gone_ GUARDED_BY(mu_);
};

}  // namespace kvrelay::http
