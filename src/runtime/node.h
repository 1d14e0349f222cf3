// node.h — Node: one engine process's runtime: its transport and
// registered memory, the engine actor and one rank actor per tp rank.
//
// Why: `kvrelay serve` and the multi-process tests need the same wiring;
// the HTTP server only talks to a Node. Rank r's KV lives in its own
// registered Region (shm segment, tcp receiver memory, UCX-mapped memory);
// the engine sees all ranks through one RankedKvMemory.
//
// Lifetime: Start() builds and starts everything; Shutdown() stops
// admitting, aborts what is running so P answers every pull it can, waits
// (bounded) for the transfers to settle, then stops the actors and joins
// every thread. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/transfer_timings.h"
#include "base/mutex.h"
#include "base/result.h"
#include "engine/engine.h"
#include "engine/ranked_kv_memory.h"
#include "net/faulty_transport.h"
#include "net/transport.h"
#include "runtime/engine_actor.h"
#include "runtime/parallel_kv_memory.h"
#include "runtime/rank_actor.h"

namespace kvrelay::runtime {

struct NodeOptions {
  engine::EngineOptions engine;            // role, tp, shape, blocks, ids, step times
  // What computes (engine/compute_model.h): null, the emulated model; else
  // the caller's (a llama.cpp model), which outlives the node.
  engine::ComputeModel* model = nullptr;
  net::TransportKind transport = net::TransportKind::kShm;
  net::TransportOptions transport_options;
  std::string listen_host = "127.0.0.1";   // control channel bind address
  std::string advertise_host = "127.0.0.1";  // what D is told to connect to
  uint16_t ctrl_port = 0;                  // rank r of a P engine binds ctrl_port + r
  uint32_t num_workers = 4;                // writes (reads, in read mode) in flight per rank
  uint64_t inline_write_bytes = 1 << 20;   // shm: smaller writes run on the rank's thread
  bool local_lane = true;                  // same-host control frames on a Unix socket
  KvMode kv_mode = KvMode::kPush;          // push: P writes; read: D reads under a lease
  TransferTimings timings;                 // abort timeout, grace, lease times, heartbeat, silences
  Duration connect_timeout = Duration::Seconds(3);
  LatencySink latency;
  net::WriteFaultOptions write_faults;     // fault drills only (serve --debug-fail-writes-*)
  std::string auth_token;                  // control-channel secret; empty: none
  // Nice value (-20..0) of the control path's threads: the engine loop, the
  // rank actors and ZeroMQ's I/O threads (os/thread_priority.h). 0:
  // inherited. One the process may not set is logged and not applied.
  int control_nice = 0;
  // EEVDF slice in µs (100..100000) asked for the rank actors and ZeroMQ's
  // I/O threads, so they preempt bulk work when they wake without a larger
  // share of CPU (os/thread_priority.h). 0: the kernel's default. A
  // kernel that keeps no per-thread slice logs it and goes on.
  int control_slice_us = 0;
  // Threads the emulated model reads a request's KV with at each step
  // (runtime/parallel_kv_memory.h); 1: the engine's own thread only.
  uint32_t kv_read_threads = 1;
  // Model each step's compute as a busy accelerator: what arrives during it
  // (an abort, an operation) waits for its end, as in vLLM's engine core.
  // Off: it runs at once (EngineActor::SpendCompute).
  bool busy_steps = false;
};

class Node {
 public:
  static Result<std::unique_ptr<Node>> Start(const NodeOptions& options);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Aborts every request, waits up to `drain` for transfers to settle,
  // stops every actor. Idempotent.
  void Shutdown(Duration drain);

  EngineActor& engine() { return *engine_; }
  const std::vector<std::unique_ptr<RankActor>>& ranks() const { return ranks_; }
  net::Transport& transport() { return *transport_; }
  const NodeOptions& options() const { return options_; }
  bool transfers() const { return options_.engine.role != engine::Role::kPlain; }

  // D: every rank has handshaken with the producer ranks it pulls from.
  Status EnsureProducers(uint32_t engine, const std::string& host, uint16_t port,
                         uint32_t p_tp);

 private:
  explicit Node(const NodeOptions& options) : options_(options) {}
  const NodeOptions options_;
  void* zmq_ = nullptr;
  std::unique_ptr<net::Transport> transport_;
  std::vector<std::unique_ptr<net::Region>> regions_;
  std::unique_ptr<engine::RankedKvMemory> memory_;
  std::unique_ptr<ParallelKvMemory> parallel_memory_;  // wraps memory_; the engine's view
  std::unique_ptr<EngineActor> engine_;
  std::vector<std::unique_ptr<RankActor>> ranks_;
  Mutex shutdown_mu_;
  bool shut_down_ GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace kvrelay::runtime
