// rank_options.h — RankActorOptions: how Node configures one rank, and what
// the rank's session and lanes derive from it.
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rank_session.h"
#include "engine/model.h"
#include "net/transport.h"
#include "runtime/local_lane.h"

namespace kvrelay::runtime {

struct RankActorOptions {
  uint32_t engine_id = 0;
  uint32_t incarnation = 1;
  uint32_t rank = 0;
  uint32_t tp = 1;
  ConnectorRole role = ConnectorRole::kBoth;
  engine::ModelShape shape;
  uint32_t num_blocks = 0;
  std::string listen_host = "127.0.0.1";
  uint16_t ctrl_port = 0;              // P: this rank binds ctrl_port + rank
  KvMode mode = KvMode::kPush;
  TransferTimings timings;     // every table's times derive from it
  uint32_t num_workers = 4;    // writes (reads, in read mode) in flight at once
  // P: a write of at most this many bytes runs on the rank's own thread
  // instead of a worker when it cannot block it: a copy between local
  // mappings (shm), or a tcp frame sent without waiting whose reply the
  // rank's loop polls (net::PendingWrite). Waking a worker and being woken
  // back costs two thread hand-offs, more than such a write
  // (docs/performance.md). D, read mode: a read of at most this many bytes
  // likewise (an shm copy, or a tcp read request whose head, payload and
  // trailer the loop polls). 0: never.
  uint64_t inline_write_bytes = 1 << 20;
  WireLimits limits;
  int socket_hwm = 100000;             // ZeroMQ high-water mark, each way
  // Control frames between the same host's ranks (any transport) go over a
  // Unix socket polled by the rank threads (two thread wake-ups a pull,
  // not six). false: ZeroMQ only.
  bool local_lane = true;
  int thread_nice = 0;                 // the actor thread's nice value; 0: inherited
  int thread_slice_us = 0;             // the actor thread's EEVDF slice; 0: inherited
  std::string auth_token;              // shared secret; empty: no authentication
};

// The session of a rank with `options`, whose transport is `transport` and
// whose region registers as `registration` (sent in every handshake).
RankSessionOptions SessionOptionsFor(const RankActorOptions& options,
                                     net::TransportKind transport,
                                     std::vector<uint8_t> registration);

// The lane limits of a rank: ZeroMQ's frame cap and queue bound.
LaneLimits LaneLimitsFor(const RankActorOptions& o);

}  // namespace kvrelay::runtime
