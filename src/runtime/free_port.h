// free_port.h — FreeLoopbackPorts: ports for child processes to bind.
//
// Why: the demo, the matrix, chaos, the benches and the process tests start
// engines on ports chosen before the child binds them. A port that bind(0)
// hands out lies in the kernel's ephemeral range, where any connect() on the
// machine may take it in between ("Address already in use"). These come at
// random from below that range, where nothing takes a port unasked, and one
// process never hands out the same port twice.
//
// Thread safety: any thread (one lock per process).
#pragma once

#include <cstdint>

namespace kvrelay::runtime {

// The first of `n` consecutive loopback ports (n = 0 counts as 1) that bind
// right now, in [10000, the ephemeral range's start); 0 if none was found.
uint16_t FreeLoopbackPorts(uint32_t n);

// The start of the kernel's ephemeral port range (ip_local_port_range;
// 32768 if it cannot be read).
uint32_t EphemeralPortLow();

}  // namespace kvrelay::runtime
