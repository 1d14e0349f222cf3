#include "core/messages.h"

namespace kvrelay {

const char* LeaseAnswerName(LeaseAnswer answer) {
  switch (answer) {
    case LeaseAnswer::kGranted: return "granted";
    case LeaseAnswer::kPending: return "pending";
    case LeaseAnswer::kEnded: return "ended";
  }
  return "?";
}

const char* ReadNoticeName(ReadNotice notice) {
  switch (notice) {
    case ReadNotice::kDone: return "done";
    case ReadNotice::kFailed: return "failed";
    case ReadNotice::kRelease: return "release";
    case ReadNotice::kRevoked: return "revoked";
  }
  return "?";
}

}  // namespace kvrelay
