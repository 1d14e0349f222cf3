// kv_release.h — ParseKvRelease: the body of POST /kv_release, by which the
// router tells a P engine that a hand-off will never be pulled.
//
// Why: a D that crashed before it pulled cannot release P's KV, and once P's
// leg has answered the router has no request left on P to cancel; without a
// way to say so, P holds the blocks until its --abort-timeout-s (480 s by
// default). The router, which saw D's leg fail, names the transfer here and
// P ends its send through the send table's one end path (an abort: a late
// pull finds the tombstone). The call needs no admin token: like the
// completion that created the transfer, it is a request, and the transfer id
// (128 random bits, known to the router and the two engines) names only this
// hand-off (docs/http.md, "POST /kv_release").
//
// Body: {"transfer_id": "<32 lowercase hex digits, not all zeros>"}.
//
// Thread safety: a pure function; any thread.
#pragma once

#include <string_view>

#include "base/result.h"
#include "base/transfer_id.h"

namespace kvrelay::server {

// kInvalidArgument with a message a caller can act on.
Result<TransferId> ParseKvRelease(std::string_view body);

}  // namespace kvrelay::server
