#include "runtime/node.h"

#include <zmq.h>

#include <thread>

#include "net/write_plan.h"
#include "os/clock.h"
#include "os/log.h"
#include "os/thread_priority.h"

namespace kvrelay::runtime {

namespace {
ConnectorRole RoleOf(engine::Role r) {
  switch (r) {
    case engine::Role::kProducer: return ConnectorRole::kProducer;
    case engine::Role::kConsumer: return ConnectorRole::kConsumer;
    case engine::Role::kBoth:
    case engine::Role::kPlain: return ConnectorRole::kBoth;
  }
  return ConnectorRole::kBoth;
}
}  // namespace

Result<std::unique_ptr<Node>> Node::Start(const NodeOptions& options) {
  const engine::EngineOptions& eo = options.engine;
  if (eo.tp == 0 || eo.tp > engine::kHeadGroups || engine::kHeadGroups % eo.tp != 0) {
    return InvalidArgumentError("--tp must be 1, 2 or 4");
  }
  if (eo.engine_id >= (1u << 28)) return InvalidArgumentError("--engine-id must be < 2^28");
  if (options.kv_read_threads < 1 || options.kv_read_threads > 64) {
    return InvalidArgumentError("--kv-read-threads must be within 1..64");
  }
  if (options.control_nice < -20 || options.control_nice > 0) {
    return InvalidArgumentError("--control-nice must be within -20..0");
  }
  if (options.control_slice_us != 0 &&
      (options.control_slice_us < 100 || options.control_slice_us > 100000)) {
    return InvalidArgumentError("--control-slice-us must be 0 or within 100..100000");
  }
  std::unique_ptr<Node> node(new Node(options));
  node->zmq_ = zmq_ctx_new();
  int nice = options.control_nice;
  if (nice != 0 && !CanSetNice(nice)) {
    Log("node", "--control-nice %d not permitted (needs CAP_SYS_NICE or RLIMIT_NICE); "
        "control threads keep their priority", nice);
    nice = 0;
  }
  int slice_us = options.control_slice_us;
  if (slice_us != 0) {
    Status probe;
    std::thread([&] { probe = SetThisThreadSliceUs(slice_us); }).join();
    if (!probe.ok()) {
      Log("node", "--control-slice-us %d not applied: %s", slice_us, probe.ToString().c_str());
      slice_us = 0;
    }
  }
  if (nice != 0 || slice_us != 0) {
    // ZeroMQ starts its I/O and reaper threads with a context's first
    // socket, and a new thread inherits its creator's nice value and slice:
    // open and close one socket from a thread set up for it. (ZeroMQ's own
    // ZMQ_THREAD_PRIORITY was measured to give them nice -20 for a
    // priority of 10 with libzmq 4.3.4, so it is not used.)
    std::thread([&] {
      if (nice != 0) (void)SetThisThreadNice(nice);  // CanSetNice said it may
      if (slice_us != 0) (void)SetThisThreadSliceUs(slice_us);
      if (void* s = zmq_socket(node->zmq_, ZMQ_DEALER); s != nullptr) zmq_close(s);
    }).join();
  }
  Result<std::unique_ptr<net::Transport>> t =
      net::MakeTransport(options.transport, options.transport_options);
  if (!t.ok()) return t.status();
  node->transport_ = std::move(*t);
  if (options.write_faults.enabled()) {
    node->transport_ = net::MakeFaultyTransport(std::move(node->transport_), options.write_faults);
  }
  std::vector<std::span<uint8_t>> spans;
  const net::RegionLayout layout = net::LayoutFor(eo.shape, eo.tp, eo.num_blocks);
  for (uint32_t r = 0; r < eo.tp; ++r) {
    Result<std::unique_ptr<net::Region>> region = node->transport_->CreateRegion(
        "e" + std::to_string(eo.engine_id) + "-i" + std::to_string(eo.incarnation) + "-r" +
            std::to_string(r),
        layout);
    if (!region.ok()) return region.status();
    spans.push_back((*region)->bytes());
    node->regions_.push_back(std::move(*region));
  }
  node->memory_ = std::make_unique<engine::RankedKvMemory>(eo.shape, eo.num_blocks, spans);
  node->parallel_memory_ =
      std::make_unique<ParallelKvMemory>(node->memory_.get(), options.kv_read_threads);
  node->engine_ = std::make_unique<EngineActor>(eo, node->parallel_memory_.get(), options.model);
  node->engine_->SetBusySteps(options.busy_steps);
  if (node->transfers()) {
    for (uint32_t r = 0; r < eo.tp; ++r) {
      RankActorOptions ro;
      ro.engine_id = eo.engine_id;
      ro.incarnation = eo.incarnation;
      ro.rank = r;
      ro.tp = eo.tp;
      ro.role = RoleOf(eo.role);
      ro.shape = eo.shape;
      ro.num_blocks = eo.num_blocks;
      ro.listen_host = options.listen_host;
      ro.ctrl_port = options.ctrl_port;
      ro.timings = options.timings;
      ro.num_workers = options.num_workers;
      ro.inline_write_bytes = options.inline_write_bytes;
      ro.local_lane = options.local_lane;
      ro.mode = options.kv_mode;
      ro.auth_token = options.auth_token;
      ro.thread_nice = nice;
      ro.thread_slice_us = slice_us;
      node->ranks_.push_back(std::make_unique<RankActor>(ro, node->zmq_, node->transport_.get(),
                                                         node->regions_[r].get(),
                                                         node->engine_.get(), options.latency));
    }
    Node* raw = node.get();
    node->engine_->SetMetadataSink([raw](const ConnectorMetadata& meta) {
      for (auto& rank : raw->ranks_) rank->PostMetadata(meta);
    });
    for (auto& rank : node->ranks_) {
      Status s = rank->Start();
      if (!s.ok()) return s;
    }
  }
  node->engine_->SetThreadNice(nice);
  node->engine_->Start();
  if (nice != 0) Log("node", "control threads (engine loop, ranks, ZeroMQ I/O) at nice %d", nice);
  if (slice_us != 0) Log("node", "ranks and ZeroMQ I/O threads ask for a %d µs slice", slice_us);
  return node;
}

Node::~Node() {
  Shutdown(Duration::Zero());
  ranks_.clear();
  engine_.reset();
  parallel_memory_.reset();
  memory_.reset();
  regions_.clear();
  transport_.reset();
  if (zmq_ != nullptr) zmq_ctx_term(zmq_);
  zmq_ = nullptr;
}

void Node::Shutdown(Duration drain) {
  {
    MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (engine_ && drain > Duration::Zero()) {
    // Stop admitting and end what runs: P answers the pulls it holds
    // (kAborted) instead of leaving D to time out.
    // One bound for the whole drain: the abort call and the wait for idle.
    const Instant until = MonoNow() + drain;
    const auto ms = std::chrono::milliseconds(drain.ns() / 1'000'000);
    engine_->RunOp([](engine::Engine& e) { return e.AbortRequests({}, true); }, ms);
    while (MonoNow() < until) {
      auto idle = engine_->Query([](const engine::Engine& e) { return e.Idle(); });
      if (!idle || *idle) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Threads stop here; the objects live on until ~Node, so callers that
  // still hold the Node (HTTP handlers) get errors, not freed memory.
  if (engine_) engine_->Stop();
  for (auto& r : ranks_) r->Stop();
}

Status Node::EnsureProducers(uint32_t engine, const std::string& host, uint16_t port,
                             uint32_t p_tp) {
  if (!transfers()) return FailedPreconditionError("a plain engine does not transfer KV");
  for (auto& r : ranks_) {
    Status s = r->EnsureProducers(engine, host, port, p_tp, options_.connect_timeout);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace kvrelay::runtime
