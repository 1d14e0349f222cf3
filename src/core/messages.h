// messages.h — what crosses the control channel between ranks, as values.
//
// The wire codec (net/) turns these into versioned bytes; the simulator
// delivers them as they are. A pull names its transfers and the destination
// blocks in D's registered memory; an answer closes one (pull, transfer).
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/send_table.h"
#include "core/transfer_result.h"

namespace kvrelay {

// D rank → P rank. An item with no blocks is a release.
struct PullMsg {
  uint64_t pull_seq = 0;
  std::vector<PullItem> items;
  bool operator==(const PullMsg&) const = default;
};

// P rank → D rank: the answer for one (pull, transfer).
struct AnswerMsg {
  uint64_t pull_seq = 0;
  TransferId transfer;
  TransferResult result = TransferResult::kOk;
  bool operator==(const AnswerMsg&) const = default;
};

using PeerMessage = std::variant<PullMsg, AnswerMsg>;

// A message for the driver to deliver to `to`.
struct OutMessage {
  PeerId to;
  PeerMessage msg;
};

}  // namespace kvrelay
