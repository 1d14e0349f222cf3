// block_id.h — BlockId and PeerId: the typed handles the core passes around.
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

}  // namespace kvrelay
