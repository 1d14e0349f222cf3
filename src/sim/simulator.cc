// simulator.cc — the simulated world: the cluster a seed draws, the event
// loop, the engines and what their actions do, and the run's result. The
// rest of the simulator is in files named for their part: sim_clients.cc,
// sim_network.cc (the control channel), sim_data_plane.cc (writes and
// reads), sim_lifecycle.cc (crashes, restarts, lifecycle calls) and
// sim_checks.cc (the invariants).
#include "sim/simulator.h"

#include <algorithm>
#include <cstdio>

#include "base/check.h"
#include "core/tp_mapping.h"

namespace kvrelay::sim {

namespace {

const char* KindName(EventKind k) {
  switch (k) {
    case EventKind::kClientArrive: return "client_arrive";
    case EventKind::kLegArrive: return "leg_arrive";
    case EventKind::kClientAbort: return "client_abort";
    case EventKind::kAbortArrive: return "abort_arrive";
    case EventKind::kEngineStep: return "engine_step";
    case EventKind::kLifecycle: return "lifecycle";
    case EventKind::kLifecycleEnd: return "lifecycle_end";
    case EventKind::kRankTimer: return "rank_timer";
    case EventKind::kDeliver: return "deliver";
    case EventKind::kWriteDone: return "write_done";
    case EventKind::kCrash: return "crash";
    case EventKind::kHeal: return "heal";
    case EventKind::kFaultsEnd: return "faults_end";
    case EventKind::kReconnect: return "reconnect";
    case EventKind::kReadDone: return "read_done";
    case EventKind::kRankAbort: return "rank_abort";
    case EventKind::kDrainCheck: return "drain_check";
    case EventKind::kRestart: return "restart";
    case EventKind::kLaneClosed: return "lane_closed";
    case EventKind::kRelease: return "release";
  }
  return "?";
}

}  // namespace

Simulator::Simulator(const SimParams& params, const SimOptions& options)
    : params_(params), options_(options), prng_(Mix64(params.seed)) {
  result_.seed = params.seed;
  nonce_prng_ = Prng(Mix64(params.seed ^ 0xA11CEull));
  KV_CHECK(engine::ModelShapeByName("tiny", &shape_));
  const uint32_t n = static_cast<uint32_t>(params_.p_tp.size() + params_.d_tp.size());
  nodes_.resize(n);
  for (uint32_t e = 0; e < n; ++e) BuildNode(e);
  for (uint32_t e = 0; e < n; ++e) {
    if (!nodes_[e].producer) ConnectAll(e);
  }
}

Simulator::~Simulator() = default;

void Simulator::BuildNode(uint32_t e) {
  Node& node = nodes_[e];
  const uint32_t np = static_cast<uint32_t>(params_.p_tp.size());
  node.producer = e < np;
  node.tp = node.producer ? params_.p_tp[e] : params_.d_tp[e - np];
  const uint32_t blocks = node.producer ? params_.p_pool_blocks : params_.d_pool_blocks;
  node.memory = std::make_unique<SimMemory>(blocks);
  engine::EngineOptions eo;
  eo.engine_id = e;
  eo.incarnation = node.incarnation;
  eo.role = params_.both_roles ? engine::Role::kBoth
            : node.producer     ? engine::Role::kProducer
                                : engine::Role::kConsumer;
  eo.tp = node.tp;
  eo.shape = shape_;
  eo.num_blocks = blocks;
  eo.max_batch_tokens = params_.max_batch_tokens;
  eo.load_failure_policy = params_.recompute_on_failure ? engine::LoadFailurePolicy::kRecompute
                                                        : engine::LoadFailurePolicy::kFail;
  eo.step_base = params_.step_time;
  eo.max_queue_wait = params_.max_queue_wait;
  eo.stream_chunks = params_.stream_chunks;
  node.engine = std::make_unique<engine::Engine>(eo, node.memory.get());
  const ConnectorRole role = params_.both_roles ? ConnectorRole::kBoth
                            : node.producer      ? ConnectorRole::kProducer
                                                 : ConnectorRole::kConsumer;
  node.ranks.clear();
  for (uint32_t r = 0; r < node.tp; ++r) {
    RankSessionOptions o;
    o.connector.role = role;
    o.connector.rank = r;
    o.connector.tp = node.tp;
    o.timings = params_.timings;
    o.connector.send.num_workers = params_.num_workers;
    o.connector.mode = params_.kv_mode;
    o.self.engine_id = e;
    o.self.incarnation = node.incarnation;
    o.self.rank = r;
    o.self.tp = node.tp;
    o.self.role = static_cast<uint8_t>(role);
    o.self.layers = shape_.layers;
    o.self.kv_heads = shape_.kv_heads;
    o.self.head_dim = shape_.head_dim;
    o.self.dtype_bytes = shape_.dtype_bytes;
    o.self.block_tokens = shape_.block_tokens;
    o.self.num_blocks = blocks;
    o.self.registration = {static_cast<uint8_t>(e), static_cast<uint8_t>(r)};
    o.max_tp = engine::kHeadGroups;
    o.idle_heartbeats = false;  // the run ends when its queue does
    o.silence_fails_loads = params_.grants_checked;
    if (params_.auth) {
      o.auth_token = "sim-token";
      o.nonce = [this] {
        HandshakeNonce n;
        for (size_t i = 0; i < n.size(); i += 8) {
          const uint64_t v = nonce_prng_.Next64();
          for (size_t k = 0; k < 8; ++k) n[i + k] = static_cast<uint8_t>(v >> (8 * k));
        }
        return n;
      };
    }
    node.ranks.push_back(std::make_unique<RankSession>(std::move(o)));
  }
  node.timer_at.assign(node.tp, std::nullopt);
  node.step_scheduled = false;
}

bool Simulator::Live(uint32_t engine, uint64_t incarnation) const {
  return nodes_[engine].alive && nodes_[engine].incarnation == incarnation;
}

void Simulator::ConnectAll(uint32_t d) {
  Node& node = nodes_[d];
  for (uint32_t p = 0; p < nodes_.size(); ++p) {
    if (!nodes_[p].producer || p == d) continue;
    for (uint32_t dr = 0; dr < node.tp; ++dr) {
      for (uint32_t pr : ProducerRanksFor(dr, node.tp, nodes_[p].tp)) {
        node.ranks[dr]->Connect(p, pr, SameHost(d, p), now_);
      }
      DrainRank(d, dr);
    }
  }
}

bool Simulator::ProducersKnown(uint32_t d, uint32_t p) const {
  const Node& node = nodes_[d];
  for (uint32_t dr = 0; dr < node.tp; ++dr) {
    for (uint32_t pr : ProducerRanksFor(dr, node.tp, nodes_[p].tp)) {
      if (!node.ranks[dr]->CanLoadFrom(p, pr)) return false;
    }
  }
  return true;
}

bool Simulator::SameHost(uint32_t d, uint32_t p) const {
  return Mix64(params_.seed ^ (uint64_t{d} << 32) ^ p) % 1000 < params_.same_host_pm;
}

std::string Simulator::IdentityOf(uint32_t e, uint32_t r) const {
  return std::to_string(e) + ":" + std::to_string(r) + ":" +
         std::to_string(nodes_[e].incarnation);
}

SimResult Simulator::Run() {
  Instant t = Instant::Epoch();
  clients_.resize(params_.num_requests);
  for (uint32_t i = 0; i < params_.num_requests; ++i) {
    t = t + Duration::Nanoseconds(
                static_cast<int64_t>(prng_.Uniform(params_.arrival_gap_max.ns()) + 1));
    queue_.Push(Event{t, 0, EventKind::kClientArrive, i});
  }
  queue_.Push(Event{Instant::Epoch() + params_.fault_phase, 0, EventKind::kFaultsEnd});
  // Liveness bound. A control message lost in the fault phase costs its
  // transfer at most one give-up period (abort_timeout + giveup_grace: P's
  // expiry or deadline, D's give-up); under pool pressure requests queue
  // behind such transfers, so in the worst case each request waits out one
  // period after the faults stop. A wedge never drains; this bound turns
  // it into a failure.
  // A request's own work: a step per prompt token at worst, one per output.
  const Duration work =
      params_.step_time * (params_.max_prompt_blocks * 4 + params_.max_output_tokens + 16);
  // A P that dies is found out within peer_dead_after (and may stay away
  // crash_downtime_max); a D leg waits that long for its producers.
  const Duration found = params_.timings.peer_dead_after + params_.timings.heartbeat * 2 +
                         params_.crash_downtime_max + params_.net_delay_max * 4;
  Duration period = params_.timings.GiveUp() + work + found;
  if (params_.kv_mode == KvMode::kRead) {
    // A lost notice costs a lease instead: P holds until the lease runs
    // out — the initial one, or the last heartbeat's extension, and D
    // heartbeats no longer than its give-up time.
    period = std::max(params_.timings.lease, params_.timings.GiveUp()) +
             params_.timings.lease_extension + work + found;
  }
  const Instant bound = std::max(t, Instant::Epoch() + params_.fault_phase) +
                        period * (params_.num_requests + 2) + Duration::Seconds(10);
  if (params_.plan.enabled) {
    // On "both", one side gets the call `gap` after the other. D first:
    // meanwhile P finishes prefills whose D will not pull them while paused
    // — the exports a pause must not wait for. P first: D's requests wait
    // for prefills P will not run while paused — loads a drain must not
    // wait for.
    using Order = ScenarioPlan::Order;
    const bool both = params_.plan.on_p && params_.plan.on_d;
    for (uint32_t e = 0; e < nodes_.size(); ++e) {
      const bool target = nodes_[e].producer ? params_.plan.on_p : params_.plan.on_d;
      if (!target) continue;
      const bool second = both && (params_.plan.order == Order::kDFirst ? nodes_[e].producer
                                   : params_.plan.order == Order::kPFirst ? !nodes_[e].producer
                                                                          : false);
      const Duration lag = second ? params_.plan.gap : Duration::Zero();
      queue_.Push(Event{Instant::Epoch() + params_.plan.at + lag, 0, EventKind::kLifecycle, 0,
                        e, 0, nodes_[e].incarnation});
    }
  }
  uint64_t hash = Mix64(params_.seed);
  RunQueue(bound, &hash);
  if (result_.ok) CheckDrained();
  if (result_.ok && params_.plan.enabled) {
    // Probes after the case: fresh requests must give exactly the model's
    // output through the same P/D path.
    SendProbes();
    RunQueue(now_ + period * 2, &hash);
    if (result_.ok) CheckDrained();
    for (uint32_t i = first_probe_; result_.ok && i < clients_.size(); ++i) {
      if (clients_[i].outcome == LegOutcome::kOk) {
        ++result_.probes_ok;
      } else {
        Violation("probe request " + std::to_string(i) + " did not complete with output");
      }
    }
    for (const auto& [key, op] : planned_) {
      if (!op.done) Violation("the " + params_.plan.name + " call never returned");
    }
    // ScenarioPlan::MayAbort; faults are off in a matrix case.
    const bool may_abort = params_.plan.MayAbort();
    // Under kv_load_failure_policy=fail a load that failed fails its
    // request, so only a call that aborts may cause an error; a cache
    // reset's cut-short loads recompute under either policy.
    const bool may_fail = may_abort && !params_.recompute_on_failure;
    for (uint32_t i = 0; result_.ok && i < clients_.size(); ++i) {
      const Client& c = clients_[i];
      if ((c.outcome == LegOutcome::kError && !may_fail) ||
          (c.outcome == LegOutcome::kAborted && !c.abort_sent && !may_abort)) {
        Violation("request " + std::to_string(i) + " was " +
                  (c.outcome == LegOutcome::kError ? "failed" : "aborted") + " by the " +
                  params_.plan.name + " call; it must be kept");
      }
    }
  }
  for (const Node& node : nodes_) result_.blocks_left += node.engine->pool().num_referenced();
  result_.trace_hash = hash;
  result_.end_time = now_;
  for (const Client& c : clients_) {
    if (!c.outcome) continue;
    switch (*c.outcome) {
      case LegOutcome::kOk: ++result_.requests_ok; break;
      case LegOutcome::kError: ++result_.requests_error; break;
      case LegOutcome::kAborted: ++result_.requests_aborted; break;
    }
  }
  for (const Node& node : nodes_) {
    Hit(Mark::kLoadFailedRecompute, node.engine->stats().loads_recomputed);
    Hit(Mark::kLoadFailedError, node.engine->stats().loads_failed);
    Hit(Mark::kPoolPressure, node.engine->stats().preemptions);
    Hit(Mark::kPrefixHit, node.engine->stats().prefix_hits);
    Hit(Mark::kProducerToken, node.engine->stats().producer_tokens);
    Hit(Mark::kQueueWaitExpired, node.engine->stats().queue_wait_expired);
    Hit(Mark::kStreamParked, node.engine->stats().streams_parked);
    for (const auto& session : node.ranks) {
      const RankConnector* rank = &session->connector();
      const RankSessionStats& ss = session->stats();
      Hit(Mark::kPeerDown, ss.peers_down);
      Hit(Mark::kPeerGone, ss.peers_gone - ss.peers_exited);
      Hit(Mark::kPeerExited, ss.peers_exited);
      Hit(Mark::kStaleHandshake, ss.stale_handshakes);
      Hit(Mark::kPeerCameBack, ss.reconnects);
      Hit(Mark::kPullMisaddressed, ss.pulls_misaddressed);
      if (const SendTable* s = rank->send_table()) {
        const SendTableStats& st = s->stats();
        Hit(Mark::kPullBeforeClaim, st.placeholders);
        Hit(Mark::kAnsweredFromTombstone, st.answered_from_tombstone);
        Hit(Mark::kWriteDoneAfterEnd, st.writes_done_after_end);
        Hit(Mark::kSendExpired, st.ends[static_cast<int>(TransferResult::kExpired)]);
        Hit(Mark::kDeadlineAtAdmission, st.deadline_at_admission);
        Hit(Mark::kDeadlineTimer, st.deadline_timer);
        Hit(Mark::kWriteFailed, st.writes_failed);
        Hit(Mark::kReanswered, st.reanswered);
        Hit(Mark::kStreamed, st.streams);
        Hit(Mark::kChunkWrite, st.chunk_writes);
        Hit(Mark::kStreamEnded, st.ended_streaming);
      }
      if (const LeaseTable* l = rank->lease_table()) {
        const LeaseTableStats& st = l->stats();
        Hit(Mark::kLeaseExpired, st.expired);
        Hit(Mark::kLeaseExpiredRevoking, st.expired_revoking);
        Hit(Mark::kLeaseExtended, st.extensions);
        Hit(Mark::kRevokeSent, st.revokes_sent);
        Hit(Mark::kNoticeAfterEnd, st.notices_after_end);
      }
      if (const ReadLoadTable* l = rank->read_table()) {
        const ReadLoadTableStats& st = l->stats();
        Hit(Mark::kRevokeWaitedForRead, st.revokes_waited);
        Hit(Mark::kGrantTooLate, st.grants_too_late);
        Hit(Mark::kReadFailed, st.reads_failed);
        Hit(Mark::kLoadCutShort, st.loads_cut_short);
        Hit(Mark::kReleaseWhileLoading, st.loads_released);
        Hit(Mark::kProducerGivenUp, st.producers_given_up);
      }
      if (const LoadTable* l = rank->load_table()) {
        Hit(Mark::kProducerGivenUp, l->stats().producers_given_up);
        Hit(Mark::kLateAnswerDropped, l->stats().late_answers);
        Hit(Mark::kLoadCutShort, l->stats().loads_cut_short);
        Hit(Mark::kReleaseWhileLoading, l->stats().loads_released);
        Hit(Mark::kReleaseBeforeAlloc, l->stats().releases_unstarted);
        Hit(Mark::kPullResent, l->stats().resent);
      }
      Hit(Mark::kReadyRefused, rank->stats().ready_refused);
      Hit(Mark::kProgressRefused, rank->stats().progress_refused);
      Hit(Mark::kStaleIncarnation, rank->stats().stale_incarnation);
    }
  }
  return result_;
}

void Simulator::RunQueue(Instant bound, uint64_t* hash) {
  while (!queue_.empty() && result_.ok) {
    Event ev = queue_.Pop();
    if (ev.at > bound) {
      Violation("liveness: still busy at " + std::to_string(ev.at.seconds()) +
                " s (bound " + std::to_string(bound.seconds()) + " s)");
      break;
    }
    KV_CHECK_GE(ev.at, now_);
    now_ = ev.at;
    *hash = Mix64(*hash ^ static_cast<uint64_t>(ev.at.ns())) ^
            Mix64((static_cast<uint64_t>(ev.kind) << 56) ^ (uint64_t{ev.a} << 32) ^
                  (uint64_t{ev.b} << 16) ^ ev.c ^ (ev.x << 40));
    ++result_.events;
    if (options_.trace) Trace(ev);
    Dispatch(ev);
    if (result_.ok) CheckAll();
  }
}

void Simulator::SendProbes() {
  first_probe_ = static_cast<uint32_t>(clients_.size());
  const uint32_t n = params_.plan.probes;
  clients_.resize(clients_.size() + n);
  for (uint32_t k = 0; k < n; ++k) {
    queue_.Push(Event{now_ + Duration::Milliseconds(1 + k), 0, EventKind::kClientArrive,
                      first_probe_ + k});
  }
}

void Simulator::Dispatch(const Event& ev) {
  switch (ev.kind) {
    case EventKind::kClientArrive:
      ClientArrive(ev.a);
      break;
    case EventKind::kLegArrive: {
      Client& c = clients_[ev.a];
      Node& node = nodes_[ev.b];
      if (ev.x != node.incarnation || !node.alive) {
        LegEnded(ev.b, ev.a, LegOutcome::kError);  // connection to a dead process
        break;
      }
      if (!node.producer && c.d_abort_while_waiting) {
        LegEnded(ev.b, ev.a, LegOutcome::kAborted);
        break;
      }
      if (!node.producer && !ProducersKnown(ev.b, c.p)) {
        // The runtime's EnsureProducers: wait for a live handshake with
        // every P rank the load needs, for a while, then fail the leg.
        const Duration wait = params_.timings.peer_dead_after + params_.timings.heartbeat * 4 +
                              params_.net_delay_max * 4 + params_.crash_downtime_max;
        if (Duration::Milliseconds(ev.c) > wait) {
          Hit(Mark::kProducersUnknown);
          LegEnded(ev.b, ev.a, LegOutcome::kError);
          break;
        }
        queue_.Push(Event{now_ + Duration::Milliseconds(1), 0, EventKind::kLegArrive, ev.a,
                          ev.b, ev.c + 1, ev.x});
        break;
      }
      (node.producer ? c.p_arrived : c.d_arrived) = true;
      engine::RequestSpec spec;
      spec.client = ev.a;
      spec.prompt = c.prompt;
      spec.max_tokens = c.max_tokens;
      spec.kv.transfer = c.transfer;
      if (node.producer) {
        spec.kv.do_remote_decode = true;
        spec.kv.remote_tp = nodes_[c.d].tp;
        if (ConsumersPerProducer(node.tp, nodes_[c.d].tp) > 1) Hit(Mark::kMultiConsumer);
      } else {
        spec.kv.do_remote_prefill = true;
        spec.kv.remote_engine = c.p;
        spec.kv.remote_tp = nodes_[c.p].tp;
        if (nodes_[c.p].tp > node.tp) Hit(Mark::kMultiProducer);
      }
      Status s = node.engine->AddRequest(std::move(spec), now_);
      if (!s.ok()) {
        if (s.code() == StatusCode::kAlreadyExists) Hit(Mark::kDuplicateTransferRejected);
        LegEnded(ev.b, ev.a, LegOutcome::kError);
      } else if (node.producer) {
        c.p_admitted = true;
        // A client that leaves right after P accepted its leg: the server's
        // fast abort can reach the ranks before the engine's claim does.
        if (ev.a < first_probe_ && !c.abort_sent &&
            prng_.Chance(params_.early_abort_pm, 1000)) {
          c.abort_sent = true;
          for (uint32_t r = 0; r < node.tp; ++r) RankAbort(ev.a, ev.b, r);
          SendAbort(ev.a, c.p);
          SendAbort(ev.a, c.d);
        }
      }
      AfterInput(ev.b);
      break;
    }
    case EventKind::kClientAbort:
      ClientAbort(ev.a);
      break;
    case EventKind::kAbortArrive:
      if (Live(ev.b, ev.x) && ev.b == clients_[ev.a].d && !clients_[ev.a].d_arrived &&
          !clients_[ev.a].d_ended) {
        clients_[ev.a].d_abort_while_waiting = true;  // its leg still waits for handshakes
      }
      // P's server answered the leg already: an abort (a client gone, a
      // cancel) finds no open request there; the router's release ends the
      // send instead (Release).
      if (Live(ev.b, ev.x) && !(nodes_[ev.b].producer && clients_[ev.a].p_ended)) {
        if (nodes_[ev.b].producer) FastAbort(ev.a, ev.b);
        nodes_[ev.b].engine->AbortRequest(ev.a);
        AfterInput(ev.b);
      }
      break;
    case EventKind::kRankAbort:
      if (Live(ev.b, ev.x)) RankAbort(ev.a, ev.b, ev.c);
      break;
    case EventKind::kRelease:
      if (Live(ev.b, ev.x)) Release(ev.a, ev.b);
      break;
    case EventKind::kDrainCheck:
      CheckPromptDrain();
      break;
    case EventKind::kEngineStep: {
      Node& node = nodes_[ev.b];
      if (!Live(ev.b, ev.x)) break;
      node.step_scheduled = false;
      std::vector<RankReport> reports;
      for (uint32_t r = 0; r < node.tp; ++r) {
        reports.push_back(node.ranks[r]->GetFinished(now_));
        DrainRank(ev.b, r);  // its revokes, before the engine frees a block
      }
      const Duration spent = node.engine->Step(reports, now_);
      DrainEngine(ev.b);
      bool more = node.engine->HasWork();
      for (auto& rank : node.ranks) more = more || rank->HasReport();
      if (more) ScheduleStep(ev.b, spent);
      break;
    }
    case EventKind::kLifecycle:
      if (Live(ev.b, ev.x)) StartOp(ev.b);
      break;
    case EventKind::kLifecycleEnd:
      if (Live(ev.b, ev.x)) {
        nodes_[ev.b].engine->Resume();
        nodes_[ev.b].engine->WakeUp();
        AfterInput(ev.b);
      }
      break;
    case EventKind::kRankTimer: {
      Node& node = nodes_[ev.b];
      if (!Live(ev.b, ev.x)) break;
      if (node.timer_at[ev.c] == ev.at) node.timer_at[ev.c].reset();
      node.ranks[ev.c]->OnTimer(now_);
      DrainRank(ev.b, ev.c);
      if (!node.producer) CheckDeadProducers(ev.b, ev.c);
      break;
    }
    case EventKind::kDeliver:
      Deliver(ev.a);
      break;
    case EventKind::kWriteDone:
      FinishWrite(ev.a);
      break;
    case EventKind::kReadDone:
      FinishRead(ev.a);
      break;
    case EventKind::kCrash:
      Crash(ev.b);
      break;
    case EventKind::kHeal:
      partitions_.erase({ev.b, ev.c});
      ReconnectEngines(ev.b, ev.c);
      break;
    case EventKind::kFaultsEnd: {
      faults_over_ = true;
      auto healed = partitions_;
      partitions_.clear();
      for (const auto& [pair, since] : healed) ReconnectEngines(pair.first, pair.second);
      EndOps();
      break;
    }
    case EventKind::kReconnect: {
      reconnect_pending_.erase(ConnKey(ev.b, ev.c, ev.a, static_cast<uint32_t>(ev.x)));
      Node& d = nodes_[ev.b];
      if (ev.c >= d.tp || Partitioned(ev.a, ev.b)) break;
      if (!d.alive) break;
      d.ranks[ev.c]->OnReconnected(ev.a, static_cast<uint32_t>(ev.x), now_);
      DrainRank(ev.b, ev.c);
      break;
    }
    case EventKind::kRestart:
      if (ev.x == nodes_[ev.b].incarnation && !nodes_[ev.b].alive) Restart(ev.b);
      break;
    case EventKind::kLaneClosed: {
      Node& d = nodes_[ev.b];
      const uint32_t pr = static_cast<uint32_t>(ev.x), inc = static_cast<uint32_t>(ev.x >> 32);
      const LinkKey link{ev.b, ev.c, ev.a, pr};
      auto lane = lanes_.find(link);
      if (!d.alive || ev.c >= d.tp || lane == lanes_.end() || lane->second != inc) break;
      // The lane of that incarnation: one the session replaced (it saw the
      // restart first) closed unnoticed, as the runtime's retired lanes do.
      const ProducerPeer* peer = d.ranks[ev.c]->Producer(ev.a, pr);
      if (peer == nullptr || (peer->known && peer->peer.generation != inc)) break;
      lanes_.erase(link);
      d.ranks[ev.c]->OnLaneClosed(ev.a, pr, /*process_gone=*/true, now_);
      DrainRank(ev.b, ev.c);
      break;
    }
  }
}

void Simulator::ApplyToRanks(uint32_t engine, const ConnectorMetadata& meta) {
  Node& node = nodes_[engine];
  for (uint32_t r = 0; r < node.tp; ++r) {
    node.ranks[r]->ApplyMetadata(meta, now_);
    DrainRank(engine, r);
  }
}

void Simulator::ScheduleStep(uint32_t engine, Duration after) {
  Node& node = nodes_[engine];
  if (node.step_scheduled) return;
  node.step_scheduled = true;
  queue_.Push(Event{now_ + std::max(after, params_.step_time), 0, EventKind::kEngineStep, 0,
                    engine, 0, node.incarnation});
}

void Simulator::AfterInput(uint32_t engine) {
  nodes_[engine].engine->Control();
  DrainEngine(engine);
  ScheduleStep(engine);
}

// Moves the engine's actions into the world: tokens and finished legs to
// clients, metadata to the ranks, operation results to the record.
void Simulator::DrainEngine(uint32_t e) {
  Node& node = nodes_[e];
  // What the engine freed, checked against the grants and jobs as they
  // were when it freed them: before this batch's metadata grants anew.
  BlocksFreedCheck(e);
  while (auto a = node.engine->PollAction()) {
    if (options_.trace) TraceAction(e, *a);
    if (auto* t = std::get_if<engine::TokenOut>(&*a)) {
      Client& c = clients_[t->client];
      (node.producer ? c.p_tokens : c.d_tokens).push_back(*t);
    } else if (auto* d = std::get_if<engine::RequestDone>(&*a)) {
      const bool p_leg = node.producer;
      if (d->reason == engine::FinishReason::kLength) CheckTokens(static_cast<uint32_t>(d->client), p_leg);
      LegEnded(e, static_cast<uint32_t>(d->client),
               d->reason == engine::FinishReason::kLength  ? LegOutcome::kOk
               : d->reason == engine::FinishReason::kError ? LegOutcome::kError
                                                           : LegOutcome::kAborted);
    } else if (auto* m = std::get_if<engine::MetadataOut>(&*a)) {
      ApplyToRanks(e, m->meta);
    } else if (auto* op = std::get_if<engine::OpDone>(&*a)) {
      ++result_.ops;
      if (!op->ok) ++result_.ops_failed;
      OnOpDone(e, *op);
    }
  }
}

void Simulator::TraceAction(uint32_t e, const engine::EngineAction& a) {
  if (auto* t = std::get_if<engine::TokenOut>(&a)) {
    std::printf("  engine %u: request %llu token %u (weights v%llu)\n", e,
                static_cast<unsigned long long>(t->client), t->token,
                static_cast<unsigned long long>(t->weights_version));
  } else if (auto* d = std::get_if<engine::RequestDone>(&a)) {
    std::printf("  engine %u: request %llu done (%d) %s\n", e,
                static_cast<unsigned long long>(d->client), static_cast<int>(d->reason),
                d->error.c_str());
  } else if (auto* m = std::get_if<engine::MetadataOut>(&a)) {
    for (const auto& c : m->meta.claims) std::printf("  engine %u: claim %s\n", e, c.transfer.ToString().c_str());
    for (const auto& c : m->meta.readies) std::printf("  engine %u: ready %s (%zu blocks)\n", e, c.transfer.ToString().c_str(), c.blocks.size());
    for (const auto& c : m->meta.aborts) std::printf("  engine %u: abort send %s\n", e, c.transfer.ToString().c_str());
    for (const auto& c : m->meta.loads) std::printf("  engine %u: load %s (%zu blocks)\n", e, c.transfer.ToString().c_str(), c.dst.size());
    for (const auto& c : m->meta.releases) std::printf("  engine %u: release load of %s\n", e, c.request.ToString().c_str());
    if (m->meta.abort_all) std::printf("  engine %u: abort_transfers\n", e);
  } else if (auto* o = std::get_if<engine::OpDone>(&a)) {
    std::printf("  engine %u: op %llu done ok=%d %s\n", e,
                static_cast<unsigned long long>(o->op), o->ok, o->detail.c_str());
  }
}

void Simulator::Trace(const Event& ev) {
  std::printf("t=%.6f %-13s a=%u b=%u c=%u x=%llu\n", ev.at.seconds(), KindName(ev.kind),
              ev.a, ev.b, ev.c, static_cast<unsigned long long>(ev.x));
}

SimResult RunSeed(uint64_t seed, const SimOptions& options) {
  Simulator sim(DrawParams(seed), options);
  return sim.Run();
}

}  // namespace kvrelay::sim
