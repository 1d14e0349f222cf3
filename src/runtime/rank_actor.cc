#include "runtime/rank_actor.h"

#include <zmq.h>

#include <algorithm>
#include <cstring>

#include "core/tp_mapping.h"
#include "net/write_plan.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/thread_priority.h"

namespace kvrelay::runtime {

namespace {

RankConnectorOptions ConnectorOptions(const RankActorOptions& o) {
  RankConnectorOptions c;
  c.role = o.role;
  c.rank = o.rank;
  c.tp = o.tp;
  c.mode = o.mode;
  c.ApplyTimings(o.timings);
  c.send.num_workers = o.num_workers;
  return c;
}

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
      conn_(ConnectorOptions(options)),
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
  next_heartbeat_ = MonoNow();
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
  const Instant now = MonoNow();
  for (const LoadOp& l : meta.loads) {
    transfer_of_request_[l.request] = l.transfer;
    load_started_[l.transfer] = now;
  }
  conn_.ApplyMetadata(meta, now);
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
        if (const SendTable* t = conn_.send_table()) {
          s.sends = t->Sends();
          s.send_stats = t->stats();
          s.writes_in_flight = t->writes_in_flight();
          s.queued_for_sender = t->queued_for_sender();
          s.tombstones = t->tombstones();
        }
        if (const LoadTable* t = conn_.load_table()) {
          s.loads = t->Loads();
          s.load_stats = t->stats();
        }
        s.mode = conn_.mode();
        if (const LeaseTable* t = conn_.lease_table()) {
          s.leases = t->Leases();
          s.lease_stats = t->stats();
          s.tombstones = t->tombstones();
        }
        if (const ReadLoadTable* t = conn_.read_table()) {
          s.loads = t->Loads();
          s.read_stats = t->stats();
        }
        s.connector_stats = conn_.stats();
        for (const auto& [key, c] : conns_) {
          static const char* kNames[] = {"connecting", "up", "down", "gone"};
          s.peers.push_back(PeerView{c.engine, c.rank, c.peer, c.endpoint, kNames[c.state],
                                     c.known ? (s.now - c.last_heard).seconds() : 0});
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
    Instant wake = std::min(next_heartbeat_, ExpirePolledWrites(now));
    for (auto& w : polled_writes_) {
      if (w->over) continue;  // abandoned just now
      const short events = w->write->wants_write() ? ZMQ_POLLOUT : ZMQ_POLLIN;
      items.push_back(zmq_pollitem_t{nullptr, w->write->fd(), events, 0});
      polled.push_back({Polled::kWrite, nullptr, nullptr, w.get()});
    }
    if (auto d = conn_.NextDeadline()) wake = std::min(wake, *d);
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
    if (auto d = conn_.NextDeadline(); d && *d <= now) conn_.OnTimer(now);
    if (now >= next_heartbeat_) Heartbeat(now);
    Pump();
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
          ++counters_.malformed;
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
  ++counters_.frames_in;
  Result<WireMessage> decoded = DecodeWire({data, size}, options_.limits);
  if (!decoded.ok()) {
    ++counters_.malformed;
    if (std::optional<WireLimit> over = WireLimitOf(decoded.status())) {
      ++counters_.over_limit[static_cast<size_t>(*over)];
    }
    LogOnce("rank", "malformed:" + std::string(StatusCodeName(decoded.status().code())),
            "rank " + std::to_string(options_.rank) + ": dropped a malformed control frame: " +
                decoded.status().ToString());
    return;
  }
  const Instant now = MonoNow();
  WireMessage& m = *decoded;
  if (auto* hs = std::get_if<HandshakeMsg>(&m)) {
    if (identity != nullptr) {
      OnHandshakeFromD(*identity, *hs);
    } else {
      OnHandshakeFromP(*conn, *hs);
    }
    return;
  }
  if (std::holds_alternative<HeartbeatMsg>(m)) return;
  if (identity != nullptr) {
    // From a D rank: only pulls, only after a handshake.
    auto it = index_of_identity_.find(*identity);
    if (it == index_of_identity_.end()) {
      if (auth_.enabled()) {
        // Not proved (or never handshook): no answer, nothing learned.
        if (auto* pull = std::get_if<PullMsg>(&m)) {
          counters_.pulls_refused_unauthenticated += pull->items.size();
        }
      }
      ++counters_.unknown_sender;
      LogOnce("rank", "unknown_sender", "dropped a message from a D rank that never handshook");
      return;
    }
    const DPeer& d = dpeers_.at(it->second);
    if (auto* pull = std::get_if<PullMsg>(&m)) {
      // Destination blocks must lie inside the region this D rank
      // registered: refuse such an item now, before any table sees it.
      auto outside = [&d](const PullItem& item) {
        return std::any_of(item.dst.begin(), item.dst.end(),
                           [&d](const BlockId& b) { return b.index >= d.num_blocks; });
      };
      if (std::any_of(pull->items.begin(), pull->items.end(), outside)) {
        std::vector<PullItem> kept;
        for (PullItem& item : pull->items) {
          if (!outside(item)) {
            kept.push_back(std::move(item));
            continue;
          }
          ++counters_.pulls_refused_dst;
          LogOnce("rank", "dst_out_of_region",
                  "rank " + std::to_string(options_.rank) +
                      ": refused a pull naming blocks outside the region D registered");
          SendToD(*identity, EncodeWire(AnswerMsg{pull->pull_seq, item.transfer,
                                                  TransferResult::kRejected}));
        }
        pull->items = std::move(kept);
        if (pull->items.empty()) return;
      }
      conn_.OnMessage(d.peer, PeerMessage(std::move(*pull)), now);
    } else if (auto* lease = std::get_if<LeaseMsg>(&m)) {
      conn_.OnMessage(d.peer, PeerMessage(*lease), now);
    } else if (auto* notice = std::get_if<NoticeMsg>(&m)) {
      conn_.OnMessage(d.peer, PeerMessage(*notice), now);
    } else {
      ++counters_.malformed;  // an answer, grant or revoke sent to a P rank
    }
    return;
  }
  // From a P rank: answers.
  if (!conn->known) {
    ++counters_.unknown_sender;
    return;
  }
  if (auto* a = std::get_if<AnswerMsg>(&m)) {
    ++counters_.answers_received;
    auto it = pull_sent_.find({a->transfer, a->pull_seq});
    if (it != pull_sent_.end()) {
      if (sink_.pull_answer && !LoadTable::IsReleaseSeq(a->pull_seq)) {
        sink_.pull_answer(a->transfer, options_.rank, it->second.blocks,
                          (now - it->second.at).seconds(), a->result, now);
      }
      pull_sent_.erase(it);
    }
  }
  if (auto* a = std::get_if<AnswerMsg>(&m)) {
    conn_.OnMessage(conn->peer, PeerMessage(*a), now);
  } else if (auto* g = std::get_if<GrantMsg>(&m)) {
    conn_.OnMessage(conn->peer, PeerMessage(std::move(*g)), now);
  } else if (auto* r = std::get_if<RevokeMsg>(&m)) {
    conn_.OnMessage(conn->peer, PeerMessage(*r), now);
  } else {
    ++counters_.malformed;  // a pull, heartbeat or notice sent to a D rank
  }
}

void RankActor::NotifyKnown() {
  MutexLock lock(&known_mu_);
  for (const auto& [key, c] : conns_) {
    if (c.known && c.state == Conn::kUp) known_.insert(key);
  }
  known_cv_.NotifyAll();
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
  c.same_host = SameHost(host);
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
  const int ping_ms = static_cast<int>(options_.heartbeat.millis());
  const int ping_timeout_ms = static_cast<int>(options_.peer_down_after.millis());
  const int connect_timeout_ms = 1000;
  zmq_setsockopt(c.sock, ZMQ_HEARTBEAT_IVL, &ping_ms, sizeof ping_ms);
  zmq_setsockopt(c.sock, ZMQ_HEARTBEAT_TIMEOUT, &ping_timeout_ms, sizeof ping_timeout_ms);
  zmq_setsockopt(c.sock, ZMQ_CONNECT_TIMEOUT, &connect_timeout_ms, sizeof connect_timeout_ms);
  if (zmq_connect(c.sock, c.endpoint.c_str()) != 0) {
    Log("rank", "cannot connect to %s: %s", c.endpoint.c_str(), zmq_strerror(zmq_errno()));
  }
  OpenLane(c);
  SendToP(c, HelloFor(c));
  return c;
}

void RankActor::Heartbeat(Instant now) {
  next_heartbeat_ = now + options_.heartbeat;
  CloseUnattachedLanes(now);
  if (conns_.empty()) return;
  for (auto& [key, c] : conns_) {
    SendToP(c, HelloFor(c));
    if (!c.known) continue;
    CheckLanePeerGone(key, c, now);
    const Duration silent = now - c.last_heard;
    if (c.state == Conn::kUp && silent > options_.peer_down_after) {
      c.state = Conn::kDown;
      ++counters_.peers_down;
      Log("rank", "P %s silent for %.1f s: down", c.endpoint.c_str(), silent.seconds());
    }
    if (c.state == Conn::kDown && silent > options_.peer_dead_after) {
      char why[64];
      std::snprintf(why, sizeof why, "silent for %.1f s", silent.seconds());
      DeclareGone(key, c, now, why);
    }
  }
}

void RankActor::CheckLanePeerGone(const ConnKey& key, Conn& c, Instant now) {
  if (c.closed_lane_pid == 0 || !ProcessGone(c.closed_lane_pid)) return;
  c.closed_lane_pid = 0;
  DeclareGone(key, c, now, "exited (its local lane closed, its process is gone)");
}

// The one place a P incarnation is declared gone: its loads fail now (and
// recompute or fail by policy), and a new request naming this engine must
// see a live handshake first.
void RankActor::DeclareGone(const ConnKey& key, Conn& c, Instant now, const std::string& why) {
  if (!c.known || c.state == Conn::kGone) return;
  c.state = Conn::kGone;
  ++counters_.peers_gone;
  Log("rank", "P %s %s: gone; its loads fail now", c.endpoint.c_str(), why.c_str());
  conn_.PeerGone(c.peer, now);
  MutexLock lock(&known_mu_);
  known_.erase(key);
}

bool RankActor::SendFrame(void* sock, const std::string* identity,
                          const std::vector<uint8_t>& frame) {
  if (identity != nullptr &&
      zmq_send(sock, identity->data(), identity->size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
    ++counters_.unroutable;
    return false;
  }
  if (zmq_send(sock, frame.data(), frame.size(), ZMQ_DONTWAIT) < 0) {
    ++counters_.unroutable;
    return false;
  }
  ++counters_.frames_out;
  return true;
}

// --- actions -----------------------------------------------------------------

void RankActor::Pump() {
  for (int round = 0; round < 64; ++round) {
    while (auto a = conn_.PollAction()) {
      if (auto* out = std::get_if<OutMessage>(&*a)) {
        SendOut(std::move(*out));
      } else if (auto* read = std::get_if<StartRead>(&*a)) {
        StartReadJob(std::move(*read));
      } else {
        StartWriteJob(std::move(std::get<StartWrite>(*a)));
      }
    }
    if (deferred_write_done_.empty() && deferred_read_done_.empty()) break;
    const Instant now = MonoNow();
    auto done = std::move(deferred_write_done_);
    deferred_write_done_.clear();
    for (auto& [w, ok] : done) conn_.OnWriteDone(w, ok, now);
    auto read_done = std::move(deferred_read_done_);
    deferred_read_done_.clear();
    for (auto& [r, ok] : read_done) conn_.OnReadDone(r, ok, now);
  }
  if (conn_.HasReport()) {
    RankReport r = conn_.GetFinished();
    const Instant now = MonoNow();
    auto revoke = [&](TransferId t) {
      auto g = granted_.find(t);
      if (g != granted_.end()) {
        region_->grants().Revoke(t, g->second);
        granted_.erase(g);
      }
    };
    auto forget_pulls = [&](TransferId t) {
      pull_sent_.erase(pull_sent_.lower_bound({t, 0}), pull_sent_.upper_bound({t, UINT64_MAX}));
    };
    for (const LoadDone& d : r.finished_recving) {
      revoke(d.transfer);
      forget_pulls(d.transfer);
      transfer_of_request_.erase(d.request);
      auto it = load_started_.find(d.transfer);
      if (it != load_started_.end()) {
        if (sink_.transfer) sink_.transfer((now - it->second).seconds(), d.ok);
        load_started_.erase(it);
      }
    }
    for (const TransferId& t : r.finished_sending) {
      // Read mode: the lease ended; tcp serves no more reads of it.
      auto g = read_granted_.find(t);
      if (g != read_granted_.end()) {
        region_->read_grants().RevokeAll(t);
        read_granted_.erase(g);
      }
    }
    for (const RequestId& id : r.released) {
      auto it = transfer_of_request_.find(id);
      if (it != transfer_of_request_.end()) {
        revoke(it->second);
        forget_pulls(it->second);
        load_started_.erase(it->second);
        transfer_of_request_.erase(it);
      }
    }
    engine_->PostReport(options_.rank, std::move(r));
  }
}

void RankActor::SendOut(OutMessage out) {
  if (auto* pull = std::get_if<PullMsg>(&out.msg)) {
    // D → P.
    const PeerAddress to = PeerAddress::Of(out.to);
    const uint32_t engine = to.engine, rank = to.rank;
    auto it = conns_.find({engine, rank});
    if (it == conns_.end() || !it->second.known || it->second.peer != out.to) {
      ++counters_.unroutable;  // that P incarnation is gone; the core knows
      return;
    }
    const Instant now = MonoNow();
    for (const PullItem& item : pull->items) {
      if (item.dst.empty()) {
        auto g = granted_.find(item.transfer);
        if (g != granted_.end()) {
          region_->grants().Revoke(item.transfer, g->second);
          granted_.erase(g);
        }
        continue;
      }
      std::vector<uint32_t> blocks;
      blocks.reserve(item.dst.size());
      for (const BlockId& b : item.dst) blocks.push_back(b.index);
      region_->grants().Grant(item.transfer, blocks);
      granted_[item.transfer] = std::move(blocks);
      pull_sent_.try_emplace({item.transfer, pull->pull_seq},
                             PullSent{now, static_cast<uint32_t>(item.dst.size())});
      ++counters_.pulls_sent;
    }
    SendToP(it->second, EncodeWire(*pull));
    return;
  }
  if (std::holds_alternative<LeaseMsg>(out.msg) || std::holds_alternative<NoticeMsg>(out.msg)) {
    // D → P, read mode.
    const PeerAddress to = PeerAddress::Of(out.to);
    auto it = conns_.find({to.engine, to.rank});
    if (it == conns_.end() || !it->second.known || it->second.peer != out.to) {
      ++counters_.unroutable;
      return;
    }
    SendToP(it->second, std::holds_alternative<LeaseMsg>(out.msg)
                  ? EncodeWire(std::get<LeaseMsg>(out.msg))
                  : EncodeWire(std::get<NoticeMsg>(out.msg)));
    return;
  }
  // P → D: an answer, a grant or a revoke.
  auto it = dpeers_.find(out.to.index);
  if (it == dpeers_.end() || it->second.peer != out.to) {
    ++counters_.unroutable;
    return;
  }
  if (auto* g = std::get_if<GrantMsg>(&out.msg)) {
    if (g->answer == LeaseAnswer::kGranted && read_granted_.count(g->transfer) == 0) {
      std::vector<uint32_t> blocks;
      blocks.reserve(g->src.size());
      for (const BlockId& b : g->src) blocks.push_back(b.index);
      region_->read_grants().Grant(g->transfer, blocks);
      read_granted_.emplace(g->transfer, std::move(blocks));
    }
    SendToD(it->second.identity, EncodeWire(*g));
  } else if (auto* r = std::get_if<RevokeMsg>(&out.msg)) {
    SendToD(it->second.identity, EncodeWire(*r));
  } else {
    SendToD(it->second.identity, EncodeWire(std::get<AnswerMsg>(out.msg)));
  }
}

}  // namespace kvrelay::runtime
