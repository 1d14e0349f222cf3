// engine_picker.h — PickLeastLoaded: which engine of a list gets the next
// leg: the eligible one with the fewest outstanding legs, round-robin among
// those tied.
//
// Why: the choice of engine is the router's only scheduling policy; it is a
// pure function of the loads and a cursor so a test can pin it down.
// Round-robin on ties spreads a trickle of requests (every load 0) over all
// engines instead of piling them on the first.
//
// Owner: EnginePool calls it under its mutex and keeps the cursor.
// Thread safety: pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace kvrelay::router {

struct PickCandidate {
  uint64_t outstanding = 0;   // legs in flight to this engine
  bool eligible = true;       // up (its /kv_info answered and fits the role)
};

// The index of the engine to use, or nullopt if none is eligible. Among the
// eligible engines with the fewest outstanding legs, picks the first at or
// after *cursor (cyclically), then sets *cursor one past it.
// REQUIRES: cursor != nullptr.
std::optional<size_t> PickLeastLoaded(std::span<const PickCandidate> candidates,
                                      size_t* cursor);

}  // namespace kvrelay::router
