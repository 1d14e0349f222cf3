#include "runtime/rank_state.h"

namespace kvrelay::runtime {

RankState StateOf(const RankSession& session, uint32_t rank, Instant now,
                  const std::function<std::string(uint32_t, uint32_t)>& endpoint) {
  RankState s;
  s.rank = rank;
  s.now = now;
  const RankConnector& conn = session.connector();
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
  for (const auto& [key, p] : session.producers()) {
    s.peers.push_back(PeerView{p.engine, p.rank, p.peer, endpoint(p.engine, p.rank),
                               ProducerStateName(p.state),
                               p.known ? (now - p.last_heard).seconds() : 0});
  }
  return s;
}

void Publish(const RankSessionStats& s, uint64_t driver_malformed, uint64_t send_failures,
             RankCounters* out) {
  auto set = [](std::atomic<uint64_t>& to, uint64_t v) { to.store(v, std::memory_order_relaxed); };
  set(out->frames_in, s.frames_in);
  set(out->malformed, s.malformed + driver_malformed);
  for (int i = 0; i < kWireLimitCount; ++i) set(out->over_limit[i], s.over_limit[i]);
  set(out->unknown_sender, s.unknown_sender);
  set(out->handshake_refused, s.handshake_refused);
  set(out->unroutable, s.unroutable + send_failures);
  set(out->handshakes, s.handshakes);
  set(out->peers_down, s.peers_down);
  set(out->peers_gone, s.peers_gone);
  set(out->reconnects, s.reconnects);
  set(out->pulls_sent, s.pulls_sent);
  set(out->answers_received, s.answers_received);
  set(out->auth_failed, s.auth_failed);
  set(out->pulls_refused_unauthenticated, s.pulls_refused_unauthenticated);
  set(out->pulls_refused_dst, s.pulls_refused_dst);
  set(out->pulls_misaddressed, s.pulls_misaddressed);
}

}  // namespace kvrelay::runtime
