// harness.h — what the multi-process tests need to run real `kvrelay serve`
// processes on loopback and talk to them.
//
//   Proc      one child process (posix_spawn), its output in a log file;
//             SIGTERM then (bounded) SIGKILL on destruction; its log is
//             printed when the current test failed.
//   Engine    one `kvrelay serve` started with the flags the tests need,
//             up once GET /health answers; HTTP helpers returning (status,
//             parsed JSON).
//   RawHttp   a bare socket speaking just enough HTTP/1.1 to know when a
//             response began and to go away mid-response.
//   WaitFor   bounded polling for a condition (no sleeps that guess).
//
// Ports: the tests pick ports below the kernel's ephemeral range (outgoing
// connections never take them) and check they are free by binding them;
// an engine that still loses a race for its port is restarted on new ones.
//
// Thread safety: Engine's HTTP helpers may be called from many threads (each
// call uses its own connection); everything else from the test's thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model.h"

namespace kvrelay::proctest {

using nlohmann::json;
using namespace std::chrono_literals;

// Path of the kvrelay binary under test: $KVRELAY_BIN if set, else the one
// this test was built with.
const char* KvrelayBinary();

// A directory for the current test's files (created on first use; removed
// after the test if it passed).
const std::string& TestDir();

// The seed for the current test's randomness: $KVRELAY_PROC_SEED if set,
// else drawn; printed and recorded as a test property either way.
uint64_t TestSeed();

// `n` consecutive TCP ports on 127.0.0.1 that are free now (bound and
// released), below the ephemeral range. 0 if none was found.
uint16_t FreePorts(uint32_t n);
inline uint16_t FreePort() { return FreePorts(1); }

// Polls `pred` every `poll` until it is true or `timeout` passed; returns
// its last value.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds poll = 20ms);

class Proc {
 public:
  // Spawns `binary args...` with stdout and stderr appended to `log_path`.
  static std::unique_ptr<Proc> Start(const std::string& binary,
                                     const std::vector<std::string>& args,
                                     const std::string& log_path, std::string* error);
  // SIGTERM, wait up to 10 s, then SIGKILL; removes the shm segments a
  // crashed kvrelay left (/dev/shm/kvrelay-<pid>-*); prints the log if the
  // current test failed.
  ~Proc();
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  pid_t pid() const { return pid_; }
  void Kill(int sig);
  // Waits up to `timeout` for the process to end; its wait status (as from
  // waitpid), or nullopt if it still runs. Once reaped, returns the status.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  bool Running() { return !Wait(0ms).has_value(); }
  std::string ReadLog() const;
  const std::string& log_path() const { return log_path_; }
  // Prints the log to stdout (at most its last `max_bytes`).
  void PrintLog(size_t max_bytes = 64 * 1024) const;

 private:
  Proc(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  std::optional<int> status_;
};

struct HttpReply {
  int status = 0;        // 0: no HTTP response (see error)
  std::string error;     // transport error, if status is 0
  std::string raw;       // the body as received
  json body;             // parsed body; discarded() if not JSON
  double seconds = 0;    // wall time of the call
  bool is_json() const { return !body.is_discarded(); }
};

struct EngineConfig {
  std::string name = "engine";       // for the log file
  std::string role = "both";         // prefill | decode | both | plain
  uint32_t tp = 1;
  std::string transport = "shm";
  double abort_timeout_s = 30;
  std::vector<std::string> extra;    // more flags, as is
};

class Engine {
 public:
  // Starts the engine and waits (≤ 20 s) for GET /health. nullptr on
  // failure, with *error saying why (and the log's tail).
  static std::unique_ptr<Engine> Start(const EngineConfig& config, std::string* error);

  const EngineConfig& config() const { return config_; }
  uint16_t http_port() const { return http_port_; }
  uint16_t ctrl_port() const { return ctrl_port_; }
  uint32_t engine_id() const { return engine_id_; }
  uint32_t tp() const { return config_.tp; }
  Proc& proc() { return *proc_; }

  // `timeout` bounds the whole call (status 0 once it passed).
  HttpReply Post(const std::string& path, const json& body,
                 std::chrono::milliseconds timeout = 30s);
  HttpReply PostRaw(const std::string& path, const std::string& body,
                    const std::string& content_type = "application/json",
                    std::chrono::milliseconds timeout = 30s);
  HttpReply Get(const std::string& path, std::chrono::milliseconds timeout = 10s);
  // GET /debug/state's JSON (null if it did not answer 200 with JSON).
  json DebugState();
  // GET /metrics' text ("" if it did not answer 200).
  std::string Metrics();
  // True when /debug/state says idle and no blocks are in use.
  bool IdleAndEmpty();

