// transfer_result.h — how one (pull, transfer) was answered, and why a send
// ended. One enum serves both: a send that ended for reason R answers every
// pull still waiting on it with R. It crosses the wire, so values are fixed.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvrelay {

enum class TransferResult : uint8_t {
  kOk = 0,            // the KV landed in the pull's destination blocks
                      // (as an end reason: every D rank that needed it pulled)
  kReleased = 1,      // D released the transfer; nothing more will be sent
  kAborted = 2,       // P aborted the request, or abort_transfers() ran
  kExpired = 3,       // nobody pulled within abort_timeout of P being ready
  kWriteFailed = 4,   // a write of this transfer failed
  kDeadline = 5,      // the pull's deadline passed before a write could start
  kRejected = 6,      // the pull was malformed or over a limit
  kAlreadyPulled = 7, // a surplus pull: every D rank that needed it pulled
  kUnreachable = 8,   // D could not reach (or lost) the producer rank
  kReset = 9,         // P reset its cache and gave the finished request's KV
                      // back: D recomputes, whatever its failure policy
  kMismatch = 10,     // the KV is not the one D expects: another prompt's, or
                      // computed under other weights (a weight update landed
                      // on one side first); D recomputes, whatever its policy
};

inline constexpr int kTransferResultCount = 11;

std::string_view TransferResultName(TransferResult r);

// Answers that say nothing against the request or the transfer: P's cache
// reset took the KV back, or the KV offered is not this request's. A load
// with one recomputes whatever kv_load_failure_policy says.
bool RecomputeAnyway(TransferResult r);

// True if any of a load's `producers` (records with a `result`) answered
// so: the load is cut short, not failed.
template <typename Producers>
bool AnyProducerCutShort(const Producers& producers) {
  for (const auto& p : producers) {
    if (RecomputeAnyway(p.result)) return true;
  }
  return false;
}

}  // namespace kvrelay
