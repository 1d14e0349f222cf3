#include "http/connection.h"

#include <algorithm>
#include <chrono>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>

#include "http/request_rules.h"

namespace kvrelay::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::system::error_code;

namespace {

constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
constexpr size_t kLingerMaxBytes = size_t{4} << 20;
constexpr auto kLingerTime = std::chrono::milliseconds(500);

std::string Chunk(const std::string& bytes) {
  char size[24];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", bytes.size());
  std::string out;
  out.reserve(bytes.size() + static_cast<size_t>(n) + 2);
  out.append(size, static_cast<size_t>(n));
  out += bytes;
  out += "\r\n";
  return out;
}

}  // namespace

// --- ExchangeHandle -------------------------------------------------------------

// The connection is held only under the lock and only while the server
// runs: this thread may end up its last owner, and its destructor (the
// timers, the socket) needs the io_context. Held before the check, a handle
// answering late destroyed it after the server had stopped (UBSan: invalid
// vptr in the timer service's destructor, http_server_test under ASan).
template <typename F>
void ExchangeHandle::Post(F&& f) {
  MutexLock lock(&live_->mu);
  if (!live_->alive) return;
  std::shared_ptr<Connection> conn = conn_.lock();   // released before the lock
  if (!conn) return;
  asio::post(conn->executor(), [conn, fn = std::forward<F>(f)]() mutable { fn(*conn); });
}

void ExchangeHandle::Respond(int status, std::string content_type, std::string body) {
  Post([seq = seq_, status, t = std::move(content_type), b = std::move(body)](
           Connection& c) mutable { c.DoRespond(seq, status, std::move(t), std::move(b)); });
}

void ExchangeHandle::StartStream(int status, std::string content_type, std::string probe) {
  Post([seq = seq_, status, t = std::move(content_type), p = std::move(probe)](
           Connection& c) mutable { c.DoStartStream(seq, status, std::move(t), std::move(p)); });
}

void ExchangeHandle::Write(std::string bytes) {
  if (bytes.empty()) return;
  Post([seq = seq_, b = std::move(bytes)](Connection& c) mutable { c.DoWrite(seq, std::move(b)); });
}

void ExchangeHandle::End() {
  Post([seq = seq_](Connection& c) { c.DoEnd(seq); });
}

void ExchangeHandle::OnClientGone(std::function<void()> fn) {
  {
    MutexLock lock(&mu_);
    if (!gone_.load(std::memory_order_acquire)) {
      on_gone_ = std::move(fn);
      return;
    }
  }
  if (fn) fn();
}

void ExchangeHandle::FireGone() {
  std::function<void()> fn;
  {
    MutexLock lock(&mu_);
    if (gone_.exchange(true, std::memory_order_acq_rel)) return;
    fn = std::move(on_gone_);
  }
  if (fn) fn();
}

// --- Connection -----------------------------------------------------------------

Connection::Connection(ConnectionHost* host, uint64_t id, asio::ip::tcp::socket socket,
                       std::string remote_addr)
    : host_(host),
      id_(id),
      socket_(std::move(socket)),
      remote_(std::move(remote_addr)),
      timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()),
      probe_timer_(socket_.get_executor()) {}

void Connection::Start() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    error_code ec;
    self->socket_.set_option(asio::ip::tcp::no_delay(true), ec);
    self->socket_.non_blocking(true, ec);
    self->WaitIdle();
  });
}

// The server stops. A connection whose response is complete but not yet out
// (a router's last "shutting down" event) keeps writing it: OnWritten then
// ends it through ResponseWritten, which lingers because the host is stopping.
// That is bounded by the write timeout and by Stop()'s wait. Any other
// connection (idle, reading, or a response still open) closes now.
void Connection::Shutdown() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    const bool tail_pending = self->phase_ == Phase::kHandling && self->resp_ == Resp::kDone &&
                              (self->writing_ || !self->out_.empty());
    if (!tail_pending) self->Close();
  });
}

