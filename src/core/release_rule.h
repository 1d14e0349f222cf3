// release_rule.h — when the router tells P to end a request's transfer
// (POST /kv_release): one rule for the router (RelayLogic) and for the
// simulator's model of the router.
//
// Why: P holds a finished prefill's blocks until D pulls them, D releases
// them, or P's --abort-timeout-s passes. A request that failed after P's leg
// ended (D crashed before it pulled, D's leg failed, the client left while D
// waited) will never be pulled through; without a release P would hold the
// blocks for the whole timeout. The rule decides this from the request's
// verdict, so the runtime and the simulator cannot drift apart: a mutant of it
// is caught by both.
//
// Pure: a value in, a value out; any thread.
#pragma once

#include <cstdint>

namespace kvrelay {

// The router's verdict on a request so far. The first decisive event sets it
// and later ones leave it (RelayLogic's "first decisive event wins").
enum class RequestVerdict : uint8_t {
  kOpen,        // nothing decisive yet (P's leg ending well decides nothing)
  kSucceeded,   // D answered in full
  kFailed,      // a leg failed or was aborted, the client left, its wait expired
  kShutdown,    // the router stops: it cancels D's leg, and D releases itself
  kRejected,    // refused before either leg started: no transfer exists
};

// True once the router should release P's transfer; callers send it once.
// `p_leg_over`: P's leg has ended. `p_accepted`: P took the leg (answered 200,
// or was cut off after it admitted the request). A P that refused the leg
// holds nothing of it, and its transfer id may be another request's (a 409
// for a duplicate id), whose hand-off a release would end.
constexpr bool RouterReleasesPrefill(bool p_leg_over, bool p_accepted,
                                     RequestVerdict verdict) {
  return p_leg_over && p_accepted && verdict == RequestVerdict::kFailed;
}

}  // namespace kvrelay
