// sim_checks.cc — the simulator's checker: the invariants of lifecycle.md
// after every event, the drained state a run must reach, the prompt drain
// of a matrix case, and how soon a dead P's loads must have ended.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"
#include "core/tp_mapping.h"
#include "sim/simulator.h"

namespace kvrelay::sim {

void Simulator::Violation(const std::string& what) {
  if (!result_.ok) return;
  result_.ok = false;
  char at[64];
  std::snprintf(at, sizeof at, "t=%.6fs: ", now_.seconds());
  result_.failure = at + what;
}

void Simulator::CheckAll() {
  for (const Node& node : nodes_) {
    node.engine->CheckInvariants();
    for (const auto& session : node.ranks) {
      session->CheckInvariants();
      const RankConnector* rank = &session->connector();
      // Read mode: P holds KV no longer than its lease (plus a timer that
      // runs late) — not the abort timeout, whatever D does. (A process
      // that died, waiting for its restart, holds nothing.)
      if (const LeaseTable* l = rank->lease_table(); l != nullptr && node.alive) {
        for (const LeaseView& v : l->Leases()) {
          if (v.state != LeaseState::kWaiting && now_ > v.until + params_.timer_late_max) {
            Violation("P held the KV of transfer " + v.transfer.ToString() +
                      " past its lease (" + LeaseStateName(v.state) + ")");
            return;
          }
        }
      }
    }
  }
}

void Simulator::CheckDrained() {
  for (uint32_t i = 0; i < clients_.size(); ++i) {
    const Client& c = clients_[i];
    if (!c.p_ended || !c.d_ended) {
      Violation("liveness: request " + std::to_string(i) + " never ended (P leg " +
                (c.p_ended ? "ended" : "open") + ", D leg " +
                (c.d_ended ? "ended" : "open") + ")");
      return;
    }
  }
  for (uint32_t e = 0; e < nodes_.size(); ++e) {
    const Node& node = nodes_[e];
    const std::string name = "engine " + std::to_string(e);
    if (!node.engine->Idle()) Violation(name + " not idle at the end");
    if (node.engine->pool().num_referenced() != 0) Violation(name + " leaked blocks");
    if (node.engine->state() != engine::EngineState::kActive) {
      Violation(name + " not active at the end");
    }
    for (const auto& session : node.ranks) {
      const RankConnector* rank = &session->connector();
      if (const SendTable* s = rank->send_table()) {
        if (s->live_sends() != 0 || s->live_pull_items() != 0 || s->writes_in_flight() != 0) {
          Violation(name + " send table not empty at the end");
        }
      }
      if (const LoadTable* l = rank->load_table()) {
        if (l->live_loads() != 0) Violation(name + " load table not empty at the end");
      }
      if (const LeaseTable* l = rank->lease_table()) {
        if (l->live_leases() != 0) Violation(name + " lease table not empty at the end");
      }
      if (const ReadLoadTable* l = rank->read_table()) {
        if (l->live_loads() != 0 || l->reads_in_flight() != 0) {
          Violation(name + " read-load table not empty at the end");
        }
      }
    }
  }
  for (const Write& w : writes_) {
    if (w.used) Violation("a write never completed");
  }
  for (const Read& r : reads_) {
    if (r.used) Violation("a read never completed");
  }
  // Every pull item a live P incarnation accepted was answered (a crashed
  // incarnation's pending pulls died with it; D gives up on those), unless
  // the D process that sent it died: P has nobody to answer.
  for (const auto& [key, rec] : pull_answers_) {
    if (rec.answers == 0 && nodes_[rec.p_engine].incarnation == rec.p_incarnation &&
        nodes_[rec.d_engine].incarnation == rec.d_incarnation) {
      char at[48];
      std::snprintf(at, sizeof at, "%.6f", rec.received.seconds());
      Violation(std::string("a pull received by engine ") + std::to_string(rec.p_engine) +
                " at t=" + at + " s was never answered");
      return;
    }
  }
}

// kPromptDrain after the last request of a matrix case ended, every block
// must be back: what still holds one is a send, lease or load waiting for a
// timeout (abort_timeout is 480 s), the leak lifecycle.md forbids.
void Simulator::CheckPromptDrain() {
  for (uint32_t e = 0; e < nodes_.size(); ++e) {
    const size_t held = nodes_[e].engine->pool().num_referenced();
    if (held != 0) {
      Violation("engine " + std::to_string(e) + " still holds " + std::to_string(held) +
                " blocks " + std::to_string(kPromptDrain.seconds()) +
                " s after the last request ended (a transfer waits for a timeout)");
      return;
    }
  }
}

// A P incarnation that died is found out: at once by a D rank whose lane
// to it closed, else by its successor's reply or by silence — within
// peer_dead_after of the first unanswered hello. A load of D rank (d, dr)
// still waiting on it after that is the wedge rule 8 forbids.
void Simulator::CheckDeadProducers(uint32_t d, uint32_t dr) {
  const RankConnector& conn = nodes_[d].ranks[dr]->connector();
  std::vector<LoadView> loads;
  if (const LoadTable* t = conn.load_table()) loads = t->Loads();
  if (const ReadLoadTable* t = conn.read_table()) loads = t->Loads();
  for (const LoadView& load : loads) {
    for (const PeerId& peer : load.waiting_on) {
      const PeerAddress at = PeerAddress::Of(peer);
      auto death = deaths_.find({at.engine, at.incarnation});
      if (death == deaths_.end()) continue;
      const bool lane = death->second.lanes.count({d, dr}) != 0;
      // Found out by silence only: without grant checks that fails no load
      // in flight (they end at their give-up time, as liveness checks).
      if (!lane && !params_.grants_checked) continue;
      const Duration slack = params_.timer_late_max * 2 + params_.net_delay_max * 2 +
                             params_.write_time_max + Duration::Milliseconds(3);
      const Duration bound =
          lane ? slack : params_.timings.peer_dead_after + params_.timings.heartbeat * 2 + slack;
      const Instant since = std::max(death->second.at, load.started);
      if (now_ > since + bound) {
        Violation("a load of transfer " + load.transfer.ToString() + " on D " +
                  std::to_string(d) + "/" + std::to_string(dr) + " still waits on P " +
                  std::to_string(at.engine) + "/" + std::to_string(at.rank) + " incarnation " +
                  std::to_string(at.incarnation) + ", dead since t=" +
                  std::to_string(death->second.at.seconds()) + " s" +
                  (lane ? " (its lane closed)" : ""));
        return;
      }
    }
  }
}

}  // namespace kvrelay::sim
