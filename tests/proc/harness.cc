#include "proc/harness.h"

#include <arpa/inet.h>
#include <execinfo.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "http/http_client.h"
#include "runtime/free_port.h"

extern char** environ;

namespace kvrelay::proctest {

namespace {

using Clock = std::chrono::steady_clock;

// --- children killed if the test process is stopped by a signal -----------------

constexpr int kMaxChildren = 256;
std::atomic<pid_t> g_children[kMaxChildren];

void RegisterChild(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, pid)) return;
  }
}

void UnregisterChild(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

void KillAllChildren() {
  for (auto& slot : g_children) {
    const pid_t pid = slot.load();
    if (pid > 0) ::kill(pid, SIGKILL);
  }
}

extern "C" void OnFatalSignal(int sig) {
  KillAllChildren();   // async-signal-safe: atomics and kill()
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// A crash of the test itself: say where (backtrace_symbols_fd does not
// allocate), stop the children, die of the same signal.
extern "C" void OnCrash(int sig) {
  KillAllChildren();
  static const char kMsg[] = "\n[harness] the test process crashed; backtrace:\n";
  ssize_t ignored = ::write(2, kMsg, sizeof kMsg - 1);
  (void)ignored;
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, 2);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// --- per-test directories, removed when the test passed -------------------------

std::mutex g_dirs_mu;
std::map<std::string, std::string> g_dirs;     // test full name → directory
std::map<std::string, uint64_t> g_seeds;       // test full name → seed

std::string CurrentTestName() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "no_test";
  return std::string(info->test_suite_name()) + "." + info->name();
}

class DirCleaner : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::string name = std::string(info.test_suite_name()) + "." + info.name();
    std::string dir;
    {
      std::lock_guard<std::mutex> lock(g_dirs_mu);
      auto it = g_dirs.find(name);
      if (it == g_dirs.end()) return;
      dir = it->second;
      g_dirs.erase(it);
    }
    if (info.result() != nullptr && info.result()->Failed()) {
      std::printf("[harness] kept the failed test's files in %s\n", dir.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

struct Registrar {
  Registrar() {
    ::testing::UnitTest::GetInstance()->listeners().Append(new DirCleaner);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, OnFatalSignal);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, OnCrash);
    {
      void* warm[4];
      ::backtrace(warm, 4);   // loads libgcc now, not in the handler
    }
    std::atexit(KillAllChildren);
    // A peer that closes mid-write must not kill the test.
    ::signal(SIGPIPE, SIG_IGN);
  }
};
const Registrar g_registrar;

std::string Tail(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  return "...\n" + s.substr(s.size() - max_bytes);
}

std::string Sanitize(std::string s) {
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') c = '_';
  }
  return s;
}

HttpReply FromResult(const Result<http::ClientResponse>& r, Clock::time_point t0) {
  HttpReply out;
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.body = json::value_t::discarded;
  if (!r.ok()) {
    out.error = r.status().message();
    return out;
  }
  out.status = r->status;
  out.raw = r->body;
  out.body = json::parse(out.raw, nullptr, /*allow_exceptions=*/false);
  return out;
}

http::ClientOptions OptionsFor(std::chrono::milliseconds timeout) {
  return http::ClientOptions::Timeouts(Duration::Seconds(5),
                                       Duration::Milliseconds(timeout.count()));
}

}  // namespace

const char* KvrelayBinary() {
  // $KVRELAY_BIN runs the tests against another build of the binary.
  // (Made absolute: children run in the test's directory.)
  static const std::string path = [] {
    const char* env = std::getenv("KVRELAY_BIN");
    if (env == nullptr || *env == '\0') return std::string(KVRELAY_BIN);
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::absolute(env, ec);
    return ec ? std::string(env) : p.string();
  }();
  return path.c_str();
}

const std::string& TestDir() {
  const std::string name = CurrentTestName();
  std::lock_guard<std::mutex> lock(g_dirs_mu);
  auto it = g_dirs.find(name);
  if (it != g_dirs.end()) return it->second;
  std::string tmpl = "/tmp/kvrelay-proc-" + Sanitize(name).substr(0, 80) + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char* made = ::mkdtemp(buf.data());
  return g_dirs.emplace(name, made != nullptr ? std::string(made) : std::string("/tmp"))
      .first->second;
}

