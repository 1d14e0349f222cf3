// http_client.h — ClientCall: one HTTP/1.1 request from kvrelay to a server
// (an engine, the router), asynchronous on an Asio executor, cancellable at
// once from any thread; and Fetch / BlockingCall, the same on the calling
// thread for tools and tests.
//
// Why: the router's legs must never hold a thread while an engine computes,
// and either leg (or the client) must be able to stop the other at once:
// Cancel() closes the socket, which is how an engine learns its client left.
// One implementation serves the router (asynchronous, on its I/O threads)
// and every tool (blocking, on a private io_context).
//
// Body bytes of a 200 answer go to sink.on_data as they arrive (de-chunked)
// when it is set; otherwise, and for every other status, the body is
// collected (up to max_body_bytes; more is kResourceExhausted).
//
// Errors (the Result's status): kCancelled (Cancel(), or on_data returned
// false); kUnavailable (cannot connect, or the connection failed or closed
// before the response ended); kDeadlineExceeded (connect_timeout, or
// idle_timeout of silence while reading); kResourceExhausted (body over the
// limit); kDataLoss (not an HTTP response); kInvalidArgument (a bad URL).
//
// Ownership: shared; the pending operations hold it. Threading: Start() and
// Cancel() from any thread; callbacks run on the call's strand, one at a
// time, and `done` exactly once, last.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/result.h"
#include "base/time.h"

namespace boost::asio {
class io_context;
}

namespace kvrelay::http {

struct ClientOptions {
  Duration connect_timeout = Duration::Seconds(3);
  Duration idle_timeout = Duration::Seconds(60);
  size_t max_body_bytes = size_t{64} << 20;
  static ClientOptions Timeouts(Duration connect, Duration idle) {
    ClientOptions o;
    o.connect_timeout = connect;
    o.idle_timeout = idle;
    return o;
  }
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct ClientRequest {
  std::string method = "GET";
  std::string target = "/";
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
};

struct ClientResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;   // names lower-cased
  std::string body;   // empty when it went to on_data
  std::string_view Header(std::string_view name) const;
};

struct ClientSink {
  std::function<void(int status)> on_status;       // the head arrived
  std::function<bool(std::string_view)> on_data;   // 200 body bytes; false: stop
};

// "http://host:port" (a trailing path is refused).
struct Endpoint {
  std::string host;
  uint16_t port = 80;
};
Result<Endpoint> ParseBaseUrl(std::string_view url);

class ClientCall {
 public:
  using Done = std::function<void(Result<ClientResponse>)>;
  virtual ~ClientCall() = default;
  // Starts the call on `ioc` (its own strand).
  static std::shared_ptr<ClientCall> Start(boost::asio::io_context& ioc, const Endpoint& to,
                                           ClientRequest request, const ClientOptions& options,
                                           ClientSink sink, Done done);
  virtual void Cancel() = 0;
};

// The threads asynchronous calls run on (the router's legs): owns an
// io_context and `threads` threads, stopped and joined by Stop() or the
// destructor. A call still running then is dropped without its `done`:
// cancel the calls (and wait for them) first.
// Threading: Start() and Stop() from any thread.
class ClientContext {
 public:
  explicit ClientContext(uint32_t threads);
  ~ClientContext();
  ClientContext(const ClientContext&) = delete;
  ClientContext& operator=(const ClientContext&) = delete;
  std::shared_ptr<ClientCall> Start(const Endpoint& to, ClientRequest request,
                                    const ClientOptions& options, ClientSink sink,
                                    ClientCall::Done done);
  void Stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One call on the calling thread; Cancel() from any other thread ends it
// (kCancelled), before, during or after Run().
class BlockingCall {
 public:
  BlockingCall();
  ~BlockingCall();
  Result<ClientResponse> Run(const std::string& base_url, ClientRequest request,
                             const ClientOptions& options = {}, ClientSink sink = {})
      EXCLUDES(mu_);
  void Cancel() EXCLUDES(mu_);

 private:
  Mutex mu_;
  bool cancelled_ GUARDED_BY(mu_) = false;
  std::shared_ptr<ClientCall> call_ GUARDED_BY(mu_);
};

// One call on the calling thread.
Result<ClientResponse> Fetch(const std::string& base_url, ClientRequest request,
                             const ClientOptions& options = {}, ClientSink sink = {});
// Calls to one base URL, for tools and tests; each call on the calling
// thread, on a connection of its own. Threading: any thread; const.
class Client {
 public:
  explicit Client(std::string base_url, ClientOptions options = {})
      : base_url_(std::move(base_url)), options_(options) {}
  Result<ClientResponse> Get(const std::string& target, Headers headers = {}) const;
  Result<ClientResponse> Post(const std::string& target, std::string body,
                              std::string content_type = "application/json",
                              Headers headers = {}) const;
  const std::string& base_url() const { return base_url_; }
  const ClientOptions& options() const { return options_; }

 private:
  std::string base_url_;
  ClientOptions options_;
};

// Shorthands: GET target; POST body (JSON) to target.
Result<ClientResponse> Get(const std::string& base_url, const std::string& target,
                           const ClientOptions& options = {});
Result<ClientResponse> PostJson(const std::string& base_url, const std::string& target,
                                std::string body, const ClientOptions& options = {});

}  // namespace kvrelay::http
