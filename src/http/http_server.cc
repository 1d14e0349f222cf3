#include "http/http_server.h"

#include <pthread.h>

#include <deque>
#include <latch>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "base/check.h"
#include "base/mutex.h"
#include "http/connection.h"

namespace kvrelay::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

class HttpServer::Impl : public ConnectionHost {
 public:
  explicit Impl(ServerOptions o)
      : options_(std::move(o)), ioc_(static_cast<int>(std::max<uint32_t>(1, options_.io_threads))) {}

  const ServerOptions& options() const override { return options_; }
  ServerCounters& counters() override { return counters_; }
  const std::shared_ptr<Liveness>& liveness() const override { return live_; }
  bool stopping() const override { return stopping_.load(std::memory_order_acquire); }

  void Dispatch(Request request, std::shared_ptr<Exchange> exchange) override;
  void Closed(uint64_t id, const std::string& remote_addr) override EXCLUDES(conn_mu_);

  Status Start();
  void Stop();
  void Accept();
  void OnAccept(const error_code& ec, tcp::socket socket) EXCLUDES(conn_mu_);
  void WorkerLoop() EXCLUDES(work_mu_);
  std::string ErrorBody(int status, const std::string& message, const char* type) const {
    return options_.error_body ? options_.error_body(status, message, type) : message;
  }
  std::string ErrorType() const {
    return options_.error_body ? options_.error_content_type : "text/plain";
  }

  struct RouteEntry {
    std::string method, path;
    Run run;
    Handler handler;
  };

  ServerOptions options_;
  std::vector<RouteEntry> routes_;
  asio::io_context ioc_;
  // The acceptor and its retry timer are touched only on this strand (the
  // accept handler, the retry, Stop's close): asio objects are not safe to
  // use from two threads at once, and several I/O threads run ioc_.
  asio::strand<asio::io_context::executor_type> accept_strand_ = asio::make_strand(ioc_);
  std::optional<tcp::acceptor> acceptor_;
  asio::steady_timer accept_timer_{ioc_};
  std::vector<std::thread> io_threads_, workers_;
  // Counts the threads down as they are set up (Start); lives as long as
  // they do, since the I/O threads may still be leaving its wait.
  std::optional<std::latch> set_up_;
  ServerCounters counters_;
  std::shared_ptr<Liveness> live_ = std::make_shared<Liveness>();
  std::atomic<bool> stopping_{false};
  std::atomic<uint16_t> port_{0};
  bool started_ = false;
  Mutex stop_mu_;
  bool stopped_ GUARDED_BY(stop_mu_) = false;

  Mutex work_mu_;
  CondVar work_cv_;
  std::deque<std::function<void()>> work_ GUARDED_BY(work_mu_);
  bool work_stop_ GUARDED_BY(work_mu_) = false;

  Mutex conn_mu_;
  CondVar conn_cv_;
  uint64_t next_id_ GUARDED_BY(conn_mu_) = 1;
  std::map<uint64_t, std::weak_ptr<Connection>> conns_ GUARDED_BY(conn_mu_);
  std::map<std::string, uint32_t> per_client_ GUARDED_BY(conn_mu_);
};

void HttpServer::Impl::Dispatch(Request request, std::shared_ptr<Exchange> exchange) {
  const RouteEntry* found = nullptr;
  bool path_known = false;
  for (const RouteEntry& r : routes_) {
    if (r.path != request.path) continue;
    path_known = true;
    if (r.method == request.method) {
      found = &r;
      break;
    }
  }
  if (found == nullptr) {
    const int status = path_known ? 405 : 404;
    const std::string message =
        (path_known ? "method not allowed: " : "no such endpoint: ") + request.method + " " +
        request.path;
    exchange->Respond(status, ErrorType(),
                      ErrorBody(status, message, "invalid_request_error"));
    return;
  }
  if (found->run == Run::kInline) {
    found->handler(std::move(request), std::move(exchange));
    return;
  }
  {
    MutexLock lock(&work_mu_);
    if (!work_stop_ && work_.size() < options_.worker_queue) {
      work_.push_back([h = &found->handler, req = std::move(request), ex = exchange]() mutable {
        (*h)(std::move(req), std::move(ex));
      });
      work_cv_.NotifyOne();
      return;
    }
  }
  counters_.refused_busy++;
  exchange->Respond(503, ErrorType(),
                    ErrorBody(503, "the server is busy: its request queue is full", "server_error"));
}

void HttpServer::Impl::WorkerLoop() {
  pthread_setname_np(pthread_self(), "kv-http-work");
  if (options_.on_thread_start) options_.on_thread_start();
  set_up_->count_down();
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(&work_mu_);
      work_cv_.Wait(&work_mu_, [&]() REQUIRES(work_mu_) { return work_stop_ || !work_.empty(); });
      if (work_.empty()) return;   // stopping, and nothing left
      job = std::move(work_.front());
      work_.pop_front();
    }
    job();
  }
}

