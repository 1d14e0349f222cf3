// chaos_verdict.cc — the end conditions of a fault case (see the header).
#include "bench/chaos_verdict.h"

#include <cstdio>

namespace kvrelay {

namespace {
std::string Fmt(const char* f, double a, double b) {
  char buf[128];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}
}  // namespace

std::string ChaosVerdict::Text() const {
  switch (kind) {
    case Kind::kPass: return "PASS";
    case Kind::kFail: return "FAIL";
    case Kind::kSkipped: return "SKIPPED";
  }
  return "FAIL";
}

ChaosVerdict JudgeChaos(const ChaosMeasure& m, const ChaosBounds& b) {
  ChaosVerdict v;
  if (!m.skipped.empty()) {
    v.kind = ChaosVerdict::Kind::kSkipped;
    v.why.push_back(m.skipped);
    return v;
  }
  if (!m.setup_error.empty()) v.why.push_back("setup: " + m.setup_error);
  if (!m.shutdown_error.empty()) v.why.push_back("shutdown: " + m.shutdown_error);
  const LoadReport& r = m.load;
  const uint32_t cut_ok = m.cut_off_allowed ? r.cut_off : 0;
  v.failed = r.failed - cut_ok;
  v.affected = r.clean_errors + r.disconnected + cut_ok;
  if (r.requests == 0) v.why.push_back("no request was sent");
  if (v.failed != 0) {
    std::string w = std::to_string(v.failed) + " requests ended neither with output nor cleanly";
    if (!r.failures.empty()) w += " (" + r.failures.front() + ")";
    v.why.push_back(w);
  }
  if (r.probes_ok != r.probes) {  // 0 probes: the case measures serving by recovery only
    v.why.push_back("final probes: " + std::to_string(r.probes_ok) + "/" +
                    std::to_string(r.probes) + " correct");
  }
  if (m.engines.empty()) v.why.push_back("no engine state");
  for (const EngineEnd& e : m.engines) {
    if (!e.reachable) {
      v.why.push_back(e.name + " unreachable at the end");
      v.blocks_leaked = v.blocks_leaked < 0 ? v.blocks_leaked : -1;
      continue;
    }
    if (v.blocks_leaked >= 0 && e.blocks_used > 0) v.blocks_leaked += e.blocks_used;
    if (e.blocks_used != 0) {
      v.why.push_back(e.name + ": " + std::to_string(e.blocks_used) + " blocks leaked");
    }
    if (!e.idle || e.live_sends != 0 || e.live_loads != 0 || e.live_leases != 0) {
      v.why.push_back(e.name + " not idle (" + std::to_string(e.live_sends) + " sends, " +
                      std::to_string(e.live_loads) + " loads, " +
                      std::to_string(e.live_leases) + " leases live)");
    }
    if (e.max_load_age_s > b.load_bound_s) {
      v.why.push_back(e.name + Fmt(": a load lived %.1f s, bound %.1f s", e.max_load_age_s,
                                   b.load_bound_s));
    }
    if (e.max_send_age_s > b.send_bound_s) {
      v.why.push_back(e.name + Fmt(": a send lived %.1f s, bound %.1f s", e.max_send_age_s,
                                   b.send_bound_s));
    }
    if (b.lease_bound_s > 0 && e.max_lease_age_s > b.lease_bound_s) {
      v.why.push_back(e.name + Fmt(": a lease was held %.1f s, bound %.1f s", e.max_lease_age_s,
                                   b.lease_bound_s));
    }
    if (e.prefill && e.pulls_answered != e.pulls_received) {
      v.why.push_back(e.name + ": " + std::to_string(e.pulls_received) +
                      " pull items received, " + std::to_string(e.pulls_answered) + " answered");
    }
  }
  if (m.recover_expected) {
    if (m.recover_s < 0) {
      v.why.push_back("never served again after the fault");
    } else if (m.recover_s > b.recover_bound_s) {
      v.why.push_back(Fmt("recovered in %.1f s, bound %.1f s", m.recover_s, b.recover_bound_s));
    }
  }
  v.kind = v.why.empty() ? ChaosVerdict::Kind::kPass : ChaosVerdict::Kind::kFail;
  return v;
}

}  // namespace kvrelay
