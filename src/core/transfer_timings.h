// transfer_timings.h — TransferTimings: every time that bounds a hand-off,
// in one value, from which each table derives its own.
//
// Why: the tables' times are not independent. D gives up on a load
// abort_timeout + giveup_grace after its pull; P keeps a tombstone, and a
// lease's, at least that long; D's reader gives up on a lease then too.
// Written once here ("give-up = abort_timeout + grace"), a driver (the
// runtime's Node, the simulator) sets a TransferTimings and hands it on;
// RankConnectorOptions::ApplyTimings fills every table's options from it.
//
// Thread safety: a value type.
#pragma once

#include "base/time.h"

namespace kvrelay {

struct TransferTimings {
  // P: how long a READY send waits to be pulled, and a pull for its prefill
  // and a sender; D: a pull's deadline. vLLM's
  // VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT.
  Duration abort_timeout = Duration::Seconds(480);
  // D gives up on a load this long after its pull's deadline.
  Duration giveup_grace = Duration::Seconds(60);
  // Read mode. P: the lease its first grant gives, and each heartbeat's
  // extension; D: how often it sends a heartbeat, and how close to a
  // lease's end it starts no read.
  Duration lease = Duration::Seconds(30);
  Duration lease_extension = Duration::Seconds(20);
  Duration lease_heartbeat = Duration::Seconds(5);
  Duration read_margin = Duration::Seconds(5);
  // The control channel (core/rank_session.h): D's hello to each P rank
  // every `heartbeat`; a P rank silent past peer_down_after is down, past
  // peer_dead_after gone (its loads fail).
  Duration heartbeat = Duration::Seconds(1);
  Duration peer_down_after = Duration::Seconds(3);
  Duration peer_dead_after = Duration::Seconds(10);

  // When D gives up on a transfer, counted from its pull (or first
  // heartbeat): P's tombstones and leases outlive it.
  Duration GiveUp() const { return abort_timeout + giveup_grace; }
};

}  // namespace kvrelay
