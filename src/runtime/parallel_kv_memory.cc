#include "runtime/parallel_kv_memory.h"

#include <thread>
#include <vector>

#include "base/check.h"

namespace kvrelay::runtime {

ParallelKvMemory::ParallelKvMemory(engine::KvMemory* inner, uint32_t threads)
    : inner_(inner), threads_(threads) {
  KV_CHECK(inner_ != nullptr);
  KV_CHECK_GE(threads_, 1u);
}

void ParallelKvMemory::ReadBlocks(std::span<const BlockId> blocks,
                                  std::span<uint64_t> out) const {
  KV_CHECK_EQ(out.size(), blocks.size() * engine::kHeadGroups);
  const size_t n = blocks.size();
  if (threads_ <= 1 || n < size_t{threads_} * kMinBlocksPerThread) {
    inner_->ReadBlocks(blocks, out);
    return;
  }
  // Run k reads blocks [k * n / threads, (k + 1) * n / threads).
  auto run = [&](uint32_t k) {
    const size_t first = n * k / threads_, last = n * (k + 1) / threads_;
    inner_->ReadBlocks(blocks.subspan(first, last - first),
                       out.subspan(first * engine::kHeadGroups,
                                   (last - first) * engine::kHeadGroups));
  };
  std::vector<std::thread> helpers;
  helpers.reserve(threads_ - 1);
  for (uint32_t k = 1; k < threads_; ++k) helpers.emplace_back(run, k);
  run(0);
  for (std::thread& t : helpers) t.join();
}

}  // namespace kvrelay::runtime
