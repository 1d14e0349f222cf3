// send_table_handover.cc — SendTable's helpers for the blocks P hands over
// (Ready, and Progress when it streams): which send may take them, how many
// of a waiting pull's blocks P has, and the fingerprint check of pulls that
// waited. The transitions that call them are in send_table.cc.
#include <algorithm>
#include <string>

#include "base/check.h"
#include "core/send_table.h"

namespace kvrelay {

Result<uint32_t> SendTable::HandOverTarget(TransferId transfer, const char* what,
                                           uint64_t& refused) {
  const uint32_t found = FindSend(transfer);
  if (found == kNil) {
    ++refused;
    if (auto ended = tombstones_.find(transfer); ended != tombstones_.end()) {
      return CancelledError("transfer " + transfer.ToString() +
                            " already ended: " +
                            std::string(TransferResultName(ended->second)));
    }
    return FailedPreconditionError(std::string(what) + " for unclaimed transfer " +
                                   transfer.ToString());
  }
  const Send& send = sends_[found];
  if (send.state == SendState::kDone) {
    ++refused;
    return CancelledError("transfer " + transfer.ToString() + " already ended: " +
                          std::string(TransferResultName(send.end_reason)));
  }
  if (!send.claimed) {
    ++refused;
    return FailedPreconditionError(std::string(what) + " for unclaimed transfer " +
                                   transfer.ToString());
  }
  return found;
}

bool SendTable::EndedOnMismatchedPull(uint32_t s, Instant now) {
  const Send& send = sends_[s];
  for (uint32_t i = send.items.head; i != kNil; i = items_[i].in_send.next) {
    if (!PromptMatches(send.prompt_hash, items_[i].prompt_hash)) {
      ++stats_.prompt_mismatch;
      EndSend(s, TransferResult::kMismatch, now);
      return true;
    }
  }
  return false;
}

uint32_t SendTable::Available(uint32_t i) const {
  const Item& item = items_[i];
  const Send& send = sends_[item.send];
  if (!send.holds_blocks) return 0;
  const uint32_t offset = send.total_blocks - item.want;
  const auto have = static_cast<uint32_t>(send.blocks.size());
  return have <= offset ? 0 : std::min(have - offset, item.want);
}

}  // namespace kvrelay
