// Tests of HttpServer and the client against it, over real loopback sockets:
// routes, responses chosen late, streams, every limit, clients that leave,
// half-close, idle connections and the connection caps. Raw sockets play the
// misbehaving clients.
#include "http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "http/http_client.h"

namespace kvrelay::http {
namespace {

using namespace std::chrono_literals;

// A raw client socket to the server.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawClient() { Close(); }
  bool connected() const { return connected_; }
  bool Send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  void HalfClose() { ::shutdown(fd_, SHUT_WR); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Reads until `until` appears, the peer closes, or `timeout` passes.
  std::string ReadUntil(const std::string& until, std::chrono::milliseconds timeout,
                        bool* closed = nullptr) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    size_t from = 0;  // `until` does not start before this: each byte is searched once
    for (;;) {
      if (!until.empty()) {
        if (got_.find(until, from) != std::string::npos) break;
        from = got_.size() < until.size() ? 0 : got_.size() - until.size() + 1;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        if (closed != nullptr) *closed = true;
        break;
      }
      got_.append(buf, static_cast<size_t>(n));
    }
    return got_;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string got_;
};

std::string ErrorBody(int status, const std::string& message, const std::string& type) {
  return "{\"error\":{\"message\":\"" + message + "\",\"type\":\"" + type +
         "\",\"code\":" + std::to_string(status) + "}}";
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(ServerLimits limits = {}) {
    ServerOptions o;
    o.limits = limits;
    o.io_threads = 2;
    o.worker_threads = 2;
    o.error_body = ErrorBody;
    server_ = std::make_unique<HttpServer>(o);
    server_->Route("GET", "/hello", Run::kInline, [](Request req, std::shared_ptr<Exchange> ex) {
      ex->Respond(200, "text/plain", "hello " + req.QueryValue("name"));
    });
    server_->Route("POST", "/echo", Run::kWorker, [](Request req, std::shared_ptr<Exchange> ex) {
      ex->Respond(200, "application/octet-stream", req.body);
    });
    // Answers 503 from another thread 300 ms later: the status is chosen
    // when the outcome is known.
    server_->Route("POST", "/late", Run::kInline, [this](Request, std::shared_ptr<Exchange> ex) {
      ex->OnClientGone([this] { gone_++; });
      std::thread([ex] {
        std::this_thread::sleep_for(300ms);
        ex->Respond(503, "application/json", "{\"late\":true}");
      }).detach();
    });
    // Never answers until the client leaves.
    server_->Route("POST", "/hang", Run::kInline, [this](Request, std::shared_ptr<Exchange> ex) {
      ex->OnClientGone([this, ex] { gone_++; });
      hung_.push_back(ex);
    });
    server_->Route("GET", "/stream", Run::kInline, [](Request, std::shared_ptr<Exchange> ex) {
      ex->StartStream(200, "text/event-stream", ": probe\n\n");
      std::thread([ex] {
        for (int i = 0; i < 3; ++i) {
          ex->Write("data: " + std::to_string(i) + "\n\n");
          std::this_thread::sleep_for(20ms);
        }
        ex->End();
      }).detach();
    });
    // A stream whose last bytes are far more than the socket buffers hold,
    // ended at once: Stop() finds them still being written.
    server_->Route("GET", "/tail", Run::kInline, [this](Request, std::shared_ptr<Exchange> ex) {
      ex->StartStream(200, "application/octet-stream", "");
      ex->Write(std::string(kTailBytes, 't') + "end");
      ex->End();
      tail_written_ = true;
    });
    ASSERT_TRUE(server_->Start().ok());
    url_ = "http://127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  std::unique_ptr<HttpServer> server_;
  std::string url_;
  std::atomic<int> gone_{0};
  std::vector<std::shared_ptr<Exchange>> hung_;
  std::atomic<bool> tail_written_{false};
  static constexpr size_t kTailBytes = 32u << 20;
};

TEST_F(HttpServerTest, RoutesAnswerAndUnknownOnesAre404Or405) {
  StartServer();
  Result<ClientResponse> r = Get(url_, "/hello?name=a%20b");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello a b");
  r = Get(url_, "/nope");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);
  EXPECT_NE(r->body.find("no such endpoint: GET /nope"), std::string::npos);
  r = PostJson(url_, "/hello", "{}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);
}

TEST_F(HttpServerTest, KeepAliveServesRequestsInTurnOnOneConnection) {
  StartServer();
  RawClient c(server_->port());
  ASSERT_TRUE(c.Send("GET /hello?name=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /hello?name=2 HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string got = c.ReadUntil("hello 2", 2000ms);
  EXPECT_NE(got.find("hello 1"), std::string::npos) << got;
  EXPECT_NE(got.find("hello 2"), std::string::npos) << got;
  EXPECT_EQ(server_->Stats().connections_accepted, 1u);
}

TEST_F(HttpServerTest, StatusIsChosenWhenTheOutcomeIsKnown) {
  StartServer();
  Result<ClientResponse> r = PostJson(url_, "/late", "{}");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->body, "{\"late\":true}");
  EXPECT_EQ(gone_.load(), 0);
}

TEST_F(HttpServerTest, AStreamArrivesInOrderThroughTheClientSink) {
  StartServer();
  std::string got;
  int status = 0;
  ClientSink sink;
  sink.on_status = [&](int s) { status = s; };
  sink.on_data = [&](std::string_view b) {
    got += b;
    return true;
  };
  ClientRequest req;
  req.target = "/stream";
  Result<ClientResponse> r = Fetch(url_, req, {}, sink);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(status, 200);
  EXPECT_EQ(got, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
}

TEST_F(HttpServerTest, ABodyOverTheLimitIs413AtOnceForEveryFraming) {
  ServerLimits l;
  l.max_body_bytes = 1000;
  StartServer(l);
  {
    // Content-Length over the limit: refused from the header alone.
    RawClient c(server_->port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"));
    const std::string got = c.ReadUntil("}}", 2000ms);
    EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got;
    EXPECT_NE(got.find("--max-body-bytes"), std::string::npos) << got;
  }
  {
    // Chunked: refused the moment the chunks cross it; the client is still
    // sending (it would send 300 MB).
    RawClient c(server_->port());
    ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string chunk = "200\r\n" + std::string(512, 'a') + "\r\n";
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.Send(chunk));
    const std::string got = c.ReadUntil("}}", 2000ms);
    EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);
  }
  {
    // Under the limit, chunked: the body arrives de-chunked.
    ClientRequest req;
    req.method = "POST";
    req.target = "/echo";
    req.body = std::string(900, 'b');
    Result<ClientResponse> r = Fetch(url_, req);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body.size(), 900u);
  }
  EXPECT_EQ(server_->Stats().refused_body_bytes, 2u);
}

TEST_F(HttpServerTest, MalformedRequestsAre400AtOnce) {
  StartServer();
  const std::vector<std::string> bad = {
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
      "\x01\x02garbage\r\n\r\n",
      "GET /hello HTTP/1.1\r\nHost x\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
      "GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
  };
  for (const std::string& req : bad) {
    RawClient c(server_->port());
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(c.Send(req));
    bool closed = false;
    const std::string got = c.ReadUntil("", 2000ms, &closed);
    EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << req << " -> " << got;
    EXPECT_TRUE(closed);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms) << req;
  }
}

TEST_F(HttpServerTest, HeaderLimitsAnd408) {
  ServerLimits l;
  l.max_header_bytes = 2048;
  l.max_header_count = 10;
  l.max_target_bytes = 100;
  l.header_timeout = Duration::Milliseconds(200);
  StartServer(l);
  auto status_of = [&](const std::string& req) {
    RawClient c(server_->port());
    c.Send(req);
    return c.ReadUntil("\r\n", 2000ms).substr(0, 12);
  };
  EXPECT_EQ(status_of("GET /hello HTTP/1.1\r\nX: " + std::string(4000, 'a') + "\r\n\r\n"),
            "HTTP/1.1 431");
  std::string many = "GET /hello HTTP/1.1\r\n";
  for (int i = 0; i < 20; ++i) many += "X" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(status_of(many + "\r\n"), "HTTP/1.1 431");
  EXPECT_EQ(status_of("GET /hello?" + std::string(200, 'a') + " HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 414");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(status_of("GET /hello HTTP/1.1\r\nHost: x\r\n"), "HTTP/1.1 408");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
}

TEST_F(HttpServerTest, AClientThatClosesIsSeenGoneWithoutAResponseWrite) {
  StartServer();
  RawClient c(server_->port());
  ASSERT_TRUE(c.Send("POST /hang HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"));
  for (int i = 0; i < 100 && hung_.empty(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(hung_.size(), 1u);
  c.Close();
  for (int i = 0; i < 200 && gone_.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(gone_.load(), 1);
  EXPECT_TRUE(hung_[0]->client_gone());
}

TEST_F(HttpServerTest, AClientThatHalfClosesStillGetsItsAnswer) {
  StartServer();
  RawClient c(server_->port());
  ASSERT_TRUE(c.Send("POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"));
  c.HalfClose();
  const std::string got = c.ReadUntil("{\"late\":true}", 3000ms);
  EXPECT_NE(got.find("HTTP/1.1 503"), std::string::npos) << got;
  EXPECT_NE(got.find("{\"late\":true}"), std::string::npos) << got;
  EXPECT_EQ(gone_.load(), 0);
}

TEST_F(HttpServerTest, IdleConnectionsDoNotDelayOthers) {
  StartServer();
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 600; ++i) {
    idle.push_back(std::make_unique<RawClient>(server_->port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  idle[0]->Send("GET /hello HTTP/1.1\r\n");   // a header that never ends
  const auto t0 = std::chrono::steady_clock::now();
  Result<ClientResponse> r = Get(url_, "/hello?name=x");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
}

TEST_F(HttpServerTest, ConnectionsOverThePerClientCapAreClosedAtOnceAndCounted) {
  ServerLimits l;
  l.max_connections_per_client = 3;
  StartServer(l);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<RawClient>(server_->port()));
  for (int i = 0; i < 100 && server_->Stats().connections_open < 3; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  RawClient over(server_->port());
  bool closed = false;
  over.ReadUntil("", 2000ms, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(server_->Stats().connections_refused_client_cap, 1u);
  held.clear();
  for (int i = 0; i < 200 && server_->Stats().connections_open > 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  Result<ClientResponse> r = Get(url_, "/hello");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpServerTest, StopEndsHungRequestsAndTheirClientsLearnIt) {
  StartServer();
  std::thread t([&] {
    Result<ClientResponse> r = PostJson(url_, "/hang", "{}");
    EXPECT_FALSE(r.ok());
  });
  for (int i = 0; i < 100 && hung_.empty(); ++i) std::this_thread::sleep_for(10ms);
  server_->Stop();
  t.join();
  EXPECT_EQ(gone_.load(), 1);
  hung_[0]->Respond(200, "text/plain", "late");   // after Stop: does nothing
}

// A response ended before Stop() reaches its client whole, even though its
// bytes were still on their way out (the router's last "shutting down" event
// to a streaming client is written just before it stops its server).
TEST_F(HttpServerTest, StopLetsAnEndedResponseFinishWriting) {
  ServerLimits l;
  l.max_stream_backlog_bytes = 2 * kTailBytes;   // the tail is queued whole
  StartServer(l);
  RawClient c(server_->port());
  ASSERT_TRUE(c.Send("GET /tail HTTP/1.1\r\nHost: x\r\n\r\n"));
  for (int i = 0; i < 200 && !tail_written_.load(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(tail_written_.load());
  std::thread stop([&] { server_->Stop(); });
  bool closed = false;
  const std::string got = c.ReadUntil("end\r\n0\r\n\r\n", 10000ms, &closed);
  stop.join();
  EXPECT_NE(got.find("end\r\n0\r\n\r\n"), std::string::npos)
      << got.size() << " bytes of " << kTailBytes << "; closed early: " << closed;
}

// Nothing is served, and Start does not return, before every I/O and
// worker thread ran its start hook: an owner that sets a thread property
// there (the engine's scheduler slice) sees it applied once a client got an
// answer. The workers' hooks are slow; a client polls the port while Start
// runs.
TEST(HttpServerStartTest, NothingIsServedBeforeEveryThreadRanItsStartHook) {
  for (int round = 0; round < 3; ++round) {
    uint16_t port = 0;
    {  // a free port, to poll before Start returns
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
      socklen_t len = sizeof a;
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      port = ntohs(a.sin_port);
      close(fd);
    }
    std::atomic<int> started{0};
    ServerOptions o;
    o.port = port;
    o.io_threads = 2;
    o.worker_threads = 8;
    o.on_thread_start = [&started] {
      char name[16] = {};
      pthread_getname_np(pthread_self(), name, sizeof name);
      if (std::string(name) == "kv-http-work") std::this_thread::sleep_for(50ms);
      started++;
    };
    HttpServer server(o);
    std::atomic<int> at_first_answer{-1};
    server.Route("GET", "/hello", Run::kInline, [&](Request, std::shared_ptr<Exchange> ex) {
      int none = -1;
      at_first_answer.compare_exchange_strong(none, started.load());
      ex->Respond(200, "text/plain", "hello");
    });
    std::atomic<bool> answered{false};
    std::thread poller([&] {
      const Client cli("http://127.0.0.1:" + std::to_string(port),
                       ClientOptions::Timeouts(Duration::Seconds(1), Duration::Seconds(5)));
      for (int i = 0; i < 2000 && !answered; ++i) {
        if (cli.Get("/hello").ok()) answered = true;
        std::this_thread::sleep_for(1ms);
      }
    });
    ASSERT_TRUE(server.Start().ok());
    EXPECT_EQ(started.load(), 10) << "round " << round;
    poller.join();
    EXPECT_TRUE(answered);
    EXPECT_EQ(at_first_answer.load(), 10) << "round " << round;
    server.Stop();
  }
}

TEST(HttpClientTest, CancelFromAnotherThreadEndsACallAtOnce) {
  ServerOptions o;
  HttpServer server(o);
  server.Route("GET", "/hang", Run::kInline, [](Request, std::shared_ptr<Exchange> ex) {
    static std::vector<std::shared_ptr<Exchange>> keep;
    keep.push_back(ex);
  });
  ASSERT_TRUE(server.Start().ok());
  BlockingCall call;
  std::thread canceller([&] {
    std::this_thread::sleep_for(100ms);
    call.Cancel();
  });
  const auto t0 = std::chrono::steady_clock::now();
  ClientRequest req;
  req.target = "/hang";
  Result<ClientResponse> r =
      call.Run("http://127.0.0.1:" + std::to_string(server.port()), req);
  canceller.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);
  server.Stop();
}

TEST(HttpClientTest, BadUrlsAndRefusedConnectionsAreErrors) {
  EXPECT_EQ(Get("ftp://x", "/").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Get("http://127.0.0.1:99999", "/").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Get("http://127.0.0.1:1", "/").status().code(), StatusCode::kUnavailable);
}

TEST(SplitTargetTest, DecodesPathAndQuery) {
  std::string path;
  std::multimap<std::string, std::string> q;
  ASSERT_TRUE(SplitTarget("/a%2Fb?x=1&x=2&y=a+b&z", &path, &q));
  EXPECT_EQ(path, "/a/b");
  EXPECT_EQ(q.count("x"), 2u);
  EXPECT_EQ(q.find("y")->second, "a b");
  EXPECT_EQ(q.count("z"), 1u);
  EXPECT_FALSE(SplitTarget("/a%2", &path, &q));
  EXPECT_FALSE(SplitTarget("a", &path, &q));
}

}  // namespace
}  // namespace kvrelay::http
