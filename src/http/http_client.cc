#include "http/http_client.h"

#include <pthread.h>

#include <cctype>
#include <chrono>
#include <optional>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

namespace kvrelay::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

std::string_view ClientResponse::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return {};
}

Result<Endpoint> ParseBaseUrl(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return Status(StatusCode::kInvalidArgument,
                  "not an http:// URL: '" + std::string(url) + "'");
  }
  std::string_view rest = url.substr(kScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) {
    return Status(StatusCode::kInvalidArgument,
                  "a base URL has no path: '" + std::string(url) + "'");
  }
  Endpoint e;
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) {
    e.host = std::string(rest);
  } else {
    e.host = std::string(rest.substr(0, colon));
    const std::string_view p = rest.substr(colon + 1);
    unsigned long v = 0;
    for (char c : p) {
      if (!std::isdigit(static_cast<unsigned char>(c))) v = 70000;
      v = std::min<unsigned long>(v * 10 + static_cast<unsigned long>(c - '0'), 70000);
    }
    if (p.empty() || v == 0 || v > 65535) {
      return Status(StatusCode::kInvalidArgument, "bad port in '" + std::string(url) + "'");
    }
    e.port = static_cast<uint16_t>(v);
  }
  if (e.host.empty()) {
    return Status(StatusCode::kInvalidArgument, "no host in '" + std::string(url) + "'");
  }
  return e;
}

namespace {

class CallImpl : public ClientCall, public std::enable_shared_from_this<CallImpl> {
 public:
  CallImpl(asio::io_context& ioc, Endpoint to, ClientRequest request, ClientOptions options,
           ClientSink sink, Done done)
      : stream_(asio::make_strand(ioc)),
        resolver_(stream_.get_executor()),
        to_(std::move(to)),
        request_(std::move(request)),
        options_(options),
        sink_(std::move(sink)),
        done_(std::move(done)) {}

  void Begin() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->Connect(); });
  }

  void Cancel() override {
    cancelled_.store(true, std::memory_order_release);
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->finished_) return;
      error_code ignored;
      self->resolver_.cancel();
      self->stream_.socket().cancel(ignored);
      self->stream_.socket().close(ignored);
    });
  }

 private:
  bool Cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  void Connect() {
    if (Cancelled()) return Finish(Status(StatusCode::kCancelled, "cancelled"));
    error_code ec;
    const asio::ip::address addr = asio::ip::make_address(to_.host, ec);
    stream_.expires_after(std::chrono::nanoseconds(options_.connect_timeout.ns()));
    if (!ec) {
      stream_.async_connect(tcp::endpoint(addr, to_.port),
                            [self = shared_from_this()](const error_code& cec) {
                              self->OnConnect(cec);
                            });
      return;
    }
    resolver_.async_resolve(
        to_.host, std::to_string(to_.port),
        [self = shared_from_this()](const error_code& rec, tcp::resolver::results_type r) {
          if (rec) return self->Failed(rec, "cannot resolve " + self->to_.host);
          self->stream_.async_connect(
              r, [self](const error_code& cec, const tcp::endpoint&) { self->OnConnect(cec); });
        });
  }

  void OnConnect(const error_code& ec) {
    if (ec) {
      return Failed(ec, "cannot connect to " + to_.host + ":" + std::to_string(to_.port));
    }
    error_code ignored;
    stream_.socket().set_option(tcp::no_delay(true), ignored);
    req_.method_string(request_.method);
    req_.target(request_.target);
    req_.version(11);
    req_.set(bhttp::field::host, to_.host + ":" + std::to_string(to_.port));
    for (const auto& [k, v] : request_.headers) req_.set(k, v);
    if (!request_.body.empty() || request_.method == "POST") {
      req_.set(bhttp::field::content_type, request_.content_type);
    }
    req_.body() = std::move(request_.body);
    req_.prepare_payload();
    stream_.expires_after(std::chrono::nanoseconds(options_.idle_timeout.ns()));
    bhttp::async_write(stream_, req_, [self = shared_from_this()](const error_code& wec, size_t) {
      if (wec) return self->Failed(wec, "sending the request failed");
      self->parser_.emplace();
      self->parser_->body_limit(boost::none);   // bounded below, per use
      self->parser_->header_limit(64 * 1024);
      self->ReadSome();
    });
  }

  void ReadSome() {
    stream_.expires_after(std::chrono::nanoseconds(options_.idle_timeout.ns()));
    bhttp::async_read_some(stream_, buffer_, *parser_,
                           [self = shared_from_this()](const error_code& ec, size_t) {
                             self->OnRead(ec);
                           });
  }

  void OnRead(const error_code& ec) {
    if (Cancelled()) return Finish(Status(StatusCode::kCancelled, "cancelled"));
    if (!ec && parser_->is_header_done() && status_ == 0) {
      status_ = static_cast<int>(parser_->get().result_int());
      streaming_ = sink_.on_data && status_ == 200;
      if (sink_.on_status) sink_.on_status(status_);
      if (Cancelled()) return Finish(Status(StatusCode::kCancelled, "cancelled"));
    }
    if (parser_->is_header_done()) {
      std::string& body = parser_->get().body();
      if (streaming_ && !body.empty()) {
        std::string bytes = std::move(body);
        body.clear();
        if (!sink_.on_data(bytes)) {
          cancelled_ = true;
          return Finish(Status(StatusCode::kCancelled, "stopped by the reader"));
        }
      } else if (!streaming_ && body.size() > options_.max_body_bytes) {
        return Finish(Status(StatusCode::kResourceExhausted,
                             "the response body is longer than " +
                                 std::to_string(options_.max_body_bytes) + " bytes"));
      }
    }
    if (ec) return Failed(ec, "reading the response failed");
    if (parser_->is_done()) {
      ClientResponse r;
      r.status = status_;
      for (const auto& f : parser_->get()) {
        std::string name(f.name_string());
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        r.headers.emplace_back(std::move(name), std::string(f.value()));
      }
      if (!streaming_) r.body = std::move(parser_->get().body());
      return Finish(std::move(r));
    }
    ReadSome();
  }

  void Failed(const error_code& ec, const std::string& what) {
    if (Cancelled() || ec == asio::error::operation_aborted) {
      return Finish(Status(StatusCode::kCancelled, "cancelled"));
    }
    if (ec == beast::error::timeout) {
      return Finish(Status(StatusCode::kDeadlineExceeded, what + ": timed out"));
    }
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      return Finish(Status(StatusCode::kDataLoss, what + ": " + ec.message()));
    }
    Finish(Status(StatusCode::kUnavailable, what + ": " + ec.message()));
  }

  void Finish(Result<ClientResponse> r) {
    if (finished_) return;
    finished_ = true;
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    Done done = std::move(done_);
    done_ = nullptr;
    sink_ = ClientSink{};
    if (done) done(std::move(r));
  }

  beast::tcp_stream stream_;
  tcp::resolver resolver_;
  const Endpoint to_;
  ClientRequest request_;
  const ClientOptions options_;
  ClientSink sink_;
  Done done_;
  bhttp::request<bhttp::string_body> req_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::response_parser<bhttp::string_body>> parser_;
  std::atomic<bool> cancelled_{false};
  bool finished_ = false;
  bool streaming_ = false;
  int status_ = 0;
};

}  // namespace

