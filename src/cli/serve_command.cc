// `kvrelay serve`: one engine process (prefill, decode, both or plain)
// behind the HTTP API, with its control channel and data plane.
//
// SIGINT/SIGTERM: stop admitting, abort what runs so every pull is
// answered, wait (bounded) for transfers to settle, exit 0.
#include <signal.h>

#include <array>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/http_flags.h"
#include "cli/llama_serving.h"
#include "os/clock.h"
#include "os/os_random.h"
#include "runtime/auth_token.h"
#include "runtime/free_port.h"
#include "server/engine_server.h"

namespace kvrelay::cli {
namespace {

uint32_t RandomEngineId() {
  std::array<uint8_t, 16> r = kvrelay::NonceFromOs();
  uint32_t id = (uint32_t{r[0]} | uint32_t{r[1]} << 8 | uint32_t{r[2]} << 16 |
                 uint32_t{r[3]} << 24) & ((1u << 28) - 1);
  return id == 0 ? 1 : id;
}

struct ServeCliOptions {
  std::string role = "both";
  uint32_t tp = 1;
  std::string shape = "tiny";
  std::string transport = "shm";
  std::string host = "127.0.0.1";
  uint16_t port = 8100;
  int ctrl_port = -1;
  std::string advertise_host;
  uint32_t engine_id = 0;
  uint32_t num_blocks = 0;
  uint32_t max_batch_tokens = 0;
  uint32_t max_running = 64;
  uint32_t max_waiting = 4096;
  uint32_t num_workers = 4;
  uint32_t inline_write_kib = 1024;
  int control_nice = 0;
  int control_slice_us = 100;
  uint32_t kv_read_threads = 1;
  bool busy_steps = false;
  bool no_fast_abort = false;
  bool no_local_lane = false;
  uint32_t tcp_streams = 4;
  std::string ucx_tls;
  double abort_timeout_s = 480;
  double giveup_grace_s = 60;
  std::string kv_mode = "push";
  double lease_s = 30;
  double lease_extension_s = 20;
  double lease_heartbeat_s = 5;
  double read_margin_s = 5;
  double step_base_us = 500;
  double step_per_token_us = 20;
  double peer_dead_after_s = 10;
  std::string load_failure_policy = "recompute";
  double max_queue_wait_s = 300;
  HttpFlags http;
  uint32_t max_prompt_tokens = 0;
  uint32_t max_requests_per_client = 8192;
  bool no_prefix_caching = false;
  bool compute_first_token = false;
  bool stream_chunks = false;
  net::WriteFaultOptions write_faults;  // fault drills (`kvrelay chaos`)
  std::string auth_token_file;
  LlamaServeFlags llama;
};

int RunServe(const ServeCliOptions& o) {
  RaiseOpenFileLimit();   // every HTTP connection is a file
  server::ServerOptions so;
  runtime::NodeOptions& no = so.node;
  engine::EngineOptions& eo = no.engine;
  if (o.role == "prefill") {
    eo.role = engine::Role::kProducer;
  } else if (o.role == "decode") {
    eo.role = engine::Role::kConsumer;
  } else if (o.role == "both") {
    eo.role = engine::Role::kBoth;
  } else if (o.role == "plain") {
    eo.role = engine::Role::kPlain;
  } else {
    std::fprintf(stderr, "kvrelay serve: --role must be prefill, decode, both or plain\n");
    return 2;
  }
  if (!engine::ModelShapeByName(o.shape, &eo.shape)) {
    std::fprintf(stderr, "kvrelay serve: unknown --model-shape '%s' (tiny, small or 8b)\n",
                 o.shape.c_str());
    return 2;
  }
  if (!net::ParseTransport(o.transport, &no.transport)) {
    std::fprintf(stderr, "kvrelay serve: --transport must be shm, tcp or ucx\n");
    return 2;
  }
  if (o.load_failure_policy == "recompute") {
    eo.load_failure_policy = engine::LoadFailurePolicy::kRecompute;
  } else if (o.load_failure_policy == "fail") {
    eo.load_failure_policy = engine::LoadFailurePolicy::kFail;
  } else {
    std::fprintf(stderr, "kvrelay serve: --load-failure-policy must be recompute or fail\n");
    return 2;
  }
  if (!(o.max_queue_wait_s >= 0)) {
    std::fprintf(stderr, "kvrelay serve: --max-queue-wait-s must be >= 0 (0: no bound)\n");
    return 2;
  }
  eo.max_queue_wait = Duration::Microseconds(static_cast<int64_t>(o.max_queue_wait_s * 1e6));
  eo.tp = o.tp;
  // Not from the port: --port 0 (or two hosts on one port) must not give two
  // engines one id. Random below 2^28 (a consumer_engine_id's range).
  eo.engine_id = o.engine_id != 0 ? o.engine_id : RandomEngineId();
  if (eo.engine_id >= (1u << 28)) {
    std::fprintf(stderr, "kvrelay serve: --engine-id must be below 2^28 (268435456)\n");
    return 2;
  }
  eo.incarnation = kvrelay::NewIncarnation();
  const bool llama = o.llama.engine == "llama";
  if (llama && o.shape != ServeCliOptions{}.shape) {
    std::fprintf(stderr, "kvrelay serve: --model-shape is the emulated engine's; a llama "
                         "engine's shape comes from its --model file\n");
    return 2;
  }
  // llama.cpp: 256 blocks of 16 tokens = a 4,096-token KV context; a step
  // of one 512-token prefill chunk (llama.cpp's usual batch) and a decode
  // token for every running request.
  eo.num_blocks = o.num_blocks != 0 ? o.num_blocks
                  : llama           ? 256
                                    : (eo.shape.name == "tiny" ? 4096 : 512);
  eo.max_batch_tokens = o.max_batch_tokens != 0 ? o.max_batch_tokens
                        : llama                 ? 512 + o.max_running
                                                : (eo.shape.name == "tiny" ? 2048 : 8192);
  eo.max_running = o.max_running;
  eo.max_waiting = o.max_waiting;
  eo.prefix_caching = !o.no_prefix_caching;
  eo.producer_first_token = !o.compute_first_token;
  eo.stream_chunks = o.stream_chunks;
  eo.step_base = Duration::Nanoseconds(static_cast<int64_t>(o.step_base_us * 1e3));
  eo.step_per_token = Duration::Nanoseconds(static_cast<int64_t>(o.step_per_token_us * 1e3));
  if (!o.auth_token_file.empty()) {
    Result<std::string> token = runtime::LoadAuthToken(o.auth_token_file);
    if (!token.ok()) {
      std::fprintf(stderr, "kvrelay serve: %s\n", token.status().message().c_str());
      return 2;
    }
    no.auth_token = *token;
  }
  no.listen_host = o.host;
  no.advertise_host = o.advertise_host.empty() ? o.host : o.advertise_host;
  if (o.ctrl_port >= 0 || o.port != 0) {
    // Rank r listens on base + r: every one of them must be a port.
    const int64_t base = o.ctrl_port >= 0 ? o.ctrl_port : int64_t{o.port} + 1000;
    if (base + o.tp - 1 > 65535) {
      std::fprintf(stderr, "kvrelay serve: control ports %lld..%lld (%s + rank, tp %u) go past "
                   "65535; choose a lower --ctrl-port%s\n", static_cast<long long>(base),
                   static_cast<long long>(base + o.tp - 1),
                   o.ctrl_port >= 0 ? "--ctrl-port" : "--port + 1000", o.tp,
                   o.ctrl_port >= 0 ? "" : " or --port");
      return 2;
    }
    no.ctrl_port = static_cast<uint16_t>(base);
  } else {
    // --port 0: tp free consecutive ports (the ranks listen on base + rank).
    no.ctrl_port = runtime::FreeLoopbackPorts(o.tp);
    if (no.ctrl_port == 0) {
      std::fprintf(stderr, "kvrelay serve: no %u free consecutive ports for --ctrl-port\n", o.tp);
      return 1;
    }
  }
  no.num_workers = o.num_workers;
  no.inline_write_bytes = uint64_t{o.inline_write_kib} * 1024;
  no.local_lane = !o.no_local_lane;
  no.control_nice = o.control_nice;
  no.control_slice_us = o.control_slice_us;
  no.kv_read_threads = o.kv_read_threads;
  no.busy_steps = o.busy_steps;
  so.fast_abort = !o.no_fast_abort;
  no.transport_options.listen_host = o.host;
  no.transport_options.tcp_streams = o.tcp_streams;
  no.transport_options.ucx_tls = o.ucx_tls;
  no.timings.abort_timeout = Duration::Nanoseconds(static_cast<int64_t>(o.abort_timeout_s * 1e9));
  no.timings.giveup_grace = Duration::Nanoseconds(static_cast<int64_t>(o.giveup_grace_s * 1e9));
  no.timings.peer_dead_after = Duration::Nanoseconds(static_cast<int64_t>(o.peer_dead_after_s * 1e9));
  no.write_faults = o.write_faults;
  if (!ParseKvMode(o.kv_mode, &no.kv_mode)) {
    std::fprintf(stderr, "kvrelay serve: --kv-mode must be push or read, not '%s'\n",
                 o.kv_mode.c_str());
    return 2;
  }
  if (o.stream_chunks && no.kv_mode != KvMode::kPush) {
    std::fprintf(stderr, "kvrelay serve: --stream-chunks is a push-mode hand-off (P writes "
                         "each finished chunk into D's blocks); read mode hands off whole\n");
    return 2;
  }
  if (o.stream_chunks && llama) {
    std::fprintf(stderr, "kvrelay serve: --stream-chunks needs a model whose KV is in the "
                         "blocks as it computes; a llama engine copies a sequence's KV out "
                         "when its prefill ends, so it hands off whole\n");
    return 2;
  }
  // Read mode's one timing rule: D reads only with more than read_margin
  // of lease left, and renews every heartbeat; an extension shorter than
  // heartbeat + margin would let every lease lapse between heartbeats.
  if (!(o.lease_s > 0 && o.lease_heartbeat_s > 0 && o.read_margin_s >= 0 &&
        o.lease_extension_s > o.lease_heartbeat_s + o.read_margin_s &&
        o.lease_s > o.read_margin_s)) {
    std::fprintf(stderr,
                 "kvrelay serve: read-mode timings need --lease-s > --read-margin-s and "
                 "--lease-extension-s > --lease-heartbeat-s + --read-margin-s (got %g, %g, "
                 "%g, %g)\n",
                 o.lease_s, o.lease_extension_s, o.lease_heartbeat_s, o.read_margin_s);
    return 2;
  }
  auto seconds = [](double s) { return Duration::Nanoseconds(static_cast<int64_t>(s * 1e9)); };
  no.timings.lease = seconds(o.lease_s);
  no.timings.lease_extension = seconds(o.lease_extension_s);
  no.timings.lease_heartbeat = seconds(o.lease_heartbeat_s);
  no.timings.read_margin = seconds(o.read_margin_s);
  HttpOptionsFrom(o.http, o.host, o.port, &so.http);
  so.max_prompt_tokens = o.max_prompt_tokens;
  so.max_requests_per_client = o.max_requests_per_client;
  std::unique_ptr<llama::LlamaModel> llama_model;  // outlives the server
  if (Status s = SetUpLlamaEngine(o.llama, &so, &llama_model); !s.ok()) {
    std::fprintf(stderr, "kvrelay serve: %s\n", s.message().c_str());
    return 2;
  }

  // Signals are taken by a thread that waits for them, not a handler.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Result<std::unique_ptr<server::EngineServer>> server = server::EngineServer::Start(so);
  if (!server.ok()) {
    std::fprintf(stderr, "kvrelay serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr,
               "kvrelay serve: %s engine %u (incarnation %u), tp %u, %s, %u blocks, "
               "transport %s, http %s:%u, control %s:%u+rank\n",
               o.role.c_str(), eo.engine_id, eo.incarnation, eo.tp,
               llama_model ? llama_model->Describe().c_str()
                           : ("shape " + eo.shape.name).c_str(),
               eo.num_blocks, net::TransportName(no.transport), o.host.c_str(),
               (*server)->port(), no.advertise_host.c_str(), no.ctrl_port);
  std::fflush(stderr);
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "kvrelay serve: signal %d: draining and stopping\n", sig);
  (*server)->Stop();
  std::fprintf(stderr, "kvrelay serve: stopped\n");
  return 0;
}

}  // namespace

void RegisterServe(CLI::App& app) {
  auto o = std::make_shared<ServeCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Run one engine: the OpenAI-compatible HTTP API, admin calls, /metrics, and the KV "
      "control channel and data plane");
  cmd->add_option("--role", o->role, "what the engine serves")
      ->check(OneOf({"prefill", "decode", "both", "plain"}))
      ->capture_default_str();
  cmd->add_option("--tp", o->tp, "tensor-parallel ranks")->check(TpSizes())->capture_default_str();
  cmd->add_option("--model-shape", o->shape, "model shape of the KV (--engine emulated)")
      ->check(ModelShapeNames())
      ->capture_default_str();
  AddLlamaServeFlags(cmd, &o->llama);
  cmd->add_option("--transport", o->transport, "data plane")
      ->check(TransportNames())
      ->capture_default_str();
  cmd->add_option("--host", o->host, "address to listen on (HTTP, control, tcp data)")
      ->capture_default_str();
  cmd->add_option("--port", o->port, "HTTP port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--ctrl-port", o->ctrl_port,
                  "control channel base port; rank r listens on it + r (default: --port + 1000; "
                  "with --port 0, free ports)")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--advertise-host", o->advertise_host,
                  "host D engines should connect to (default: --host)");
  cmd->add_option("--engine-id", o->engine_id,
                  "this engine's id, unique in the cluster, below 2^28 (default: random)");
  cmd->add_option("--num-blocks", o->num_blocks,
                  "KV blocks in the pool (default: 4096 for tiny, 512 otherwise)")
      ->check(Positive());
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens, "token budget per step")
      ->check(Positive());
  cmd->add_option("--max-running", o->max_running, "requests running at once")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--max-waiting", o->max_waiting, "bound on the waiting queue")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--num-workers", o->num_workers, "data-plane writes in flight per rank")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--inline-write-kib", o->inline_write_kib,
                  "a write (read mode: a read) of at most this many KiB runs on the rank's "
                  "own thread, saving two thread hand-offs: shm copies it there; tcp sends it "
                  "(or the read request) without waiting and polls the rest there, when a "
                  "stream to the peer is idle (0: every write and read goes to a worker)")
      ->check(CLI::Range(0u, 1u << 20))
      ->capture_default_str();
  cmd->add_option("--control-nice", o->control_nice,
                  "nice value of the control path's threads (engine loop, ranks, ZeroMQ I/O), "
                  "so aborts and answers preempt bulk work on a saturated machine, at the cost "
                  "of TTFT there (docs/operations.md); below 0 needs CAP_SYS_NICE or "
                  "RLIMIT_NICE, else it is logged and not applied (0: inherited)")
      ->check(CLI::Range(-20, 0))
      ->capture_default_str();
  cmd->add_option("--control-slice-us", o->control_slice_us,
                  "EEVDF time slice (µs, 100..100000) asked for the control path's threads "
                  "(HTTP, ranks, ZeroMQ I/O): on a saturated machine an abort or an answer "
                  "preempts bulk work when its thread wakes, with no more CPU share "
                  "(docs/operations.md); needs Linux 6.12 or later, else it is logged and not "
                  "applied (0: the kernel's default slice)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--kv-read-threads", o->kv_read_threads,
                  "threads the emulated model reads a request's KV with at each step, as a "
                  "GPU's attention reads it in parallel (reads of 16 blocks a thread or more)")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  cmd->add_flag("--busy-steps", o->busy_steps,
               "model each step's compute as a busy GPU: aborts and calls that arrive "
               "during it wait for its end, as in vLLM (default: they run at once)");
  cmd->add_flag("--no-fast-abort", o->no_fast_abort,
                "P: end an aborted prefill leg's send through the engine loop only (by "
                "default an abort of an open leg, from abort_requests or a client gone, "
                "also goes straight to the ranks, so a waiting D is answered at once)");
  cmd->add_flag("--no-local-lane", o->no_local_lane,
                "keep control frames between this host's P and D ranks on ZeroMQ (by "
                "default they take a Unix socket the rank threads poll themselves, with any "
                "--transport, when P's host is local: two thread wake-ups a pull instead of "
                "six; docs/wire.md)");
  cmd->add_option("--tcp-streams", o->tcp_streams, "tcp transport: connections per peer rank")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--ucx-tls", o->ucx_tls, "ucx transport: UCX_TLS (default: UCX's choice)");
  cmd->add_option("--abort-timeout-s", o->abort_timeout_s,
                  "how long a finished prefill waits to be pulled, and a pull for its prefill")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--giveup-grace-s", o->giveup_grace_s,
                  "D gives up a load this long after its pull's deadline")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--kv-mode", o->kv_mode,
                  "push: P writes the KV into D's blocks (Mooncake-like). read: D reads P's "
                  "blocks one-sided under a lease D renews by heartbeat (NIXL-like); every "
                  "engine of a cluster and its router must agree")
      ->check(KvModeNames())
      ->capture_default_str();
  cmd->add_flag("--stream-chunks", o->stream_chunks,
               "prefill, push mode: hand each finished prompt chunk to D while the prefill "
               "goes on (a pull already waiting is written chunk by chunk; D still decodes "
               "only on the whole prompt). Chunks are --max-batch-tokens long");
  cmd->add_option("--lease-s", o->lease_s,
                  "read mode, P: how long a finished prefill's KV is held for D's reads "
                  "before any heartbeat")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--lease-extension-s", o->lease_extension_s,
                  "read mode, P: each heartbeat keeps the lease at least this long from then")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--lease-heartbeat-s", o->lease_heartbeat_s,
                  "read mode, D: heartbeat interval for a load in flight")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--read-margin-s", o->read_margin_s,
                  "read mode, D: start no read with less lease left than this (at least the "
                  "longest a read can take)")
      ->capture_default_str();
  cmd->add_option("--peer-dead-after-s", o->peer_dead_after_s,
                  "D fails loads from a P silent this long")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--step-base-us", o->step_base_us, "modelled step time: fixed part")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--step-per-token-us", o->step_per_token_us,
                  "modelled step time: per token computed")
      ->check(NonNegative())
      ->capture_default_str();
  cmd->add_option("--load-failure-policy", o->load_failure_policy,
                  "a failed KV load: recompute it, or fail its request")
      ->check(LoadPolicyNames())
      ->capture_default_str();
  cmd->add_option("--max-queue-wait-s", o->max_queue_wait_s,
                  "a request with no token this long after it arrived (queued behind a pause "
                  "or a sleep, or waiting for KV that does not come) ends with a clean error; "
                  "0: wait for resume / wake_up however long")
      ->capture_default_str();
  AddHttpFlags(cmd, &o->http);
  cmd->add_option("--max-prompt-tokens", o->max_prompt_tokens,
                  "longest prompt in tokens; more get 400 (0: the model's context - 1)")
      ->capture_default_str();
  cmd->add_option("--max-requests-per-client", o->max_requests_per_client,
                  "completions at once per remote address; more get 429 (0: no limit)")
      ->capture_default_str();
  cmd->add_flag("--no-prefix-caching", o->no_prefix_caching, "disable the prefix cache");
  cmd->add_flag("--compute-first-token", o->compute_first_token,
                "D: compute a loaded request's first token from the loaded KV instead of "
                "emitting the one P handed over with it (the default saves D a step on the "
                "loaded KV; the second token reads it either way)");
  cmd->add_option("--auth-token-file", o->auth_token_file,
                  "shared secret (a file only its owner may read, chmod 600): control-channel "
                  "peers and admin calls (/pause, ..., /debug/*) must prove it (HMAC over a "
                  "nonce); default: no authentication");
  // Fault drills only (`kvrelay chaos`): this engine's data-plane writes
  // fail half-way (net/faulty_transport.h).
  const char* drills = "Fault drills (kvrelay chaos; never in production)";
  cmd->add_option("--debug-fail-writes-probability", o->write_faults.probability,
                  "each KV write fails with this probability after writing half its bytes "
                  "(0: off)")
      ->group(drills)
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--debug-fail-writes-after-bytes", o->write_faults.after_bytes,
                  "failures start once this many KV bytes were written")
      ->group(drills)
      ->capture_default_str();
  cmd->add_option("--debug-fail-writes-seed", o->write_faults.seed,
                  "seed of the failure draws, writes' and reads' (a run replays)")
      ->group(drills)
      ->capture_default_str();
  cmd->add_option("--debug-fail-reads-probability", o->write_faults.read_probability,
                  "read mode: each KV read fails with this probability after reading half "
                  "its bytes (0: off)")
      ->group(drills)
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--debug-fail-reads-after-bytes", o->write_faults.read_after_bytes,
                  "read failures start once this many KV bytes were read")
      ->group(drills)
      ->capture_default_str();
  cmd->callback([o] { SetExitCode(RunServe(*o)); });
}

}  // namespace kvrelay::cli
