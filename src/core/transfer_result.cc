#include "core/transfer_result.h"

namespace kvrelay {

std::string_view TransferResultName(TransferResult r) {
  switch (r) {
    case TransferResult::kOk: return "ok";
    case TransferResult::kReleased: return "released";
    case TransferResult::kAborted: return "aborted";
    case TransferResult::kExpired: return "expired";
    case TransferResult::kWriteFailed: return "write_failed";
    case TransferResult::kDeadline: return "deadline";
    case TransferResult::kRejected: return "rejected";
    case TransferResult::kAlreadyPulled: return "already_pulled";
    case TransferResult::kUnreachable: return "unreachable";
    case TransferResult::kReset: return "reset";
    case TransferResult::kMismatch: return "mismatch";
  }
  return "unknown";
}

bool RecomputeAnyway(TransferResult r) {
  return r == TransferResult::kReset || r == TransferResult::kMismatch;
}

}  // namespace kvrelay