uint64_t TestSeed() {
  const std::string name = CurrentTestName();
  {
    std::lock_guard<std::mutex> lock(g_dirs_mu);
    auto it = g_seeds.find(name);
    if (it != g_seeds.end()) return it->second;
  }
  uint64_t seed;
  if (const char* env = std::getenv("KVRELAY_PROC_SEED"); env != nullptr && *env != '\0') {
    seed = std::strtoull(env, nullptr, 0);
  } else {
    std::random_device rd;
    seed = (uint64_t{rd()} << 32) ^ rd();
  }
  std::printf("[seed] %s: KVRELAY_PROC_SEED=%llu\n", name.c_str(),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::lock_guard<std::mutex> lock(g_dirs_mu);
  g_seeds[name] = seed;
  return seed;
}

// --- ports --------------------------------------------------------------------------

uint16_t FreePorts(uint32_t n) { return runtime::FreeLoopbackPorts(n); }

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds poll) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (pred()) return true;
    if (Clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(poll);
  }
}

// --- Proc ---------------------------------------------------------------------------

std::unique_ptr<Proc> Proc::Start(const std::string& binary,
                                  const std::vector<std::string>& args,
                                  const std::string& log_path, std::string* error) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  // The child runs in the log's directory: a core file it leaves lands
  // there, next to its log, not over another process's.
  const std::string dir = log_path.substr(0, log_path.find_last_of('/'));
  if (!dir.empty()) posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGABRT, SIGPIPE}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> all;
  all.push_back(binary);
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  {
    std::ofstream log(log_path, std::ios::app);
    log << "$";
    for (const std::string& a : all) log << " " << a;
    log << "\n";
  }
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, binary.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    *error = "posix_spawn " + binary + ": " + std::strerror(rc);
    return nullptr;
  }
  RegisterChild(pid);
  return std::unique_ptr<Proc>(new Proc(pid, log_path));
}

Proc::~Proc() {
  if (!status_) {
    Kill(SIGTERM);
    if (!Wait(10s)) {
      std::printf("[harness] pid %d did not stop within 10 s of SIGTERM: SIGKILL\n", pid_);
      Kill(SIGKILL);
      Wait(10s);
    }
  }
  UnregisterChild(pid_);
  // A kvrelay that crashed could not unlink its shm segments
  // ("/kvrelay-<pid>-..."): they are this child's, and garbage now.
  std::error_code ec;
  const std::string prefix = "kvrelay-" + std::to_string(pid_) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  if (::testing::Test::HasFailure()) PrintLog();
}

void Proc::Kill(int sig) {
  if (!status_) ::kill(pid_, sig);
}

std::optional<int> Proc::Wait(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    int st = 0;
    const pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      UnregisterChild(pid_);
      return status_;
    }
    if (r < 0 && errno != EINTR) {   // not our child any more: treat as gone
      status_ = -1;
      return status_;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(5ms);
  }
}