void Connection::ArmTimer(Duration d) {
  timed_out_ = false;
  const uint64_t gen = ++timer_gen_;
  timer_.expires_after(std::chrono::nanoseconds(d.ns()));
  timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
    // A fire that raced with a cancel belongs to a phase that is over.
    if (ec || self->closed_ || gen != self->timer_gen_) return;
    self->timed_out_ = true;
    error_code ignored;
    self->socket_.cancel(ignored);   // the phase's read ends with operation_aborted
  });
}

void Connection::WaitIdle() {
  phase_ = Phase::kIdle;
  if (buffer_.size() > 0) return ReadHeader();   // a pipelined request is here
  ArmTimer(host_->options().limits.idle_timeout);
  if (watching_) return;   // the wait from the last request's watch serves
  watching_ = true;
  socket_.async_wait(asio::ip::tcp::socket::wait_read,
                     [self = shared_from_this()](const error_code& ec) { self->OnReadable(ec); });
}

void Connection::Watch() {
  if (watching_ || closed_ || peer_eof_) return;
  if (buffer_.size() >= host_->options().limits.max_header_bytes) return;   // enough kept
  watching_ = true;
  socket_.async_wait(asio::ip::tcp::socket::wait_read,
                     [self = shared_from_this()](const error_code& ec) { self->OnReadable(ec); });
}

void Connection::OnReadable(const error_code& ec) {
  watching_ = false;
  if (closed_) return;
  if (phase_ == Phase::kIdle) {
    if (ec) {
      if (timed_out_) host_->counters().idle_closed++;
      return Close();
    }
    ++timer_gen_;
    timer_.cancel();
    return ReadHeader();
  }
  if (phase_ != Phase::kHandling || ec) return;
  // A response is pending: see what the client did.
  error_code rec;
  const size_t n = socket_.read_some(buffer_.prepare(4096), rec);
  if (!rec) {
    buffer_.commit(n);   // the next request, pipelined: kept for later
    return Watch();
  }
  if (rec == asio::error::would_block || rec == asio::error::try_again) return Watch();
  if (rec == asio::error::eof) {
    peer_eof_ = true;
    if (!http11_) return ClientGone();
    return Probe();
  }
  ClientGone();
}

void Connection::Probe() {
  if (closed_ || resp_ == Resp::kDone || phase_ != Phase::kHandling) return;
  if (!writing_ && out_.empty()) {
    if (resp_ == Resp::kNone) {
      Queue(kContinue);
    } else if (!probe_chunk_.empty()) {
      Queue(chunked_ ? Chunk(probe_chunk_) : probe_chunk_);
    }
  }
  probe_timer_.expires_after(std::chrono::nanoseconds(host_->options().limits.probe_interval.ns()));
  probe_timer_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (!ec) self->Probe();
  });
}

void Connection::ReadHeader() {
  phase_ = Phase::kHeader;
  const ServerLimits& limits = host_->options().limits;
  parser_.emplace();
  ApplyLimits(limits, &*parser_);
  ArmTimer(limits.header_timeout);
  bhttp::async_read_header(socket_, buffer_, *parser_,
                           [self = shared_from_this()](const error_code& ec, size_t) {
                             self->OnHeader(ec);
                           });
}

void Connection::OnReadError(const error_code& ec, const char* what, Duration bound) {
  if (timed_out_) {
    return Refuse(Refusal{408,
                          std::string("the request ") + what + " did not arrive within " +
                              std::to_string(bound.ns() / 1000000) + " ms",
                          Refusal::Reason::kTimeout});
  }
  if (std::optional<Refusal> r = RefusalFor(ec, host_->options().limits)) return Refuse(*r);
  Close();   // closed or reset: nothing to answer
}

