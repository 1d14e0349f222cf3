// emulated_model.h — EmulatedModel: the emulated model (model.h) behind the
// ComputeModel seam.
//
// Why: the engine's scheduler drives every model the same way; this one
// computes KV as digests of the token prefix and the weights version into
// the engine's KvMemory and reads them back for the next token, so a wrong,
// missing or stale block changes the output (model.h's theory). It keeps
// nothing per sequence: the KV is in the blocks.
//
// Ownership and threading: owned by whoever builds the engine (Engine makes
// one itself when given none); the KvMemory outlives it. The engine's
// thread only.
#pragma once

#include <vector>

#include "engine/compute_model.h"
#include "engine/kv_memory.h"

namespace kvrelay::engine {

class EmulatedModel final : public ComputeModel {
 public:
  EmulatedModel(const ModelShape& shape, KvMemory* memory);

  void Run(std::span<const SeqWork> batch, uint64_t weights_version,
           std::span<Token> out) override;
  void Forget(uint64_t) override {}
  void ForgetAll() override {}
  Status Reside(const Residency&) override { return Status::Ok(); }
  bool SharesBlocks() const override { return true; }
  bool KvInBlocksAsComputed() const override { return true; }
  uint32_t vocab() const override { return shape_.vocab; }
  std::string Describe() const override { return "emulated " + shape_.name; }

 private:
  void WriteKv(const SeqWork& w, uint64_t weights_version);
  Token Generate(const SeqWork& w, uint64_t weights_version);

  const ModelShape shape_;
  KvMemory* const memory_;
  std::vector<uint64_t> read_scratch_;  // Generate's digests, reused
};

}  // namespace kvrelay::engine
