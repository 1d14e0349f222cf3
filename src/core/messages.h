// messages.h — what crosses the control channel between ranks, as values.
//
// Push mode: pulls and answers. Read mode: heartbeats, grants, revokes and
// notices. The wire codec (core/wire.h) turns these into versioned bytes; the simulator
// delivers them as they are. A pull names its transfers and the destination
// blocks in D's registered memory; an answer closes one (pull, transfer).
//
// This is the vocabulary the tables speak (core/send_table.h,
// core/lease_table.h include it), not the other way round.
//
// Thread safety: value types and pure functions; any thread.
#pragma once

#include <cstdint>
#include <variant>
#include <vector>

#include "base/transfer_id.h"
#include "core/block_id.h"
#include "core/first_token.h"
#include "core/transfer_result.h"

namespace kvrelay {

// One transfer named in a pull. Empty `dst` means a release.
struct PullItem {
  TransferId transfer;
  std::vector<BlockId> dst;
  // Fingerprint of the prompt D expects (0: not checked). A pull whose
  // fingerprint differs from the claimed send's is refused (kRejected): a
  // transfer_id collision — a router bug, or two routers — must end as a
  // failed load, never as KV of another prompt decoded as this one's.
  uint64_t prompt_hash = 0;
  // How long D still grants from now (0: the full abort_timeout). A pull
  // resent after a reconnect grants only what is left before D gives up,
  // so P's deadline stays anchored to D's clock, not to the resend.
  int64_t budget_ns = 0;
  bool operator==(const PullItem&) const = default;
};

// How P answers a heartbeat.
enum class LeaseAnswer : uint8_t {
  kGranted = 0,   // `src` may be read until `remaining_ns` after D sent it
  kPending = 1,   // not ready (prefill running) or unknown: ask again
  kEnded = 2,     // the transfer ended (`result`); do not read
};
const char* LeaseAnswerName(LeaseAnswer answer);

// What a D rank tells P about a transfer it was granted (or will not read).
enum class ReadNotice : uint8_t {
  kDone = 0,      // every read landed: this rank is done with the blocks
  kFailed = 1,    // a read failed; no read of this rank is in flight
  kRelease = 2,   // the request went away; no read of this rank in flight
  kRevoked = 3,   // answer to a revoke: no read of this rank in flight
};
const char* ReadNoticeName(ReadNotice notice);

// D rank → P rank. An item with no blocks is a release. `to_incarnation`:
// the P process it is meant for (its handshake's incarnation): a restarted
// P listens at the same address and must not take (and write for) a pull
// its previous life was sent, which D has already failed.
struct PullMsg {
  uint64_t pull_seq = 0;
  std::vector<PullItem> items;
  uint32_t to_incarnation = 0;
  bool operator==(const PullMsg&) const = default;
};

// P rank → D rank: the answer for one (pull, transfer).
struct AnswerMsg {
  uint64_t pull_seq = 0;
  TransferId transfer;
  TransferResult result = TransferResult::kOk;
  uint32_t first_token = kNoFirstToken;  // kOk only (core/first_token.h)
  bool operator==(const AnswerMsg&) const = default;
};

// --- read mode (core/lease_table.h, core/read_load_table.h) ---

// D rank → P rank: heartbeat `seq` for a transfer D will read (the first
// one asks for the grant; each extends the lease).
struct LeaseMsg {
  uint64_t seq = 0;
  TransferId transfer;
  uint64_t prompt_hash = 0;
  bool operator==(const LeaseMsg&) const = default;
};

// P rank → D rank: the answer to heartbeat `seq`.
struct GrantMsg {
  uint64_t seq = 0;
  TransferId transfer;
  LeaseAnswer answer = LeaseAnswer::kPending;
  TransferResult result = TransferResult::kOk;
  int64_t remaining_ns = 0;
  std::vector<BlockId> src;
  bool operator==(const GrantMsg&) const = default;
};

// P rank → D rank: stop reading `transfer`, and say so once no read is in
// flight.
struct RevokeMsg {
  TransferId transfer;
  TransferResult reason = TransferResult::kAborted;  // why P ends it (kReset: recompute)
  bool operator==(const RevokeMsg&) const = default;
};

// D rank → P rank: done / failed / release / revoked.
struct NoticeMsg {
  TransferId transfer;
  ReadNotice notice = ReadNotice::kDone;
  bool operator==(const NoticeMsg&) const = default;
};

using PeerMessage =
    std::variant<PullMsg, AnswerMsg, LeaseMsg, GrantMsg, RevokeMsg, NoticeMsg>;

// A message for the driver to deliver to `to`.
struct OutMessage {
  PeerId to;
  PeerMessage msg;
};

}  // namespace kvrelay
