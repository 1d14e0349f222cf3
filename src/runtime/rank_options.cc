#include "runtime/rank_options.h"

#include <algorithm>
#include <utility>

#include "os/os_random.h"

namespace kvrelay::runtime {

RankSessionOptions SessionOptionsFor(const RankActorOptions& options,
                                     net::TransportKind transport,
                                     std::vector<uint8_t> registration) {
  RankSessionOptions o;
  o.connector.role = options.role;
  o.connector.rank = options.rank;
  o.connector.tp = options.tp;
  o.connector.mode = options.mode;
  o.connector.send.num_workers = options.num_workers;
  o.timings = options.timings;
  HandshakeMsg& self = o.self;
  self.engine_id = options.engine_id;
  self.incarnation = options.incarnation;
  self.rank = options.rank;
  self.tp = options.tp;
  self.role = static_cast<uint8_t>(options.role);
  self.transport = static_cast<uint8_t>(transport);
  self.layers = options.shape.layers;
  self.kv_heads = options.shape.kv_heads;
  self.head_dim = options.shape.head_dim;
  self.dtype_bytes = options.shape.dtype_bytes;
  self.block_tokens = options.shape.block_tokens;
  self.num_blocks = options.num_blocks;
  self.registration = std::move(registration);
  o.max_tp = engine::kHeadGroups;
  o.limits = options.limits;
  o.auth_token = options.auth_token;
  o.nonce = NonceFromOs;
  // tcp refuses a write whose grant was revoked (net/grant_table.h); shm's
  // P shares D's host, where silence is no partition but a stalled or dead
  // process (its lane usually proves which). ucx may be partitioned and
  // checks no grants: a silent P's loads wait for their give-up time.
  o.silence_fails_loads = transport != net::TransportKind::kUcx;
  return o;
}

LaneLimits LaneLimitsFor(const RankActorOptions& o) {
  LaneLimits l;
  l.max_frame_bytes = o.limits.max_frame_bytes;
  l.max_frames = static_cast<size_t>(std::max(o.socket_hwm, 1));
  return l;
}

}  // namespace kvrelay::runtime
