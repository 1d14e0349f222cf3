// faulty_transport.h — FaultyTransport: a Transport decorator whose writes
// (and, read mode, reads) fail half-way, for fault drills (`kvrelay chaos`,
// serve's hidden --debug-fail-writes-* flags). Never used unless those
// flags are given.
//
// Why a decorator: "a P whose writes fail half-way" must exercise the real
// runtime (writer pool, send table, D's load table) against a real data
// plane. Wrapping the transport the Node creates gives exactly that, with
// no fault code inside shm/tcp/ucx.
//
// What fails: once the process has written `after_bytes` bytes through
// this transport (all targets together), each Write is drawn to fail with
// `probability` (a hash of `seed` and the write's sequence number, so a
// run replays). A failing Write first writes the first half of its bytes
// (the segments cut at that point, through the real transport), then
// returns kUnavailable — the transport contract's "a failed Write may have
// written a prefix". Reads (Source::Read) the same with `read_probability`
// and `read_after_bytes`, drawn and counted apart from writes (their own
// sequence and byte count, so turning read faults on does not change which
// writes fail): a failing Read reads the first half of its bytes, then
// returns kUnavailable. Regions are passed through untouched. A polled
// write or read (Target::StartWrite, Source::StartRead) is drawn the same
// way when it starts: the real transport's polled operation runs on all
// its segments, or on the first half and then ends kUnavailable. A start
// the real transport declines (nullptr) spends its draw, and the caller's
// Write or Read then draws anew; CopiesInPlace is the real one's.
//
// Ownership: FaultyTransport owns the wrapped Transport; each FaultyTarget
// or FaultySource owns its wrapped Target or Source and shares the counters
// with the transport (so it may outlive it). Threading: thread-safe like
// any Transport.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "net/transport.h"

namespace kvrelay::net {

struct WriteFaultOptions {
  double probability = 0;     // writes; 0: off
  uint64_t after_bytes = 0;   // write faults start once this many bytes were written
  uint64_t seed = 1;
  double read_probability = 0;    // reads; 0: off
  uint64_t read_after_bytes = 0;  // read faults start once this many bytes were read
  bool enabled() const { return probability > 0 || read_probability > 0; }
};

// The segments holding the first `bytes` bytes of `segments` (the last one
// cut short). Pure; exposed for tests.
std::vector<Segment> PrefixSegments(std::span<const Segment> segments, uint64_t bytes);

// Wraps `inner`; REQUIRES: options.enabled().
std::unique_ptr<Transport> MakeFaultyTransport(std::unique_ptr<Transport> inner,
                                               const WriteFaultOptions& options);

}  // namespace kvrelay::net
