// transfer_id_source.h — NewTransferIdFromOs: a fresh 128-bit transfer_id
// drawn from the operating system (getrandom(2)).
//
// Why: the transfer_id is the one name P and D share for a hand-off; drawn
// from the OS at the edge (here, the router) it cannot be guessed by a peer
// and two routers never collide in practice. Pure layers never call this
// (base/transfer_id.h).
//
// Errors: kInternal if the OS refuses (getrandom failing other than EINTR);
// the result is never all zeros (a zero draw is redrawn).
//
// Thread safety: any thread.
#pragma once

#include "base/result.h"
#include "base/transfer_id.h"

namespace kvrelay::router {

Result<TransferId> NewTransferIdFromOs();

}  // namespace kvrelay::router
