// os_random.h — FillFromOs: bytes from the operating system's CSPRNG
// (getrandom(2)).
//
// Why here: nonces for the control channel's challenge-response and for
// admin HTTP calls must be unpredictable, and pure layers draw no hidden
// randomness; the drivers are the edge that may ask the OS (os/).
//
// Errors: kInternal if getrandom fails other than EINTR.
// Thread safety: any thread.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "base/status.h"

namespace kvrelay {

Status FillFromOs(std::span<uint8_t> out);

// A 16-byte nonce; CHECK-fails if the OS cannot give one (a host without a
// working getrandom cannot run kvrelay's authentication at all).
std::array<uint8_t, 16> NonceFromOs();

}  // namespace kvrelay
