#include "runtime/rank_actor.h"

#include <zmq.h>

#include <algorithm>
#include <latch>

#include "core/tp_mapping.h"
#include "os/clock.h"
#include "os/log.h"
#include "os/thread_priority.h"

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
      session_(SessionOptionsFor(options, transport->kind(), region->registration())),
      inbox_(65536),
      writers_(std::make_unique<WriterPool>(options.num_workers,
                                            size_t{options.num_workers} * 4)),
      lanes_(options.rank, LaneLimitsFor(options), options.timings.peer_down_after, &counters_,
             &driver_malformed_) {}

RankActor::~RankActor() { Stop(); }

Status RankActor::Start() {
  if (options_.role != ConnectorRole::kConsumer) {
    const std::string ep = Endpoint(options_.listen_host, options_.ctrl_port + options_.rank);
    Result<void*> router = BindRouter(zmq_, ep, ZmqLimits());
    if (!router.ok()) {
      return Status(router.status().code(),
                    "rank " + std::to_string(options_.rank) + ": " + router.status().message());
    }
    router_ = *router;
    if (options_.local_lane) {
      lanes_.Listen(LaneAddress(options_.engine_id, options_.rank,
                                options_.ctrl_port + options_.rank));
    }
  }
  next_chores_ = MonoNow();
  // Start returns once the thread has its name, nice value and slice.
  std::latch set_up(1);
  thread_ = std::thread([this, &set_up] {
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
    set_up.count_down();
    Loop();
  });
  set_up.wait();
  return Status::Ok();
}

void RankActor::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  inbox_.Kick();
  thread_.join();
  inbox_.Close();  // writers finishing now post nothing
  // What was posted after the loop's last look is dropped, not left queued:
  // a caller waiting on a closure's promise (State) sees it broken now
  // instead of waiting out its timeout (which held an engine's exit 10 s).
  std::deque<Inbox::Fn> dropped;
  inbox_.Take(&dropped);
  dropped.clear();
  writers_->Stop();
}

void RankActor::PostMetadata(const ConnectorMetadata& meta) {
  inbox_.Post([this, meta] { session_.ApplyMetadata(meta, MonoNow()); });
}

bool RankActor::TryPostMetadata(const ConnectorMetadata& meta) {
  const Instant posted = MonoNow();
  return inbox_.TryPost([this, meta, posted] {
    if (sink_.posted_to_applied) sink_.posted_to_applied((MonoNow() - posted).seconds());
    session_.ApplyMetadata(meta, MonoNow());
  });
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
  // The closure owns the promise: dropped unrun (the actor stopped), it
  // breaks the future at once.
  auto p = std::make_shared<std::promise<RankState>>();
  auto f = p->get_future();
  if (!inbox_.Post([this, p = std::move(p)] {
        RankState s = StateOf(session_, options_.rank, MonoNow(), [this](uint32_t e, uint32_t r) {
          auto c = conns_.find({e, r});
          return c == conns_.end() ? std::string() : c->second.endpoint;
        });
        p->set_value(std::move(s));
      })) {
    return std::nullopt;
  }
  if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) return std::nullopt;
  try {
    return f.get();
  } catch (const std::future_error&) {  // broken: the actor stopped first
    return std::nullopt;
  }
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
    size_t write = 0;  // kWrite: the index PolledWrites::Prepare gave it
  };
  std::vector<Entry> polled;
  auto lane_events = [](const LocalLane& l) {
    return static_cast<short>(ZMQ_POLLIN | (l.wants_write() ? ZMQ_POLLOUT : 0));
  };
  while (!stop_) {
    items.clear();
    polled.clear();
    items.push_back(zmq_pollitem_t{nullptr, inbox_.fd(), ZMQ_POLLIN, 0});
    bool buffered = false;  // a lane holds a whole frame it did not deliver
    if (router_ != nullptr) {
      items.push_back(zmq_pollitem_t{router_, 0, ZMQ_POLLIN, 0});
      polled.push_back({Polled::kRouter});
    }
    if (lanes_.listener_fd() >= 0) {
      items.push_back(zmq_pollitem_t{nullptr, lanes_.listener_fd(), ZMQ_POLLIN, 0});
      polled.push_back({Polled::kListener});
    }
    for (auto& l : lanes_.lanes()) {
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
    const size_t first_write = items.size();
    Instant wake = std::min(next_chores_, polled_.Prepare(now, &items));
    for (size_t i = first_write; i < items.size(); ++i) {
      polled.push_back({Polled::kWrite, nullptr, nullptr, i - first_write});
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
          if (ev & ZMQ_POLLIN) {
            driver_malformed_ += DrainRouter(router_, [this](const std::string& id,
                                                             const uint8_t* data, size_t size) {
              OnFrame(&id, nullptr, data, size);
            });
          }
          break;
        case Polled::kListener:
          if (ev & ZMQ_POLLIN) lanes_.Accept(MonoNow());
          break;
        case Polled::kDLane:
          if (ev & ZMQ_POLLOUT) e.lane->Flush();
          if ((ev & (ZMQ_POLLIN | ZMQ_POLLERR)) || e.lane->has_buffered_frame()) {
            lanes_.Read(*e.lane, [this](const std::string& id, const uint8_t* data,
                                        size_t size) { OnFrame(&id, nullptr, data, size); });
          }
          break;
        case Polled::kDealer:
          if (ev & ZMQ_POLLIN) {
            Conn& c = *e.conn;
            DrainDealer(c.sock, [this, &c](const uint8_t* data, size_t size) {
              OnFrame(nullptr, &c, data, size);
            });
          }
          break;
        case Polled::kWrite:
          if (ev != 0) polled_.Progress(e.write);  // POLLERR/POLLHUP too: it finds out
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
    Publish(session_.stats(), driver_malformed_, send_failures_, &counters_);
  }
  // Shutdown: say goodbye to nothing; close the sockets (linger 0). A
  // write still waiting for its reply ends failed (its stream is closed).
  polled_.Clear();
  for (auto& [key, c] : conns_) zmq_close(c.sock);
  conns_.clear();
  lanes_.Clear();
  if (router_ != nullptr) zmq_close(router_);
  router_ = nullptr;
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
  // ZMTP pings drop a connection silent for peer_down_after (a partition):
  // ZeroMQ reconnects, rather than wait out TCP's retransmission backoff.
  c.sock = ConnectDealer(zmq_, c.endpoint, RoutingId(), options_.timings.heartbeat,
                         options_.timings.peer_down_after, ZmqLimits());
  session_.Connect(engine, rank, c.same_host, MonoNow());
  return c;
}

void RankActor::Chores(Instant now) {
  next_chores_ = now + options_.timings.heartbeat;
  lanes_.CloseUnattached(now);
  for (auto& [key, c] : conns_) CheckLanePeerGone(c, now);
}

void RankActor::CheckLanePeerGone(Conn& c, Instant now) {
  if (c.closed_lane_pid == 0 || !ProcessGone(c.closed_lane_pid)) return;
  c.closed_lane_pid = 0;
  session_.OnLaneClosed(c.engine, c.rank, /*process_gone=*/true, now);
}

bool RankActor::SendFrame(void* sock, const std::string* identity,
                          const std::vector<uint8_t>& frame) {
  if (!SendZmqFrame(sock, identity, frame)) {
    ++send_failures_;
    return false;
  }
  ++counters_.frames_out;
  return true;
}

ZmqSocketLimits RankActor::ZmqLimits() const {
  return ZmqSocketLimits{options_.socket_hwm, int64_t{options_.limits.max_frame_bytes}};
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

}  // namespace kvrelay::runtime
