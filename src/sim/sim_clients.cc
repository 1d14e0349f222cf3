// sim_clients.cc — the simulator's clients: each request's two legs sent at
// once (D's may arrive first), aborts and disconnects at any moment, the
// router's rule that a failed leg cancels the other, the P server's fast
// abort, and the check that every token a leg got is the model's.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"
#include "core/tp_mapping.h"
#include "sim/simulator.h"

namespace kvrelay::sim {

void Simulator::ClientArrive(uint32_t i) {
  Client& c = clients_[i];
  const uint32_t np = static_cast<uint32_t>(params_.p_tp.size());
  const uint32_t nd = static_cast<uint32_t>(params_.d_tp.size());
  c.p = static_cast<uint32_t>(prng_.Uniform(np));
  c.d = np + static_cast<uint32_t>(prng_.Uniform(nd));
  const uint32_t len = static_cast<uint32_t>(
      prng_.Range(1, params_.max_prompt_blocks * shape_.block_tokens));
  // Prompts share prefixes now and then, so the prefix cache is exercised.
  if (i > 0 && prng_.OneIn(4)) {
    const Client& other = clients_[prng_.Uniform(i)];
    c.prompt.assign(other.prompt.begin(),
                    other.prompt.begin() + std::min<size_t>(other.prompt.size(), len));
  }
  while (c.prompt.size() < len) {
    c.prompt.push_back(static_cast<engine::Token>(prng_.Uniform(shape_.vocab)));
  }
  c.max_tokens = static_cast<uint32_t>(prng_.Range(1, params_.max_output_tokens));

  // Now and then two routers pick the same transfer_id (or one router has a
  // bug): it collides with a recent, likely live request on the same P.
  if (i > 0 && prng_.Chance(params_.duplicate_id_pm, 1000)) {
    const Client& orig = clients_[i - 1 - prng_.Uniform(std::min<uint32_t>(i, 4))];
    c.transfer = orig.transfer;
    c.p = orig.p;
  } else {
    c.transfer = TransferId{prng_.Next64(), prng_.Next64()};
  }
  // Both legs at once, each with its own delay: D may see it first.
  const Instant p_at = now_ + NetDelay(), d_at = now_ + NetDelay();
  c.p_last = p_at;
  c.d_last = d_at;
  queue_.Push(Event{p_at, 0, EventKind::kLegArrive, i, c.p, 0, nodes_[c.p].incarnation});
  queue_.Push(Event{d_at, 0, EventKind::kLegArrive, i, c.d, 0, nodes_[c.d].incarnation});
  const bool probe = i >= first_probe_;
  if (!probe && prng_.Chance(params_.client_abort_pm, 1000)) {
    // Within a request's likely life: a few engine steps per token.
    const Duration life = params_.step_time * (params_.max_output_tokens + 8) +
                          params_.net_delay_max * 4;
    const Instant at = std::max(p_at, d_at) +
                       Duration::Nanoseconds(static_cast<int64_t>(prng_.Uniform(life.ns())));
    queue_.Push(Event{at, 0, EventKind::kClientAbort, i});
  }
  if (faults_on()) MaybeInjectFault();
}

void Simulator::ClientAbort(uint32_t i) {
  Client& c = clients_[i];
  if (c.abort_sent) return;
  c.abort_sent = true;
  SendAbort(i, c.p);
  SendAbort(i, c.d);
}

// Client → engine traffic is one HTTP connection per leg: FIFO, so an abort
// never overtakes the leg it cancels.
Duration Simulator::NetDelay() {
  return params_.net_delay_min +
         Duration::Nanoseconds(static_cast<int64_t>(
             prng_.Uniform((params_.net_delay_max - params_.net_delay_min).ns() + 1)));
}

void Simulator::SendAbort(uint32_t request, uint32_t engine, Duration extra) {
  Client& c = clients_[request];
  Instant& last = engine == c.p ? c.p_last : c.d_last;
  const Instant at =
      std::max(now_ + extra + params_.net_delay_min, last + Duration::Nanoseconds(1));
  last = at;
  queue_.Push(Event{at, 0, EventKind::kAbortArrive, request, engine, 0,
                    nodes_[engine].incarnation});
}

void Simulator::FastAbort(uint32_t request, uint32_t engine) {
  const Client& c = clients_[request];
  if (engine != c.p || !c.p_admitted || c.p_ended) return;  // the server knows no transfer
  if (!prng_.Chance(params_.fast_abort_pm, 1000)) return;
  Node& node = nodes_[engine];
  for (uint32_t r = 0; r < node.tp; ++r) {
    if (prng_.OneIn(2)) {
      RankAbort(request, engine, r);  // before the engine's own abort
    } else {
      const Duration later = Duration::Nanoseconds(static_cast<int64_t>(
          prng_.Uniform(static_cast<uint64_t>((params_.step_time * 2).ns()) + 1)));
      queue_.Push(Event{now_ + later, 0, EventKind::kRankAbort, request, engine, r,
                        node.incarnation});
    }
  }
}

void Simulator::RankAbort(uint32_t request, uint32_t engine, uint32_t rank) {
  const TransferId t = clients_[request].transfer;
  RankSession& session = *nodes_[engine].ranks[rank];
  const RankConnector& rc = session.connector();
  Hit(Mark::kFastAbort);
  if (const SendTable* st = rc.send_table()) {
    if (!st->StateOf(t) && !st->HasTombstone(t)) Hit(Mark::kFastAbortBeforeClaim);
  } else if (const LeaseTable* lt = rc.lease_table()) {
    if (!lt->StateOf(t) && !lt->HasTombstone(t)) Hit(Mark::kFastAbortBeforeClaim);
  }
  ConnectorMetadata meta;
  meta.aborts.push_back(AbortSendOp{t});
  session.ApplyMetadata(meta, now_);
  DrainRank(engine, rank);
}

// The router's release, by the rule it runs (core/release_rule.h). A P that
// refused the leg (a duplicate transfer id: an error status at the router)
// did not admit it: the transfer is not this request's to end.
void Simulator::MaybeRelease(uint32_t request) {
  Client& c = clients_[request];
  if (c.release_sent || !RouterReleasesPrefill(c.p_ended, c.p_admitted, c.verdict)) return;
  c.release_sent = true;
  queue_.Push(Event{now_ + NetDelay(), 0, EventKind::kRelease, request, c.p, 0,
                    nodes_[c.p].incarnation});
}

void Simulator::Release(uint32_t request, uint32_t engine) {
  const TransferId t = clients_[request].transfer;
  Node& node = nodes_[engine];
  Hit(Mark::kRouterRelease);
  for (uint32_t r = 0; r < node.tp; ++r) {
    RankSession& session = *node.ranks[r];
    const RankConnector& rc = session.connector();
    const SendTable* st = rc.send_table();
    const LeaseTable* lt = rc.lease_table();
    auto held = [&] {
      if (st != nullptr) {
        const std::optional<SendState> s = st->StateOf(t);
        return s && *s != SendState::kDone;
      }
      if (lt != nullptr) {
        const std::optional<LeaseState> s = lt->StateOf(t);
        return s && *s != LeaseState::kRevoking;
      }
      return false;
    };
    if (held()) Hit(Mark::kRouterReleaseEndedSend);
    ConnectorMetadata meta;
    meta.aborts.push_back(AbortSendOp{t});
    session.ApplyMetadata(meta, now_);
    DrainRank(engine, r);
    if (held()) {
      Violation("rank " + std::to_string(r) + " of P engine " + std::to_string(engine) +
                " still holds transfer " + t.ToString() + " after the router released it");
    }
  }
}

void Simulator::LegEnded(uint32_t engine, uint32_t request, LegOutcome outcome) {
  Client& c = clients_[request];
  if (nodes_[engine].producer) {
    if (c.p_ended) Violation("P leg of request " + std::to_string(request) + " ended twice");
    c.p_ended = true;
    // P's leg failing is decisive; its ending well decides nothing.
    if (outcome != LegOutcome::kOk && c.verdict == RequestVerdict::kOpen) {
      c.verdict = RequestVerdict::kFailed;
    }
    // The router: a failed P leg makes D release at once — once P's error
    // response has reached the router.
    if (outcome != LegOutcome::kOk && !c.d_ended) SendAbort(request, c.d, NetDelay());
  } else {
    if (c.d_ended) Violation("D leg of request " + std::to_string(request) + " ended twice");
    c.d_ended = true;
    c.outcome = outcome;
    if (c.verdict == RequestVerdict::kOpen) {
      c.verdict = outcome == LegOutcome::kOk ? RequestVerdict::kSucceeded : RequestVerdict::kFailed;
    }
    // ...and a D leg that fails makes P drop the request at once (while
    // P's leg is open: a cancel; after it, the release below).
    if (outcome != LegOutcome::kOk && !c.p_ended) SendAbort(request, c.p);
  }
  MaybeRelease(request);
  // A matrix case (no faults): once every request ended, nothing may hold
  // blocks for long — a transfer left waiting for a timeout would.
  if (params_.plan.enabled && !drain_check_armed_ && first_probe_ == UINT32_MAX &&
      clients_.size() == params_.num_requests) {
    for (const Client& k : clients_) {
      if (!k.p_ended || !k.d_ended) return;
    }
    drain_check_armed_ = true;
    queue_.Push(Event{now_ + kPromptDrain, 0, EventKind::kDrainCheck, 0, 0, 0, 0});
  }
}

// Every token a leg produced is what the model gives for its prompt, under
// the weights version it reports (invariant 8), and a finished leg produced
// all its tokens.
void Simulator::CheckTokens(uint32_t request, bool p_leg) {
  const Client& c = clients_[request];
  const auto& tokens = p_leg ? c.p_tokens : c.d_tokens;
  const std::string why = engine::CheckOutput(c.prompt, tokens, shape_);
  if (!why.empty()) {
    Violation("request " + std::to_string(request) + (p_leg ? " (P leg)" : " (D leg)") +
              ": " + why);
    return;
  }
  const size_t want = p_leg ? 1 : c.max_tokens;
  if (tokens.size() != want) {
    Violation("request " + std::to_string(request) + " finished with " +
              std::to_string(tokens.size()) + " tokens, wanted " + std::to_string(want));
  }
}

}  // namespace kvrelay::sim
