// parallel_kv_memory.h — ParallelKvMemory: a KvMemory whose ReadBlocks
// splits a long read across threads.
//
// Why: the emulated model reads every byte of a request's KV at each step
// (engine/schedule.cc, Generate), as a model's attention does. A GPU does
// that in parallel; one CPU thread reads 1.1 GiB (an 8,192-token prompt of
// the 8b shape) in about 100 ms, which made D's first step after a transfer
// cost a quarter of the transfer itself (docs/performance.md, "End to end").
// With `threads` > 1 a read of at least `threads` × kMinBlocksPerThread
// blocks is cut into `threads` contiguous runs: the calling thread reads
// the first, a thread started for the call reads each other one, and the
// call returns when all are done. Smaller reads, and every other method,
// go straight to the wrapped memory.
//
// Ownership: does not own `inner`, which must outlive it. Thread safety: as
// KvMemory, the engine's thread only; the helper threads only read (the
// wrapped memory's reads are const and keep no state: ByteKvMemory,
// RankedKvMemory), and they end before ReadBlocks returns.
#pragma once

#include <cstdint>
#include <span>

#include "engine/kv_memory.h"

namespace kvrelay::runtime {

class ParallelKvMemory final : public engine::KvMemory {
 public:
  // Below this many blocks per thread a read stays on one thread: starting
  // a thread costs tens of microseconds, reading a block of the small shapes
  // less.
  static constexpr size_t kMinBlocksPerThread = 16;

  // REQUIRES: threads >= 1.
  ParallelKvMemory(engine::KvMemory* inner, uint32_t threads);

  void Write(BlockId b, uint32_t group, uint64_t digest) override {
    inner_->Write(b, group, digest);
  }
  uint64_t Read(BlockId b, uint32_t group) const override { return inner_->Read(b, group); }
  void ReadBlocks(std::span<const BlockId> blocks, std::span<uint64_t> out) const override;
  void BlockBytes(BlockId b, std::vector<std::span<uint8_t>>* out) override {
    inner_->BlockBytes(b, out);
  }
  void OnAllocate(BlockId b, TransferId owner) override { inner_->OnAllocate(b, owner); }
  void OnFree(BlockId b) override { inner_->OnFree(b); }
  void OnReset() override { inner_->OnReset(); }

  uint32_t threads() const { return threads_; }

 private:
  engine::KvMemory* const inner_;
  const uint32_t threads_;
};

}  // namespace kvrelay::runtime