Status HttpServer::Impl::Start() {
  error_code ec;
  const asio::ip::address addr = asio::ip::make_address(options_.host, ec);
  if (ec) return Status(StatusCode::kInvalidArgument, "not an IP address: " + options_.host);
  acceptor_.emplace(ioc_);
  const tcp::endpoint ep(addr, options_.port);
  acceptor_->open(ep.protocol(), ec);
  if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(ep, ec);
  if (!ec) acceptor_->listen(options_.backlog, ec);
  if (ec) {
    return Status(StatusCode::kUnavailable, "cannot listen on " + options_.host + ":" +
                                                std::to_string(options_.port) + ": " +
                                                ec.message());
  }
  port_ = acceptor_->local_endpoint().port();
  Accept();
  started_ = true;
  // Nothing is served, and Start does not return, before every thread has
  // its name and ran on_thread_start: a client that got an answer (a
  // health probe, a test reading /proc) sees the server as configured.
  const uint32_t io_threads = std::max<uint32_t>(1, options_.io_threads);
  set_up_.emplace(static_cast<std::ptrdiff_t>(io_threads + options_.worker_threads));
  for (uint32_t i = 0; i < io_threads; ++i) {
    io_threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "kv-http-io");
      if (options_.on_thread_start) options_.on_thread_start();
      set_up_->arrive_and_wait();
      ioc_.run();
    });
  }
  for (uint32_t i = 0; i < options_.worker_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
  set_up_->wait();
  return Status();
}

void HttpServer::Impl::Accept() {
  acceptor_->async_accept(asio::make_strand(ioc_),
                          asio::bind_executor(accept_strand_,
                                              [this](const error_code& ec, tcp::socket s) {
                                                OnAccept(ec, std::move(s));
                                              }));
}

void HttpServer::Impl::OnAccept(const error_code& ec, tcp::socket socket) {
  if (stopping() || !acceptor_->is_open()) return;
  if (ec) {
    // Out of descriptors (or another transient failure): try again shortly
    // rather than spin on the error.
    accept_timer_.expires_after(std::chrono::milliseconds(50));
    accept_timer_.async_wait(asio::bind_executor(accept_strand_, [this](const error_code& tec) {
      if (!tec && !stopping()) Accept();
    }));
    return;
  }
  error_code rec;
  const tcp::endpoint remote = socket.remote_endpoint(rec);
  const std::string addr = rec ? std::string("?") : remote.address().to_string();
  const ServerLimits& limits = options_.limits;
  std::shared_ptr<Connection> conn;
  {
    MutexLock lock(&conn_mu_);
    uint32_t& per = per_client_[addr];
    if (conns_.size() >= limits.max_connections) {
      counters_.connections_refused_total_cap++;
    } else if (limits.max_connections_per_client != 0 &&
               per >= limits.max_connections_per_client) {
      counters_.connections_refused_client_cap++;
    } else {
      ++per;
      const uint64_t id = next_id_++;
      conn = std::make_shared<Connection>(this, id, std::move(socket), addr);
      conns_[id] = conn;
      counters_.connections_open++;
      counters_.connections_accepted++;
    }
    if (per == 0) per_client_.erase(addr);
  }
  if (conn) {
    conn->Start();
  } else {
    error_code ignored;
    socket.close(ignored);   // over a cap: accepted and closed at once
  }
  Accept();
}

void HttpServer::Impl::Closed(uint64_t id, const std::string& remote_addr) {
  MutexLock lock(&conn_mu_);
  if (conns_.erase(id) == 0) return;
  auto it = per_client_.find(remote_addr);
  if (it != per_client_.end() && --it->second == 0) per_client_.erase(it);
  counters_.connections_open--;
  conn_cv_.NotifyAll();
}

void HttpServer::Impl::Stop() {
  {
    MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (!started_) return;
  stopping_ = true;
  asio::post(accept_strand_, [this] {
    error_code ignored;
    acceptor_->close(ignored);
  });
  std::vector<std::shared_ptr<Connection>> open;
  {
    MutexLock lock(&conn_mu_);
    for (auto& [id, weak] : conns_) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) c->Shutdown();
  open.clear();
  {
    MutexLock lock(&work_mu_);
    work_stop_ = true;
    work_cv_.NotifyAll();
  }
  for (std::thread& t : workers_) t.join();
  {
    MutexLock lock(&conn_mu_);
    conn_cv_.WaitFor(&conn_mu_, std::chrono::seconds(2),
                     [&]() REQUIRES(conn_mu_) { return conns_.empty(); });
  }
  {
    MutexLock lock(&live_->mu);
    live_->alive = false;
  }
  ioc_.stop();
  for (std::thread& t : io_threads_) t.join();
}

// --- HttpServer -------------------------------------------------------------------

HttpServer::HttpServer(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Route(const std::string& method, const std::string& path, Run run,
                       Handler handler) {
  KV_CHECK(!impl_->started_);
  impl_->routes_.push_back(Impl::RouteEntry{method, path, run, std::move(handler)});
}

Status HttpServer::Start() {
  KV_CHECK(!impl_->started_);
  return impl_->Start();
}

uint16_t HttpServer::port() const { return impl_->port_.load(); }

ServerStats HttpServer::Stats() const {
  const ServerCounters& c = impl_->counters_;
  ServerStats s;
  s.connections_open = c.connections_open.load();
  s.connections_accepted = c.connections_accepted.load();
  s.connections_refused_total_cap = c.connections_refused_total_cap.load();
  s.connections_refused_client_cap = c.connections_refused_client_cap.load();
  s.requests = c.requests.load();
  s.refused_body_bytes = c.refused_body_bytes.load();
  s.refused_header_bytes = c.refused_header_bytes.load();
  s.refused_malformed = c.refused_malformed.load();
  s.refused_timeout = c.refused_timeout.load();
  s.refused_busy = c.refused_busy.load();
  s.clients_gone = c.clients_gone.load();
  s.idle_closed = c.idle_closed.load();
  return s;
}

void HttpServer::Stop() { impl_->Stop(); }

void HttpServer::Post(std::function<void()> fn) {
  MutexLock lock(&impl_->live_->mu);
  if (!impl_->live_->alive) return;
  asio::post(impl_->ioc_, std::move(fn));
}

}  // namespace kvrelay::http