void Connection::OnHeader(const error_code& ec) {
  ++timer_gen_;
  timer_.cancel();
  if (closed_) return;
  const ServerLimits& limits = host_->options().limits;
  if (ec) return OnReadError(ec, "header", limits.header_timeout);
  const RequestMessage& head = parser_->get();
  if (std::optional<Refusal> r = CheckHead(head, limits)) return Refuse(*r);
  http11_ = head.version() >= 11;
  keep_alive_ = head.keep_alive();
  auto expect = head.find(bhttp::field::expect);
  if (expect != head.end() && AsciiLower(expect->value()) == "100-continue" &&
      !parser_->is_done()) {
    Queue(kContinue);
  }
  ReadBody();
}

void Connection::ReadBody() {
  phase_ = Phase::kBody;
  if (parser_->is_done()) return OnRequest();
  ArmTimer(host_->options().limits.body_timeout);
  bhttp::async_read(socket_, buffer_, *parser_,
                    [self = shared_from_this()](const error_code& ec, size_t) { self->OnBody(ec); });
}

void Connection::OnBody(const error_code& ec) {
  ++timer_gen_;
  timer_.cancel();
  if (closed_) return;
  if (ec) return OnReadError(ec, "body", host_->options().limits.body_timeout);
  OnRequest();
}

void Connection::OnRequest() {
  host_->counters().requests++;
  Request req;
  std::optional<Refusal> bad = BuildRequest(parser_->release(), remote_, id_, &req);
  parser_.reset();
  if (bad) return Refuse(*bad);
  ++seq_;
  phase_ = Phase::kHandling;
  resp_ = Resp::kNone;
  exchange_ = std::make_shared<ExchangeHandle>(weak_from_this(), seq_, host_->liveness());
  Watch();
  host_->Dispatch(std::move(req), exchange_);
}

std::string Connection::Head(int status, const std::string& content_type, bool chunked,
                             std::optional<size_t> length) const {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " ";
  h += std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(status)));
  h += "\r\n";
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  if (content_type.rfind("text/event-stream", 0) == 0) h += "Cache-Control: no-cache\r\n";
  if (length) h += "Content-Length: " + std::to_string(*length) + "\r\n";
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  h += keep_alive_ && !peer_eof_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  h += "\r\n";
  return h;
}

void Connection::DoRespond(uint64_t seq, int status, std::string content_type, std::string body) {
  if (!Current(seq) || resp_ != Resp::kNone || closed_) return;
  resp_ = Resp::kDone;
  std::string bytes = Head(status, content_type, false, body.size());
  bytes += body;
  Queue(std::move(bytes));
}

void Connection::DoStartStream(uint64_t seq, int status, std::string content_type,
                               std::string probe) {
  if (!Current(seq) || resp_ != Resp::kNone || closed_) return;
  resp_ = Resp::kStream;
  chunked_ = http11_;
  if (!chunked_) keep_alive_ = false;   // an HTTP/1.0 body ends at the close
  probe_chunk_ = std::move(probe);
  Queue(Head(status, content_type, chunked_, std::nullopt));
}

void Connection::DoWrite(uint64_t seq, std::string bytes) {
  if (!Current(seq) || resp_ != Resp::kStream || closed_ || bytes.empty()) return;
  if (out_bytes_ + bytes.size() > host_->options().limits.max_stream_backlog_bytes) {
    return ClientGone();   // it stopped reading
  }
  Queue(chunked_ ? Chunk(bytes) : std::move(bytes));
}

void Connection::DoEnd(uint64_t seq) {
  if (!Current(seq) || resp_ != Resp::kStream || closed_) return;
  resp_ = Resp::kDone;
  if (chunked_) Queue("0\r\n\r\n");
  if (!writing_ && out_.empty()) ResponseWritten();
}