  // kv_transfer_params a router hands to D for a transfer from this engine
  // (as P), built without asking P.
  json RemotePrefillParams(const std::string& transfer_id) const;

 private:
  Engine() = default;
  EngineConfig config_;
  uint16_t http_port_ = 0, ctrl_port_ = 0;
  uint32_t engine_id_ = 0;
  std::unique_ptr<Proc> proc_;
};

// The sum of every sample of metric `name` (any labels) whose label text
// contains `label_filter` (e.g. R"(outcome="ok")"); 0 when absent.
double MetricSum(const std::string& text, const std::string& name,
                 const std::string& label_filter = "");

// A bare HTTP/1.1 client on one socket.
class RawHttp {
 public:
  RawHttp() = default;
  ~RawHttp();
  RawHttp(const RawHttp&) = delete;
  RawHttp& operator=(const RawHttp&) = delete;

  bool Connect(uint16_t port);
  // Sends one request (Connection: close).
  bool Send(const std::string& method, const std::string& path, const std::string& body);
  // Reads until the response's headers are complete; the status code, or
  // -1 on timeout or a closed socket.
  int ReadStatus(std::chrono::milliseconds timeout);
  // Reads until the peer closes or `timeout`; what arrived after the
  // headers (chunk framing left in).
  std::string ReadRest(std::chrono::milliseconds timeout);
  // Closes the socket (the client goes away).
  void Close();

 private:
  int fd_ = -1;
  std::string buf_;
  size_t header_end_ = std::string::npos;
};

// --- the P/D hand-off ---------------------------------------------------------

// A fresh 128-bit transfer id: 32 lowercase hex digits, never all zero.
std::string NewTransferId(std::mt19937_64& rng);

// `n` token ids in [1, vocab).
std::vector<engine::Token> RandomPrompt(std::mt19937_64& rng, size_t n, uint32_t vocab = 32000);

engine::ModelShape TinyShape();

// The expected output for `prompt` (tiny shape).
std::vector<engine::Token> Expected(const std::vector<engine::Token>& prompt, uint64_t version,
                                    uint32_t n);

// The P leg's body: one token, then hand the KV to a D with `consumer_tp`.
json PrefillBody(const std::vector<engine::Token>& prompt, const std::string& transfer_id,
                 uint32_t consumer_tp, const std::string& request_id = "");
// The D leg's body: `n` tokens, KV from where `kv_params` say.
json DecodeBody(const std::vector<engine::Token>& prompt, uint32_t n, const json& kv_params);
// A request with no transfer.
json PlainBody(const std::vector<engine::Token>& prompt, uint32_t n);

// choices[0] of a completion, read leniently (empty on a missing field).
// "http://127.0.0.1:<port>".
std::string UrlOf(uint16_t port);

// POST `body` on 127.0.0.1:port, bounded in total by `timeout` (a stream
// may keep writing, so a bound on silence alone is not enough).
HttpReply PostOn(uint16_t port, const std::string& path, const std::string& body,
                 const std::string& content_type = "application/json",
                 std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

// GET on 127.0.0.1:port.
HttpReply GetOn(uint16_t port, const std::string& path,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

// A `kvrelay router` process in front of engines.
class Router {
 public:
  // Starts `kvrelay router` on a free port (three tries) and, if `wait_up`,
  // waits (≤ 30 s) for /health 200. nullptr with *error on failure.
  static std::unique_ptr<Router> Start(const std::vector<std::string>& prefill,
                                       const std::vector<std::string>& decode,
                                       const std::vector<std::string>& extra, std::string* error,
                                       bool wait_up = true);
  uint16_t port() const { return port_; }
  Proc& proc() { return *proc_; }
  std::string Metrics();
  // kvrelay_router_requests_total{outcome}.
  double Outcome(const std::string& outcome);

 private:
  Router() = default;
  uint16_t port_ = 0;
  std::unique_ptr<Proc> proc_;
};

struct Choice {
  bool ok = false;                    // status 200 and the fields were there
  std::vector<engine::Token> tokens;
  std::vector<uint64_t> versions;
  std::string finish_reason;
};
Choice ChoiceOf(const HttpReply& reply);

// A short description of a reply for failure messages.
std::string Describe(const HttpReply& reply);

}  // namespace kvrelay::proctest