std::string Proc::ReadLog() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Proc::PrintLog(size_t max_bytes) const {
  std::string status = "running";
  if (status_) {
    const int st = *status_;
    if (st == -1) {
      status = "gone";
    } else if (WIFEXITED(st)) {
      status = "exit " + std::to_string(WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
      status = std::string("signal ") + strsignal(WTERMSIG(st));
    }
  }
  std::printf("==== log of pid %d (%s), %s ====\n%s==== end of log of pid %d ====\n", pid_,
              status.c_str(), log_path_.c_str(), Tail(ReadLog(), max_bytes).c_str(), pid_);
  std::fflush(stdout);
}

// --- Engine -------------------------------------------------------------------------

std::unique_ptr<Engine> Engine::Start(const EngineConfig& config, std::string* error) {
  std::string why;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    auto e = std::unique_ptr<Engine>(new Engine);
    e->config_ = config;
    e->http_port_ = FreePort();
    e->ctrl_port_ = FreePorts(config.tp);
    if (e->http_port_ == 0 || e->ctrl_port_ == 0) {
      *error = "no free ports";
      return nullptr;
    }
    // Distinct from the port, so a test notices if one is taken for the other.
    e->engine_id_ = 100000u + e->http_port_;
    std::vector<std::string> args = {
        "serve",
        "--role", config.role,
        "--tp", std::to_string(config.tp),
        "--transport", config.transport,
        "--host", "127.0.0.1",
        "--port", std::to_string(e->http_port_),
        "--ctrl-port", std::to_string(e->ctrl_port_),
        "--engine-id", std::to_string(e->engine_id_),
        "--model-shape", "tiny",
        "--abort-timeout-s", std::to_string(config.abort_timeout_s),
    };
    args.insert(args.end(), config.extra.begin(), config.extra.end());
    const std::string log = TestDir() + "/" + Sanitize(config.name) + "-" +
                            std::to_string(e->http_port_) + ".log";
    e->proc_ = Proc::Start(KvrelayBinary(), args, log, error);
    if (!e->proc_) return nullptr;

    bool up = false, exited = false;
    const auto deadline = Clock::now() + 20s;
    while (Clock::now() < deadline) {
      if (e->proc_->Wait(0ms)) {
        exited = true;
        break;
      }
      HttpReply h = e->Get("/health", 1s);
      if (h.status == 200) {
        // The port may have been taken by another test's engine (tests run
        // in parallel processes): it is ours only if it has our engine id.
        HttpReply info = e->Get("/kv_info", 1s);
        const json& j = info.body;
        if (j.is_object() && j.value("engine_id", 0u) == e->engine_id_) {
          up = true;
          break;
        }
      }
      std::this_thread::sleep_for(20ms);
    }
    if (up) return e;
    const std::string text = e->proc_->ReadLog();
    why = std::string(exited ? "exited before /health answered"
                             : "/health did not answer 200 within 20 s") +
          "; log " + log + ":\n" + Tail(text, 4000);
    const bool port_lost = text.find("cannot listen") != std::string::npos ||
                           text.find("cannot bind") != std::string::npos ||
                           text.find("Address already in use") != std::string::npos;
    if (!(exited && port_lost)) break;   // only a lost port race is retried
    e->proc_.reset();
    std::printf("[harness] %s lost a port race (attempt %d); retrying on new ports\n",
                config.name.c_str(), attempt);
  }
  *error = config.name + " (" + config.role + ", tp " + std::to_string(config.tp) + ", " +
           config.transport + "): " + why;
  return nullptr;
}

HttpReply Engine::Post(const std::string& path, const json& body,
                       std::chrono::milliseconds timeout) {
  return PostRaw(path, body.dump(), "application/json", timeout);
}

HttpReply Engine::PostRaw(const std::string& path, const std::string& body,
                          const std::string& content_type, std::chrono::milliseconds timeout) {
  return PostOn(http_port_, path, body, content_type, timeout);
}

HttpReply Engine::Get(const std::string& path, std::chrono::milliseconds timeout) {
  return GetOn(http_port_, path, timeout);
}

std::string UrlOf(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

HttpReply PostOn(uint16_t port, const std::string& path, const std::string& body,
                 const std::string& content_type, std::chrono::milliseconds timeout) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + timeout;
  http::ClientRequest req;
  req.method = "POST";
  req.target = path;
  req.body = body;
  req.content_type = content_type;
  std::string received;
  http::ClientSink sink;
  sink.on_data = [&](std::string_view data) {
    received.append(data);
    return Clock::now() < deadline;
  };
  Result<http::ClientResponse> r =
      http::Fetch(UrlOf(port), std::move(req), OptionsFor(timeout), std::move(sink));
  HttpReply out = FromResult(r, t0);
  if (r.ok() && r->status == 200) {
    out.raw = std::move(received);
    out.body = json::parse(out.raw, nullptr, /*allow_exceptions=*/false);
  } else if (!r.ok() && Clock::now() >= deadline) {
    out.error += " (gave up after " + std::to_string(timeout.count()) + " ms)";
  }
  return out;
}

