// block_id.h — BlockId, PeerId and PeerAddress: the typed handles the core
// passes around.
//
// Thread safety: value types.
#pragma once

#include "base/typed_id.h"

namespace kvrelay {

// One KV block of one rank's pool: index into the pool, generation of the
// block's current life (bumped whenever it returns to the free list, is
// evicted, or the pool is reset). A BlockId whose generation does not match
// the pool's is stale.
using BlockId = TypedId<struct BlockTag>;

// A control-channel peer (one D rank as seen by a P rank, or the reverse):
// index chosen by the driver, generation = the peer's incarnation, so a
// message from a restarted process's previous life does not match.
using PeerId = TypedId<struct PeerTag>;

// Ranks an engine may have (tp) on the control channel.
inline constexpr uint32_t kMaxRanksPerEngine = 8;

// Where a peer rank is: its engine's id, its rank, and the incarnation of
// its process. A PeerId packs it (index = engine × kMaxRanksPerEngine +
// rank, generation = incarnation); this is the one place that packs and
// unpacks, for the runtime and the simulator alike.
struct PeerAddress {
  uint32_t engine = 0;
  uint32_t rank = 0;         // < kMaxRanksPerEngine
  uint32_t incarnation = 0;

  PeerId Id() const { return PeerId{engine * kMaxRanksPerEngine + rank, incarnation}; }
  static PeerAddress Of(PeerId id) {
    return PeerAddress{id.index / kMaxRanksPerEngine, id.index % kMaxRanksPerEngine,
                       id.generation};
  }
  bool operator==(const PeerAddress&) const = default;
};

// The engine of a peer rank (the send and lease tables bind a transfer to
// one D engine).
inline uint32_t PeerEngineOf(PeerId peer) { return PeerAddress::Of(peer).engine; }

}  // namespace kvrelay
