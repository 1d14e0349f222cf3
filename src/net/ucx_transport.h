// ucx_transport.h — the UCX data plane (MakeUcxTransport is declared in
// transport.h); this header adds the few UCX-specific facts other code and
// tests need.
//
// What it is: one ucp_context (UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP) and one
// ucp_worker per Transport. A Region is anonymous mmap'd memory registered
// with ucp_mem_map for remote read and write; its registration carries the
// worker address and the packed rkey. A Target is one ucp_ep to the
// region's worker plus the unpacked rkey; Write = ucp_put_nbx per segment,
// then ucp_ep_flush_nbx, waited for (OK only when the flush completed: the
// bytes are there).
//
// Read mode: a Source is the same endpoint and rkey; Read = ucp_get_nbx
// per segment (remote → local) and a flush, waited for, then one more get
// of the region's liveness word. The word sits in its own 64-byte line
// right after the region's bytes (LivenessOffset(total bytes); registered
// with them, never reachable by a segment): a random non-zero nonce while
// the Region lives, 0 once it is destroyed. OpenSource reads the nonce; a
// Read returns OK only if the word, read after the data, still holds it, so
// a region destroyed (or retired, or its range reused) before the data was
// read fails the Read (kUnavailable) instead of handing back zeros. A
// process that died fails the gets themselves (the endpoint's error).
//
// Threading: the worker is created UCS_THREAD_MODE_SERIALIZED and every
// UCX call on it (progress, put, flush, ep create/close, mem map/unmap,
// request checks) is made under one per-transport mutex, so any number of
// threads may call Write/Read/Open/OpenSource/CreateRegion at once. A per-transport
// progress thread drives the worker (poll() on ucp_worker_get_efd, armed
// with ucp_worker_arm) so that this process's regions receive data from
// transports where the target side must progress (tcp). Writers progress
// the worker themselves while they wait for their flush.
//
// Ownership: Transport, Region, Target and Source share the UCX state
// (context, worker, progress thread), which is torn down when the last of
// them is destroyed, so they may be destroyed in any order. A Target or
// Source keeps its local region's registration alive. A destroyed Region's
// registration is released at once and its physical pages are returned
// (MADV_DONTNEED), but its address range stays reserved until the UCX state
// is torn down, so a late one-sided write from a peer lands in dead zero
// pages, never in memory reused for something else (and a late read finds
// the liveness word 0 and fails).
//
// Environment: UCX reads UCX_* variables (UCX_TLS, UCX_NET_DEVICES,
// UCX_LOG_LEVEL, ...) at MakeUcxTransport; TransportOptions::ucx_tls
// overrides UCX_TLS.
//
// Trust: a registration is framed, length-capped and checksummed, and
// Open rejects anything malformed with kInvalidArgument. The worker address
// and rkey blobs inside are parsed by UCX, which does not harden them
// against a deliberately forged (but correctly checksummed) registration;
// registrations must come from the authenticated control channel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "net/transport.h"

namespace kvrelay::net {

// Registration wire format, version 1 (all integers little-endian):
//   u32 magic "KVUX" | u32 version | u64 remote address | u64 total bytes |
//   u64 planes | u32 num_blocks | u64 block_stride_bytes |
//   u32 worker address length | worker address |
//   u32 rkey length | rkey | u64 FNV-1a of everything before it.
inline constexpr uint32_t kUcxRegistrationMagic = 0x5855564Bu;  // "KVUX"
inline constexpr uint32_t kUcxRegistrationVersion = 1;
// Cap on each of the two UCX blobs (worker address, rkey).
inline constexpr size_t kUcxMaxBlobBytes = 64 * 1024;

// For logs and tests: UCX's description of the endpoint behind a UCX
// Target (which transports its lanes use, from ucp_ep_print_info). Empty
// if `target` is not a UCX target. Thread-safe.
std::string DescribeUcxTarget(Target& target);

}  // namespace kvrelay::net