HttpReply GetOn(uint16_t port, const std::string& path, std::chrono::milliseconds timeout) {
  const auto t0 = Clock::now();
  http::ClientRequest req;
  req.target = path;
  return FromResult(http::Fetch(UrlOf(port), std::move(req), OptionsFor(timeout)), t0);
}

std::unique_ptr<Router> Router::Start(const std::vector<std::string>& prefill,
                                      const std::vector<std::string>& decode,
                                      const std::vector<std::string>& extra, std::string* error,
                                      bool wait_up) {
  for (int attempt = 1; attempt <= 3; ++attempt) {
    auto r = std::unique_ptr<Router>(new Router);
    r->port_ = FreePort();
    std::vector<std::string> args = {"router", "--host", "127.0.0.1", "--port",
                                     std::to_string(r->port_), "--prefill"};
    args.insert(args.end(), prefill.begin(), prefill.end());
    args.push_back("--decode");
    args.insert(args.end(), decode.begin(), decode.end());
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string log = TestDir() + "/router-" + std::to_string(r->port_) + ".log";
    r->proc_ = Proc::Start(KvrelayBinary(), args, log, error);
    if (!r->proc_) return nullptr;
    if (!wait_up) return r;
    bool up = false, exited = false;
    const auto deadline = Clock::now() + 30s;
    while (Clock::now() < deadline) {
      if (r->proc_->Wait(0ms)) {
        exited = true;
        break;
      }
      if (GetOn(r->port_, "/health").status == 200) {
        up = true;
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    if (up) return r;
    const std::string text = r->proc_->ReadLog();
    *error = std::string(exited ? "the router exited" : "/health not 200 within 30 s") +
             "; log:\n" + text;
    if (!(exited && text.find("cannot listen") != std::string::npos)) return nullptr;
  }
  return nullptr;
}

std::string Router::Metrics() {
  HttpReply r = GetOn(port_, "/metrics");
  return r.status == 200 ? r.raw : std::string();
}

double Router::Outcome(const std::string& outcome) {
  return MetricSum(Metrics(), "kvrelay_router_requests_total", "outcome=\"" + outcome + "\"");
}

json Engine::DebugState() {
  HttpReply r = Get("/debug/state");
  if (r.status != 200 || !r.is_json()) return nullptr;
  return r.body;
}

std::string Engine::Metrics() {
  HttpReply r = Get("/metrics");
  return r.status == 200 ? r.raw : std::string();
}

bool Engine::IdleAndEmpty() {
  json s = DebugState();
  if (!s.is_object()) return false;
  const json* engine = s.contains("engine") ? &s["engine"] : nullptr;
  return s.value("idle", false) && engine != nullptr && engine->is_object() &&
         engine->value("blocks_used", uint64_t{1}) == 0;
}

json Engine::RemotePrefillParams(const std::string& transfer_id) const {
  return json{{"do_remote_prefill", true},
              {"transfer_id", transfer_id},
              {"remote_engine_id", engine_id_},
              {"remote_host", "127.0.0.1"},
              {"remote_port", ctrl_port_},
              {"remote_tp_size", config_.tp}};
}

// --- metrics ------------------------------------------------------------------------

double MetricSum(const std::string& text, const std::string& name,
                 const std::string& label_filter) {
  double sum = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end = line.find_first_of("{ ");
    if (end == std::string::npos || line.compare(0, end, name) != 0 || end != name.size()) {
      continue;
    }
    std::string labels;
    if (line[end] == '{') {
      const size_t close = line.find('}', end);
      if (close == std::string::npos) continue;
      labels = line.substr(end + 1, close - end - 1);
    }
    if (!label_filter.empty() && labels.find(label_filter) == std::string::npos) continue;
    const size_t sp = line.find_last_of(' ');
    sum += std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return sum;
}

// --- RawHttp ------------------------------------------------------------------------

RawHttp::~RawHttp() { Close(); }

bool RawHttp::Connect(uint16_t port) {
  Close();
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    Close();
    return false;
  }
  return true;
}

bool RawHttp::Send(const std::string& method, const std::string& path,
                   const std::string& body) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                    "Content-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  size_t off = 0;
  while (off < req.size()) {
    const ssize_t n = ::send(fd_, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

int RawHttp::ReadStatus(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (header_end_ == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || fd_ < 0) return -1;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    buf_.append(chunk, static_cast<size_t>(n));
    header_end_ = buf_.find("\r\n\r\n");
  }
  // "HTTP/1.1 200 OK"
  const size_t sp = buf_.find(' ');
  if (sp == std::string::npos) return -1;
  return std::atoi(buf_.c_str() + sp + 1);
}

std::string RawHttp::ReadRest(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (fd_ >= 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf_.append(chunk, static_cast<size_t>(n));
  }
  if (header_end_ == std::string::npos) header_end_ = buf_.find("\r\n\r\n");
  return header_end_ == std::string::npos ? std::string() : buf_.substr(header_end_ + 4);
}

void RawHttp::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// --- the P/D hand-off ---------------------------------------------------------------

std::string NewTransferId(std::mt19937_64& rng) {
  uint64_t hi = 0, lo = 0;
  while (hi == 0 && lo == 0) {
    hi = rng();
    lo = rng();
  }
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

std::vector<engine::Token> RandomPrompt(std::mt19937_64& rng, size_t n, uint32_t vocab) {
  std::vector<engine::Token> p(n);
  for (auto& t : p) t = static_cast<engine::Token>(1 + rng() % (vocab - 1));
  return p;
}

engine::ModelShape TinyShape() {
  engine::ModelShape s;
  const bool ok = engine::ModelShapeByName("tiny", &s);
  if (!ok) std::abort();
  return s;
}

std::vector<engine::Token> Expected(const std::vector<engine::Token>& prompt, uint64_t version,
                                    uint32_t n) {
  static const engine::ModelShape shape = TinyShape();
  return engine::Reference(prompt, version, n, shape);
}

json PrefillBody(const std::vector<engine::Token>& prompt, const std::string& transfer_id,
                 uint32_t consumer_tp, const std::string& request_id) {
  json b = {{"prompt", prompt},
            {"max_tokens", 1},
            {"kv_transfer_params",
             {{"do_remote_decode", true},
              {"transfer_id", transfer_id},
              {"consumer_tp_size", consumer_tp}}}};
  if (!request_id.empty()) b["request_id"] = request_id;
  return b;
}

json DecodeBody(const std::vector<engine::Token>& prompt, uint32_t n, const json& kv_params) {
  return json{{"prompt", prompt}, {"max_tokens", n}, {"kv_transfer_params", kv_params}};
}

json PlainBody(const std::vector<engine::Token>& prompt, uint32_t n) {
  return json{{"prompt", prompt}, {"max_tokens", n}};
}

Choice ChoiceOf(const HttpReply& reply) {
  Choice c;
  if (reply.status != 200 || !reply.is_json() || !reply.body.is_object()) return c;
  const json& b = reply.body;
  if (!b.contains("choices") || !b["choices"].is_array() || b["choices"].empty()) return c;
  const json& ch = b["choices"][0];
  try {
    if (ch.contains("token_ids") && ch["token_ids"].is_array()) {
      c.tokens = ch["token_ids"].get<std::vector<engine::Token>>();
    }
    if (ch.contains("weights_versions") && ch["weights_versions"].is_array()) {
      c.versions = ch["weights_versions"].get<std::vector<uint64_t>>();
    }
    if (ch.contains("finish_reason") && ch["finish_reason"].is_string()) {
      c.finish_reason = ch["finish_reason"].get<std::string>();
    }
  } catch (const json::exception&) {
    return c;
  }
  c.ok = true;
  return c;
}

std::string Describe(const HttpReply& reply) {
  if (reply.status == 0) return "no HTTP response: " + reply.error;
  std::string body = reply.raw;
  // Leading whitespace is the server's keep-alive probe.
  body.erase(0, body.find_first_not_of(" \r\n\t"));
  if (body.size() > 600) body = body.substr(0, 600) + "...";
  char t[32];
  std::snprintf(t, sizeof t, "%.3f", reply.seconds);
  return "HTTP " + std::to_string(reply.status) + " after " + t + " s: " + body;
}

}  // namespace kvrelay::proctest