std::shared_ptr<ClientCall> ClientCall::Start(asio::io_context& ioc, const Endpoint& to,
                                              ClientRequest request, const ClientOptions& options,
                                              ClientSink sink, Done done) {
  auto call = std::make_shared<CallImpl>(ioc, to, std::move(request), options, std::move(sink),
                                         std::move(done));
  call->Begin();
  return call;
}

struct ClientContext::State {
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::vector<std::thread> threads;
  Mutex mu;
  bool stopped GUARDED_BY(mu) = false;
};

ClientContext::ClientContext(uint32_t threads) : state_(std::make_unique<State>()) {
  state_->guard.emplace(state_->ioc.get_executor());
  for (uint32_t i = 0; i < std::max<uint32_t>(1, threads); ++i) {
    state_->threads.emplace_back([s = state_.get()] {
      pthread_setname_np(pthread_self(), "kv-http-call");
      s->ioc.run();
    });
  }
}

ClientContext::~ClientContext() { Stop(); }

std::shared_ptr<ClientCall> ClientContext::Start(const Endpoint& to, ClientRequest request,
                                                 const ClientOptions& options, ClientSink sink,
                                                 ClientCall::Done done) {
  return ClientCall::Start(state_->ioc, to, std::move(request), options, std::move(sink),
                           std::move(done));
}

void ClientContext::Stop() {
  {
    MutexLock lock(&state_->mu);
    if (state_->stopped) return;
    state_->stopped = true;
  }
  state_->guard.reset();
  state_->ioc.stop();
  for (std::thread& t : state_->threads) t.join();
}

BlockingCall::BlockingCall() = default;
BlockingCall::~BlockingCall() = default;

Result<ClientResponse> BlockingCall::Run(const std::string& base_url, ClientRequest request,
                                         const ClientOptions& options, ClientSink sink) {
  Result<Endpoint> to = ParseBaseUrl(base_url);
  if (!to.ok()) return to.status();
  asio::io_context ioc(1);
  std::optional<Result<ClientResponse>> out;
  std::shared_ptr<ClientCall> call =
      ClientCall::Start(ioc, *to, std::move(request), options, std::move(sink),
                        [&out](Result<ClientResponse> r) { out.emplace(std::move(r)); });
  {
    MutexLock lock(&mu_);
    call_ = call;
    if (cancelled_) call->Cancel();
  }
  ioc.run();
  {
    MutexLock lock(&mu_);
    call_.reset();
  }
  if (!out) return Status(StatusCode::kInternal, "the call ended without a result");
  return std::move(*out);
}

void BlockingCall::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  if (call_) call_->Cancel();
}

Result<ClientResponse> Fetch(const std::string& base_url, ClientRequest request,
                             const ClientOptions& options, ClientSink sink) {
  BlockingCall call;
  return call.Run(base_url, std::move(request), options, std::move(sink));
}

Result<ClientResponse> Client::Get(const std::string& target, Headers headers) const {
  ClientRequest r;
  r.method = "GET";
  r.target = target;
  r.headers = std::move(headers);
  return Fetch(base_url_, std::move(r), options_);
}

Result<ClientResponse> Client::Post(const std::string& target, std::string body,
                                    std::string content_type, Headers headers) const {
  ClientRequest r;
  r.method = "POST";
  r.target = target;
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  r.headers = std::move(headers);
  return Fetch(base_url_, std::move(r), options_);
}

Result<ClientResponse> Get(const std::string& base_url, const std::string& target,
                           const ClientOptions& options) {
  ClientRequest r;
  r.method = "GET";
  r.target = target;
  return Fetch(base_url, std::move(r), options);
}

Result<ClientResponse> PostJson(const std::string& base_url, const std::string& target,
                                std::string body, const ClientOptions& options) {
  ClientRequest r;
  r.method = "POST";
  r.target = target;
  r.body = std::move(body);
  return Fetch(base_url, std::move(r), options);
}

}  // namespace kvrelay::http
