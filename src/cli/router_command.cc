// `kvrelay router`: the P/D proxy. Reads every engine's GET /kv_info
// (retrying, bounded, so it may start before the engines), then serves
// OpenAI's /v1/completions and /v1/chat/completions by running a P leg and a
// D leg at once for each request (src/router/router_server.h).
//
// SIGINT/SIGTERM: stop accepting, cancel the legs in flight, exit 0 (also
// while still waiting for the engines).
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <ctime>

#include "cli/commands.h"
#include "cli/http_flags.h"
#include "os/clock.h"
#include "router/engine_pool.h"
#include "router/router_server.h"
#include "runtime/auth_token.h"

namespace kvrelay::cli {
namespace {

struct RouterCliOptions {
  std::vector<std::string> prefill;
  std::vector<std::string> decode;
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  uint32_t max_inflight = 4096;
  uint32_t max_requests_per_client = 1024;
  HttpFlags http;
  uint32_t leg_threads = 2;
  double discovery_timeout_s = 30;
  double connect_timeout_s = 3;
  double upstream_idle_timeout_s = 3600;
  double max_queue_wait_s = 300;
  double recheck_interval_ms = 1000;
  double drain_timeout_s = 5;
  std::string auth_token_file;
  std::string kv_mode = "push";
};

Duration Seconds(double s) { return Duration::Nanoseconds(static_cast<int64_t>(s * 1e9)); }
Duration Millis(double ms) { return Duration::Nanoseconds(static_cast<int64_t>(ms * 1e6)); }

// Waits up to `d` for SIGINT/SIGTERM (blocked in `set`); true if one came.
bool SignalWithin(const sigset_t& set, Duration d) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(d.ns() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(d.ns() % 1'000'000'000);
  while (true) {
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return true;
    if (errno == EINTR) continue;
    return false;   // EAGAIN: the time passed
  }
}

int RunRouter(const RouterCliOptions& o) {
  RaiseOpenFileLimit();   // every HTTP connection is a file
  if (o.max_inflight == 0 || o.leg_threads == 0 ||
      o.discovery_timeout_s < 0 || o.connect_timeout_s <= 0 || o.upstream_idle_timeout_s <= 0 ||
      o.recheck_interval_ms <= 0 || o.drain_timeout_s < 0) {
    std::fprintf(stderr,
                 "kvrelay router: --max-inflight, --max-body-bytes, --leg-threads and the "
                 "timeouts must be positive\n");
    return 2;
  }
  if (!o.auth_token_file.empty()) {
    // The router has no admin calls and reads only the engines' open
    // endpoints (/kv_info, /v1/models, /health); the file is checked so one
    // cluster configuration can hand every process the same flag, and a
    // bad file fails here as it would on an engine (docs/operations.md).
    Result<std::string> token = runtime::LoadAuthToken(o.auth_token_file);
    if (!token.ok()) {
      std::fprintf(stderr, "kvrelay router: %s\n", token.status().message().c_str());
      return 2;
    }
  }
  const Duration fetch_timeout = Seconds(o.connect_timeout_s);
  if (o.kv_mode != "push" && o.kv_mode != "read") {
    std::fprintf(stderr, "kvrelay router: --kv-mode must be push or read, not '%s'\n",
                 o.kv_mode.c_str());
    return 2;
  }
  // An engine of the other kv mode is refused at discovery with a clear
  // reason (the engine pool also keeps every engine in one mode).
  const std::string kv_mode = o.kv_mode;
  Result<std::shared_ptr<router::EnginePool>> pool = router::EnginePool::Create(
      o.prefill, o.decode,
      [fetch_timeout, kv_mode](const std::string& url) -> Result<router::EngineInfo> {
        Result<router::EngineInfo> info = router::FetchEngineInfo(url, fetch_timeout);
        if (info.ok() && info->kv_mode != kv_mode) {
          return FailedPreconditionError("engine " + url + " runs --kv-mode " + info->kv_mode +
                                         " but this router runs --kv-mode " + kv_mode);
        }
        return info;
      });
  if (!pool.ok()) {
    std::fprintf(stderr, "kvrelay router: %s\n", pool.status().message().c_str());
    return 2;
  }

  // Signals are taken by waiting for them, not by a handler.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const Instant give_up = kvrelay::MonoNow() + Seconds(o.discovery_timeout_s);
  while (true) {
    Status s = (*pool)->DiscoverOnce();
    if (s.ok()) break;
    if (s.code() != StatusCode::kUnavailable) {
      std::fprintf(stderr, "kvrelay router: %s\n", s.message().c_str());
      return 1;
    }
    if (kvrelay::MonoNow() >= give_up) {
      std::fprintf(stderr, "kvrelay router: engines did not answer GET /kv_info within %.0f s: %s\n",
                   o.discovery_timeout_s, s.message().c_str());
      return 1;
    }
    if (SignalWithin(set, Duration::Milliseconds(200))) {
      std::fprintf(stderr, "kvrelay router: signal while waiting for the engines: stopped\n");
      return 0;
    }
  }

  router::RouterOptions ro;
  ro.max_inflight = o.max_inflight;
  ro.max_requests_per_client = o.max_requests_per_client;
  ro.leg_threads = o.leg_threads;
  HttpOptionsFrom(o.http, o.host, o.port, &ro.http);
  ro.relay.upstream.connect_timeout = Seconds(o.connect_timeout_s);
  ro.relay.upstream.idle_timeout = Seconds(o.upstream_idle_timeout_s);
  ro.relay.max_queue_wait = Seconds(o.max_queue_wait_s);
  ro.recheck_interval = Millis(o.recheck_interval_ms);
  ro.drain_timeout = Seconds(o.drain_timeout_s);
  Result<std::unique_ptr<router::RouterServer>> server = router::RouterServer::Start(ro, *pool);
  if (!server.ok()) {
    std::fprintf(stderr, "kvrelay router: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "kvrelay router: %zu prefill, %zu decode URLs, http %s:%u\n",
               o.prefill.size(), o.decode.size(), o.host.c_str(), (*server)->port());
  std::fflush(stderr);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "kvrelay router: signal %d: cancelling requests and stopping\n", sig);
  (*server)->Stop();
  std::fprintf(stderr, "kvrelay router: stopped\n");
  return 0;
}

}  // namespace

void RegisterRouter(CLI::App& app) {
  auto o = std::make_shared<RouterCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "router",
      "Run the P/D proxy: clients send OpenAI /v1/completions or /v1/chat/completions; each "
      "request runs on a prefill engine and a decode engine at once, the KV handed from P to D");
  cmd->add_option("--prefill", o->prefill,
                  "prefill engine URLs (http://HOST:PORT; role prefill or both)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--decode", o->decode,
                  "decode engine URLs (http://HOST:PORT; role decode or both)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--host", o->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "HTTP port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--max-inflight", o->max_inflight,
                  "client requests served at once; more get 503")
      ->capture_default_str();
  cmd->add_option("--max-requests-per-client", o->max_requests_per_client,
                  "client requests at once per remote address; more get 429 (0: no limit)")
      ->capture_default_str();
  AddHttpFlags(cmd, &o->http);
  cmd->add_option("--leg-threads", o->leg_threads,
                  "threads running every leg's call to the engines (no thread waits for a leg)")
      ->capture_default_str();
  cmd->add_option("--discovery-timeout-s", o->discovery_timeout_s,
                  "how long to wait at start for every engine's GET /kv_info")
      ->capture_default_str();
  cmd->add_option("--connect-timeout-s", o->connect_timeout_s,
                  "connecting to an engine (and GET /kv_info) gives up after this")
      ->capture_default_str();
  cmd->add_option("--upstream-idle-timeout-s", o->upstream_idle_timeout_s,
                  "a leg whose engine sends nothing this long fails (the engines write nothing "
                  "while a request waits; --max-queue-wait-s bounds that)")
      ->capture_default_str();
  cmd->add_option("--max-queue-wait-s", o->max_queue_wait_s,
                  "a request with no token this long after it arrived (P's leg not done: P "
                  "paused or asleep; or no token streamed) fails with 503 and both legs are "
                  "cancelled; 0: no bound (the engines' own --max-queue-wait-s still applies)")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--recheck-interval-ms", o->recheck_interval_ms,
                  "how often an engine that is down is asked for /kv_info again")
      ->capture_default_str();
  cmd->add_option("--drain-timeout-s", o->drain_timeout_s,
                  "at shutdown, how long to wait for cancelled legs to end")
      ->capture_default_str();
  cmd->add_option("--kv-mode", o->kv_mode,
                  "push or read: the engines' --kv-mode; an engine of the other mode is "
                  "refused at discovery")
      ->check(KvModeNames())
      ->capture_default_str();
  cmd->add_option("--auth-token-file", o->auth_token_file,
                  "the cluster's shared secret (chmod 600); checked at start. The router has "
                  "no admin calls of its own and uses only the engines' open endpoints");
  cmd->callback([o] { SetExitCode(RunRouter(*o)); });
}

}  // namespace kvrelay::cli
