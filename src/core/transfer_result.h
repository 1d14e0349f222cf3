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
};

inline constexpr int kTransferResultCount = 9;

std::string_view TransferResultName(TransferResult r);

}  // namespace kvrelay
