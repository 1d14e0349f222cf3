#include "runtime/rank_actor.h"

#include <zmq.h>

#include <algorithm>
#include <cstring>

#include "core/tp_mapping.h"
#include "net/write_plan.h"
#include "runtime/clock.h"
#include "runtime/local_lane.h"
#include "runtime/log.h"
#include "runtime/os_random.h"
#include "runtime/thread_priority.h"

namespace kvrelay::runtime {

namespace {

std::string Endpoint(const std::string& host, uint32_t port) {
  return "tcp://" + host + ":" + std::to_string(port);
}

int ToMillis(Duration d) {
  if (d.ns() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(d.ns() / 1'000'000 + 1, 100));
}

}  // namespace

RankActor::RankActor(const RankActorOptions& options, void* zmq_context,
                     net::Transport* transport, net::Region* region, EngineActor* engine,
                     LatencySink sink)
    : options_(options),
      zmq_(zmq_context),
      transport_(transport),
      region_(region),
      engine_(engine),
      sink_(std::move(sink)),
      session_(SessionOptions()),
      inbox_(65536),
      writers_(std::make_unique<WriterPool>(options.num_workers,
                                            size_t{options.num_workers} * 4)) {}

RankActor::~RankActor() { Stop(); }

Status RankActor::Start() {
  if (options_.role != ConnectorRole::kConsumer) {
    router_ = zmq_socket(zmq_, ZMQ_ROUTER);
    const int one = 1, zero = 0;
    zmq_setsockopt(router_, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(router_, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    zmq_setsockopt(router_, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(router_, ZMQ_SNDHWM, &options_.socket_hwm, sizeof(int));
    zmq_setsockopt(router_, ZMQ_RCVHWM, &options_.socket_hwm, sizeof(int));
    const int64_t max_msg = options_.limits.max_frame_bytes;
    zmq_setsockopt(router_, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    const std::string ep = Endpoint(options_.listen_host, options_.ctrl_port + options_.rank);
    if (zmq_bind(router_, ep.c_str()) != 0) {
      const std::string err = zmq_strerror(zmq_errno());
      zmq_close(router_);
      router_ = nullptr;
      return Status(StatusCode::kUnavailable, "rank " + std::to_string(options_.rank) +
                                                  ": cannot bind control channel " + ep +
                                                  ": " + err);
    }
    ListenForLanes();
  }
  next_chores_ = MonoNow();
  thread_ = std::thread([this] {
    NameThisThread("kv-rank" + std::to_string(options_.rank));
    if (options_.thread_nice != 0) {
      if (Status s = SetThisThreadNice(options_.thread_nice); !s.ok()) {
        Log("rank", "rank %u thread keeps its priority: %s", options_.rank, s.ToString().c_str());
      }
    }
    if (options_.thread_slice_us != 0) {
      if (Status s = SetThisThreadSliceUs(options_.thread_slice_us); !s.ok()) {
        Log("rank", "rank %u thread keeps its slice: %s", options_.rank, s.ToString().c_str());
      }
    }
    Loop();
  });
  return Status::Ok();
}

void RankActor::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  inbox_.Kick();
  thread_.join();
  inbox_.Close();  // writers finishing now post nothing
  writers_->Stop();
}

void RankActor::PostMetadata(const ConnectorMetadata& meta) {
  inbox_.Post([this, meta] { ApplyMetadata(meta); });
}

bool RankActor::TryPostMetadata(const ConnectorMetadata& meta) {
  const Instant posted = MonoNow();
  return inbox_.TryPost([this, meta, posted] {
    if (sink_.posted_to_applied) sink_.posted_to_applied((MonoNow() - posted).seconds());
    ApplyMetadata(meta);
  });
}

void RankActor::ApplyMetadata(const ConnectorMetadata& meta) {
  session_.ApplyMetadata(meta, MonoNow());
}

Status RankActor::EnsureProducers(uint32_t engine, const std::string& host, uint16_t port,
                                  uint32_t p_tp, Duration timeout) {
  if (options_.role == ConnectorRole::kProducer) {
    return FailedPreconditionError("a prefill-only engine does not load KV");
  }
  if (p_tp == 0 || p_tp > engine::kHeadGroups || engine::kHeadGroups % p_tp != 0) {
    return InvalidArgumentError("remote_tp_size must be 1, 2 or 4");
  }
  std::vector<uint32_t> ranks = ProducerRanksFor(options_.rank, options_.tp, p_tp);
  auto all_known = [&]() REQUIRES(known_mu_) {
    for (uint32_t r : ranks) {
      if (!known_.count({engine, r})) return false;
    }
    return true;
  };
  {
    MutexLock lock(&known_mu_);
    if (all_known()) return Status::Ok();
  }
  inbox_.Post([this, engine, host, port, ranks] {
    for (uint32_t r : ranks) ConnFor(engine, r, host, port);
  });
  MutexLock lock(&known_mu_);
  if (!known_cv_.WaitFor(&known_mu_, std::chrono::nanoseconds(timeout.ns()), all_known)) {
    return Status(StatusCode::kUnavailable,
                  "no handshake from prefill engine " + std::to_string(engine) + " at " +
                      host + ":" + std::to_string(port) + " within " +
                      std::to_string(timeout.millis()) + " ms");
  }
  return Status::Ok();
}

std::optional<RankState> RankActor::State() {
  auto p = std::make_shared<std::promise<RankState>>();
  auto f = p->get_future();
  if (!inbox_.Post([this, p] {
        RankState s;
        s.rank = options_.rank;
        s.now = MonoNow();
        const RankConnector& conn = session_.connector();
        if (const SendTable* t = conn.send_table()) {
          s.sends = t->Sends();
          s.send_stats = t->stats();
          s.writes_in_flight = t->writes_in_flight();
          s.queued_for_sender = t->queued_for_sender();
          s.tombstones = t->tombstones();
        }
        if (const LoadTable* t = conn.load_table()) {
          s.loads = t->Loads();
          s.load_stats = t->stats();
        }
        s.mode = conn.mode();
        if (const LeaseTable* t = conn.lease_table()) {
          s.leases = t->Leases();
          s.lease_stats = t->stats();
          s.tombstones = t->tombstones();
        }
        if (const ReadLoadTable* t = conn.read_table()) {
          s.loads = t->Loads();
          s.read_stats = t->stats();
        }
        s.connector_stats = conn.stats();
        for (const auto& [key, pr] : session_.producers()) {
          auto c = conns_.find(key);
          s.peers.push_back(PeerView{pr.engine, pr.rank, pr.peer,
                                     c == conns_.end() ? "" : c->second.endpoint,
                                     ProducerStateName(pr.state),
                                     pr.known ? (s.now - pr.last_heard).seconds() : 0});
        }
        p->set_value(std::move(s));
      })) {
    return std::nullopt;
  }
  if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) return std::nullopt;
  return f.get();
}

// --- the loop ----------------------------------------------------------------

void RankActor::Loop() {
  std::deque<Inbox::Fn> fns;
  std::vector<zmq_pollitem_t> items;
  // What each poll item is, in order after the inbox.
  enum class Polled : uint8_t { kRouter, kListener, kDLane, kDealer, kPLane, kWrite };
  struct Entry {
    Polled kind;
    LocalLane* lane = nullptr;
    Conn* conn = nullptr;
    PolledWrite* write = nullptr;
  };
  std::vector<Entry> polled;
  auto lane_events = [](const LocalLane& l) {
    return static_cast<short>(ZMQ_POLLIN | (l.wants_write() ? ZMQ_POLLOUT : 0));
  };
  while (!stop_) {
    items.clear();
    polled.clear();
    std::erase_if(polled_writes_, [](const auto& w) { return w->over; });
    items.push_back(zmq_pollitem_t{nullptr, inbox_.fd(), ZMQ_POLLIN, 0});
    bool buffered = false;  // a lane holds a whole frame it did not deliver
    if (router_ != nullptr) {
      items.push_back(zmq_pollitem_t{router_, 0, ZMQ_POLLIN, 0});
      polled.push_back({Polled::kRouter});
    }
    if (lane_listener_ != nullptr) {
      items.push_back(zmq_pollitem_t{nullptr, lane_listener_->fd(), ZMQ_POLLIN, 0});
      polled.push_back({Polled::kListener});
    }
    for (auto& l : d_lanes_) {
      if (l->broken()) continue;  // broken since the last sweep; goes at the next
      items.push_back(zmq_pollitem_t{nullptr, l->fd(), lane_events(*l), 0});
      polled.push_back({Polled::kDLane, l.get()});
      buffered |= l->has_buffered_frame();
    }
    for (auto& [key, c] : conns_) {
      items.push_back(zmq_pollitem_t{c.sock, 0, ZMQ_POLLIN, 0});
      polled.push_back({Polled::kDealer, nullptr, &c});
      if (c.lane != nullptr && !c.lane->broken()) {
        items.push_back(zmq_pollitem_t{nullptr, c.lane->fd(), lane_events(*c.lane), 0});
        polled.push_back({Polled::kPLane, c.lane.get(), &c});
        buffered |= c.lane->has_buffered_frame();
      }
    }
    Instant now = MonoNow();
    Instant wake = std::min(next_chores_, ExpirePolledWrites(now));
    for (auto& w : polled_writes_) {
      if (w->over) continue;  // abandoned just now
      const short events = w->write->wants_write() ? ZMQ_POLLOUT : ZMQ_POLLIN;
      items.push_back(zmq_pollitem_t{nullptr, w->write->fd(), events, 0});
      polled.push_back({Polled::kWrite, nullptr, nullptr, w.get()});
    }
    if (auto d = session_.NextDeadline()) wake = std::min(wake, *d);
    // Outcomes Pump left for lack of rounds (a long chain of inline
    // writes), or frames a lane read but did not deliver: nothing would
    // wake us for them, so only look and go on.
    const bool pending =
        buffered || !deferred_write_done_.empty() || !deferred_read_done_.empty();
    zmq_poll(items.data(), static_cast<int>(items.size()), pending ? 0 : ToMillis(wake - now));

    inbox_.Take(&fns);
    for (auto& fn : fns) fn();
    fns.clear();
    for (size_t i = 0; i < polled.size(); ++i) {
      const Entry& e = polled[i];
      const short ev = items[i + 1].revents;
      switch (e.kind) {
        case Polled::kRouter:
          if (ev & ZMQ_POLLIN) DrainRouter();
          break;
        case Polled::kListener:
          if (ev & ZMQ_POLLIN) AcceptLanes();
          break;
        case Polled::kDLane:
          if (ev & ZMQ_POLLOUT) e.lane->Flush();
          if ((ev & (ZMQ_POLLIN | ZMQ_POLLERR)) || e.lane->has_buffered_frame()) {
            ReadDLane(*e.lane);
          }
          break;
        case Polled::kDealer:
          if (ev & ZMQ_POLLIN) DrainDealer(*e.conn);
          break;
        case Polled::kWrite:
          if (ev != 0) ProgressPolledWrite(*e.write);  // POLLERR/POLLHUP too: it finds out
          break;
        case Polled::kPLane:
          // The lane may have been replaced (a P restart) since the poll.
          if (e.conn->lane.get() != e.lane) break;
          if (ev & ZMQ_POLLOUT) e.lane->Flush();
          if ((ev & (ZMQ_POLLIN | ZMQ_POLLERR)) || e.lane->has_buffered_frame()) {
            Conn& c = *e.conn;
            e.lane->Read([this, &c](const uint8_t* data, size_t size) {
              OnFrame(nullptr, &c, data, size);
            });
          }
          break;
      }
    }
    SweepLanes();
    now = MonoNow();
    if (auto d = session_.NextDeadline(); d && *d <= now) session_.OnTimer(now);
    if (now >= next_chores_) Chores(now);
    Pump();
    PublishStats();
  }
  // Shutdown: say goodbye to nothing; close the sockets (linger 0). A
  // write still waiting for its reply ends failed (its stream is closed).
  polled_writes_.clear();
  for (auto& [key, c] : conns_) zmq_close(c.sock);
  conns_.clear();
  lane_of_identity_.clear();
  d_lanes_.clear();
  lane_listener_.reset();
  if (router_ != nullptr) zmq_close(router_);
  router_ = nullptr;
}

void RankActor::DrainRouter() {
  zmq_msg_t id, body;
  for (int n = 0; n < 4096; ++n) {
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, router_, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&id);
      return;
    }
    std::string identity(static_cast<const char*>(zmq_msg_data(&id)), zmq_msg_size(&id));
    zmq_msg_close(&id);
    bool more = false;
    int rc;
    // Exactly one body frame after the identity; extra frames are dropped.
    int frames = 0;
    do {
      zmq_msg_init(&body);
      rc = zmq_msg_recv(&body, router_, 0);
      if (rc >= 0) {
        more = zmq_msg_more(&body) != 0;
        if (frames++ == 0) {
          OnFrame(&identity, nullptr, static_cast<const uint8_t*>(zmq_msg_data(&body)),
                  zmq_msg_size(&body));
        } else {
          ++driver_malformed_;
        }
      } else {
        more = false;
      }
      zmq_msg_close(&body);
    } while (more);
  }
}

void RankActor::DrainDealer(Conn& c) {
  zmq_msg_t body;
  for (int n = 0; n < 4096; ++n) {
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, c.sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&body);
      return;
    }
    OnFrame(nullptr, &c, static_cast<const uint8_t*>(zmq_msg_data(&body)), zmq_msg_size(&body));
    zmq_msg_close(&body);
  }
}