void Connection::Refuse(const Refusal& r) {
  ServerCounters& c = host_->counters();
  switch (r.reason) {
    case Refusal::Reason::kBodyBytes: c.refused_body_bytes++; break;
    case Refusal::Reason::kHeaderBytes: c.refused_header_bytes++; break;
    case Refusal::Reason::kMalformed: c.refused_malformed++; break;
    case Refusal::Reason::kTimeout: c.refused_timeout++; break;
  }
  const ServerOptions& o = host_->options();
  const std::string body =
      o.error_body ? o.error_body(r.status, r.message, "invalid_request_error") : r.message;
  keep_alive_ = false;
  phase_ = Phase::kHandling;
  ++seq_;
  resp_ = Resp::kDone;
  std::string bytes = Head(r.status, o.error_body ? o.error_content_type : "text/plain", false,
                           body.size());
  bytes += body;
  Queue(std::move(bytes));
}

void Connection::Queue(std::string bytes) {
  out_bytes_ += bytes.size();
  out_.push_back(std::move(bytes));
  Flush();
}

void Connection::Flush() {
  if (writing_ || out_.empty() || closed_) return;
  writing_ = true;
  in_flight_.clear();
  while (!out_.empty()) {
    in_flight_ += out_.front();
    out_.pop_front();
  }
  const uint64_t gen = ++write_gen_;
  write_timer_.expires_after(
      std::chrono::nanoseconds(host_->options().limits.write_timeout.ns()));
  write_timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
    if (!ec && gen == self->write_gen_) self->Close();   // the client stopped reading
  });
  asio::async_write(socket_, asio::buffer(in_flight_),
                    [self = shared_from_this()](const error_code& ec, size_t n) {
                      self->OnWritten(ec, n);
                    });
}

void Connection::OnWritten(const error_code& ec, size_t n) {
  writing_ = false;
  ++write_gen_;
  write_timer_.cancel();
  out_bytes_ -= std::min(out_bytes_, n);
  if (closed_) return;
  if (ec) return ClientGone();
  if (!out_.empty()) return Flush();
  if (resp_ == Resp::kDone && phase_ == Phase::kHandling) ResponseWritten();
}

void Connection::ResponseWritten() {
  exchange_.reset();
  probe_timer_.cancel();
  if (!keep_alive_ || peer_eof_ || host_->stopping()) return Linger();
  WaitIdle();
}

// The last response is out; the client may still be sending (a refused
// body). Stop sending, read (and drop) what comes for a moment, then close:
// closing with unread bytes would reset the connection and could destroy the
// response in the client's buffers before it read it.
void Connection::Linger() {
  if (closed_) return;
  if (!lingering_) {
    lingering_ = true;
    error_code ignored;
    socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    const uint64_t gen = ++timer_gen_;
    timer_.expires_after(kLingerTime);
    timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
      if (!ec && gen == self->timer_gen_) self->Close();
    });
  }
  socket_.async_wait(asio::ip::tcp::socket::wait_read,
                     [self = shared_from_this()](const error_code& ec) {
                       if (ec || self->closed_) return self->Close();
                       char drop[16384];
                       error_code rec;
                       const size_t n = self->socket_.read_some(asio::buffer(drop), rec);
                       self->lingered_bytes_ += n;
                       if ((rec && rec != asio::error::would_block) ||
                           self->lingered_bytes_ > kLingerMaxBytes) {
                         return self->Close();
                       }
                       self->Linger();
                     });
}

void Connection::ClientGone() {
  if (gone_ || closed_) return Close();
  gone_ = true;
  if (exchange_ && resp_ != Resp::kDone) {
    host_->counters().clients_gone++;
    std::shared_ptr<ExchangeHandle> ex = exchange_;
    ex->FireGone();
  }
  Close();
}

void Connection::Close() {
  if (closed_) return;
  // A response still pending: its handler learns the client is gone.
  if (exchange_ && resp_ != Resp::kDone && !gone_) {
    gone_ = true;
    host_->counters().clients_gone++;
    exchange_->FireGone();
  }
  closed_ = true;
  phase_ = Phase::kClosed;
  exchange_.reset();
  error_code ignored;
  timer_.cancel();
  write_timer_.cancel();
  probe_timer_.cancel();
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  host_->Closed(id_, remote_);
}

}  // namespace kvrelay::http
