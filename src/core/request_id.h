// request_id.h — RequestId: an engine's own name for one request.
//
// Index and generation of the engine's request slot: a completion for a
// request that ended and whose slot was reused does not match. Distinct from
// the TransferId that P and D share.
#pragma once

#include "base/typed_id.h"

namespace kvrelay {

using RequestId = TypedId<struct RequestTag>;

}  // namespace kvrelay