void RankActor::OnFrame(const std::string* identity, Conn* conn, const uint8_t* data,
                        size_t size) {
  const std::span<const uint8_t> frame(data, size);
  if (identity != nullptr) {
    session_.OnFrameFromConsumer(*identity, frame, MonoNow());
  } else {
    session_.OnFrameFromProducer(conn->engine, conn->rank, frame, MonoNow());
  }
  // Now, not at the end of the round: a hello's OpenTarget must be answered
  // before the next frame of the same D (its first pull) reaches the session.
  RunActions();
}

RankActor::Conn& RankActor::ConnFor(uint32_t engine, uint32_t rank, const std::string& host,
                                    uint16_t port) {
  auto [it, inserted] = conns_.try_emplace({engine, rank});
  Conn& c = it->second;
  if (!inserted) return c;
  c.engine = engine;
  c.rank = rank;
  c.port = uint32_t{port} + rank;
  c.endpoint = Endpoint(host, c.port);
  c.same_host = options_.local_lane && SameHost(host);
  c.sock = zmq_socket(zmq_, ZMQ_DEALER);
  const int zero = 0;
  zmq_setsockopt(c.sock, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(c.sock, ZMQ_SNDHWM, &options_.socket_hwm, sizeof(int));
  zmq_setsockopt(c.sock, ZMQ_RCVHWM, &options_.socket_hwm, sizeof(int));
  const int64_t max_msg = options_.limits.max_frame_bytes;
  zmq_setsockopt(c.sock, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
  const std::string id = RoutingId();
  zmq_setsockopt(c.sock, ZMQ_ROUTING_ID, id.data(), id.size());
  const int interval_ms = 100;
  zmq_setsockopt(c.sock, ZMQ_RECONNECT_IVL, &interval_ms, sizeof interval_ms);
  // A link that went silent (a partition) must not stay on its old TCP
  // connection, whose retransmission backoff grows to minutes: ZMTP pings
  // drop a connection silent for peer_down_after and ZeroMQ reconnects
  // (each attempt bounded), so a healed link is used within a second or so.
  const int ping_ms = static_cast<int>(options_.timings.heartbeat.millis());
  const int ping_timeout_ms = static_cast<int>(options_.timings.peer_down_after.millis());
  const int connect_timeout_ms = 1000;
  zmq_setsockopt(c.sock, ZMQ_HEARTBEAT_IVL, &ping_ms, sizeof ping_ms);
  zmq_setsockopt(c.sock, ZMQ_HEARTBEAT_TIMEOUT, &ping_timeout_ms, sizeof ping_timeout_ms);
  zmq_setsockopt(c.sock, ZMQ_CONNECT_TIMEOUT, &connect_timeout_ms, sizeof connect_timeout_ms);
  if (zmq_connect(c.sock, c.endpoint.c_str()) != 0) {
    Log("rank", "cannot connect to %s: %s", c.endpoint.c_str(), zmq_strerror(zmq_errno()));
  }
  session_.Connect(engine, rank, c.same_host, MonoNow());
  return c;
}

void RankActor::Chores(Instant now) {
  next_chores_ = now + options_.timings.heartbeat;
  CloseUnattachedLanes(now);
  for (auto& [key, c] : conns_) CheckLanePeerGone(c, now);
}

void RankActor::CheckLanePeerGone(Conn& c, Instant now) {
  if (c.closed_lane_pid == 0 || !ProcessGone(c.closed_lane_pid)) return;
  c.closed_lane_pid = 0;
  session_.OnLaneClosed(c.engine, c.rank, /*process_gone=*/true, now);
}

bool RankActor::SendFrame(void* sock, const std::string* identity,
                          const std::vector<uint8_t>& frame) {
  if (identity != nullptr &&
      zmq_send(sock, identity->data(), identity->size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
    ++send_failures_;
    return false;
  }
  if (zmq_send(sock, frame.data(), frame.size(), ZMQ_DONTWAIT) < 0) {
    ++send_failures_;
    return false;
  }
  ++counters_.frames_out;
  return true;
}

// --- the session's actions ---------------------------------------------------

void RankActor::Pump() {
  for (int round = 0; round < 64; ++round) {
    RunActions();
    if (deferred_write_done_.empty() && deferred_read_done_.empty()) break;
    const Instant now = MonoNow();
    auto done = std::move(deferred_write_done_);
    deferred_write_done_.clear();
    for (auto& [w, ok] : done) session_.OnWriteDone(w, ok, now);
    auto read_done = std::move(deferred_read_done_);
    deferred_read_done_.clear();
    for (auto& [r, ok] : read_done) session_.OnReadDone(r, ok, now);
  }
  if (session_.HasReport()) {
    RankReport r = session_.GetFinished(MonoNow());
    RunActions();  // its revokes, before the engine frees a block
    engine_->PostReport(options_.rank, std::move(r));
  }
}

void RankActor::RunActions() {
  while (auto a = session_.PollAction()) Run(std::move(*a));
}

void RankActor::Run(SessionAction a) {
  const Instant now = MonoNow();
  if (auto* f1 = std::get_if<FrameToProducer>(&a)) {
    auto it = conns_.find({f1->engine, f1->rank});
    if (it != conns_.end()) SendToP(it->second, f1->frame);
  } else if (auto* f2 = std::get_if<FrameToConsumer>(&a)) {
    SendToD(f2->identity, f2->frame);
  } else if (auto* w = std::get_if<StartWrite>(&a)) {
    StartWriteJob(std::move(*w));
  } else if (auto* r = std::get_if<StartRead>(&a)) {
    StartReadJob(std::move(*r));
  } else if (auto* o1 = std::get_if<OpenTarget>(&a)) {
    Result<std::unique_ptr<net::Target>> target = transport_->Open(o1->registration, region_);
    if (target.ok()) {
      targets_[o1->peer.index] = DTarget{o1->peer, std::shared_ptr<net::Target>(std::move(*target))};
    }
    session_.OnTargetOpened(o1->peer, target.ok(), target.status().ToString(), now);
  } else if (auto* o2 = std::get_if<OpenSource>(&a)) {
    auto it = conns_.find({o2->engine, o2->rank});
    if (it == conns_.end()) return;
    Result<std::unique_ptr<net::Source>> source = transport_->OpenSource(o2->registration, region_);
    if (source.ok()) {
      it->second.source = std::move(*source);
    } else {
      it->second.source.reset();
      session_.OnSourceBroken(o2->engine, o2->rank);
      LogOnce("rank", "open_source:" + it->second.endpoint,
              "rank " + std::to_string(options_.rank) + ": cannot open " + it->second.endpoint +
                  "'s KV for reading: " + source.status().ToString());
    }
  } else if (auto* o3 = std::get_if<kvrelay::OpenLane>(&a)) {
    auto it = conns_.find({o3->engine, o3->rank});
    if (it == conns_.end() || !ConnectLane(it->second)) {
      session_.OnLaneClosed(o3->engine, o3->rank, /*process_gone=*/false, now);
    }
  } else if (auto* g1 = std::get_if<GrantBlocks>(&a)) {
    if (g1->kind == GrantKind::kWrite) {
      region_->grants().Grant(g1->transfer, g1->blocks);
    } else {
      region_->read_grants().Grant(g1->transfer, g1->blocks);
    }
  } else if (auto* g2 = std::get_if<RevokeBlocks>(&a)) {
    if (g2->kind == GrantKind::kWrite) {
      region_->grants().Revoke(g2->transfer, g2->blocks);
    } else {
      region_->read_grants().RevokeAll(g2->transfer);
    }
  } else if (auto* pc = std::get_if<ProducerChanged>(&a)) {
    auto it = conns_.find({pc->engine, pc->rank});
    const std::string who = it == conns_.end() ? "P" : "P " + it->second.endpoint;
    MutexLock lock(&known_mu_);
    if (pc->state == ProducerState::kUp) {
      if (it != conns_.end()) it->second.closed_lane_pid = 0;  // a P that answers is alive
      known_.insert({pc->engine, pc->rank});
      known_cv_.NotifyAll();
    } else {
      if (pc->state == ProducerState::kGone) known_.erase({pc->engine, pc->rank});
      Log("rank", "%s %s: %s%s", who.c_str(), pc->why.c_str(), ProducerStateName(pc->state),
          pc->state == ProducerState::kGone ? "; its loads fail now" : "");
    }
  } else if (auto* o4 = std::get_if<PullAnswered>(&a)) {
    if (sink_.pull_answer) {
      sink_.pull_answer(o4->transfer, options_.rank, o4->blocks, o4->seconds, o4->result, now);
    }
  } else if (auto* o5 = std::get_if<LoadEnded>(&a)) {
    if (sink_.transfer) sink_.transfer(o5->seconds, o5->ok);
  } else if (auto* l = std::get_if<LogLine>(&a)) {
    if (l->once_key.empty()) {
      Log("rank", "%s", l->text.c_str());
    } else {
      LogOnce("rank", l->once_key, l->text);
    }
  }
}

void RankActor::PublishStats() {
  const RankSessionStats& s = session_.stats();
  auto set = [](std::atomic<uint64_t>& to, uint64_t v) { to.store(v, std::memory_order_relaxed); };
  set(counters_.frames_in, s.frames_in);
  set(counters_.malformed, s.malformed + driver_malformed_);
  for (int i = 0; i < kWireLimitCount; ++i) set(counters_.over_limit[i], s.over_limit[i]);
  set(counters_.unknown_sender, s.unknown_sender);
  set(counters_.handshake_refused, s.handshake_refused);
  set(counters_.unroutable, s.unroutable + send_failures_);
  set(counters_.handshakes, s.handshakes);
  set(counters_.peers_down, s.peers_down);
  set(counters_.peers_gone, s.peers_gone);
  set(counters_.reconnects, s.reconnects);
  set(counters_.pulls_sent, s.pulls_sent);
  set(counters_.answers_received, s.answers_received);
  set(counters_.auth_failed, s.auth_failed);
  set(counters_.pulls_refused_unauthenticated, s.pulls_refused_unauthenticated);
  set(counters_.pulls_refused_dst, s.pulls_refused_dst);
  set(counters_.pulls_misaddressed, s.pulls_misaddressed);
}

HandshakeMsg RankActor::OwnHandshake() const {
  HandshakeMsg hs;
  hs.engine_id = options_.engine_id;
  hs.incarnation = options_.incarnation;
  hs.rank = options_.rank;
  hs.tp = options_.tp;
  hs.role = static_cast<uint8_t>(options_.role);
  hs.transport = static_cast<uint8_t>(transport_->kind());
  hs.layers = options_.shape.layers;
  hs.kv_heads = options_.shape.kv_heads;
  hs.head_dim = options_.shape.head_dim;
  hs.dtype_bytes = options_.shape.dtype_bytes;
  hs.block_tokens = options_.shape.block_tokens;
  hs.num_blocks = options_.num_blocks;
  hs.registration = region_->registration();
  return hs;
}

RankSessionOptions RankActor::SessionOptions() const {
  RankSessionOptions o;
  o.connector.role = options_.role;
  o.connector.rank = options_.rank;
  o.connector.tp = options_.tp;
  o.connector.mode = options_.mode;
  o.timings = options_.timings;
  o.connector.send.num_workers = options_.num_workers;
  o.self = OwnHandshake();
  o.max_tp = engine::kHeadGroups;
  o.limits = options_.limits;
  o.auth_token = options_.auth_token;
  o.nonce = NonceFromOs;
  return o;
}

}  // namespace kvrelay::runtime
