// no_kv_memory.h — NoKvMemory: the engine's KvMemory for a model that keeps
// its KV itself (llama.cpp's cells).
//
// Why: the engine tells its memory when blocks change hands; with a
// llama.cpp model nothing is written to or read from blocks (the emulated
// model's digests are not used), so Write and Read are bugs here.
//
// Thread safety: the engine's thread only (it holds nothing).
#pragma once

#include "base/check.h"
#include "engine/kv_memory.h"

namespace kvrelay::llama {

class NoKvMemory final : public engine::KvMemory {
 public:
  void Write(BlockId, uint32_t, uint64_t) override {
    KV_CHECK_MSG(false, "a llama.cpp engine writes no KV digests");
  }
  uint64_t Read(BlockId, uint32_t) const override {
    KV_CHECK_MSG(false, "a llama.cpp engine reads no KV digests");
    return 0;
  }
  void OnAllocate(BlockId, TransferId) override {}
  void OnFree(BlockId) override {}
  void OnReset() override {}
};

}  // namespace kvrelay::llama
