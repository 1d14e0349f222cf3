// emulated_model.cc — the emulated model's batch: KV digests in, next
// tokens from the digests present.
#include "engine/emulated_model.h"

#include "base/check.h"

namespace kvrelay::engine {

EmulatedModel::EmulatedModel(const ModelShape& shape, KvMemory* memory)
    : shape_(shape), memory_(memory) {
  KV_CHECK(memory_ != nullptr);
}

void EmulatedModel::Run(std::span<const SeqWork> batch, uint64_t weights_version,
                        std::span<Token> out) {
  size_t next = 0;
  for (const SeqWork& w : batch) {
    if (w.to > w.from) WriteKv(w, weights_version);
    if (w.wants_token) {
      KV_CHECK_LT(next, out.size());
      out[next++] = Generate(w, weights_version);
    }
  }
  KV_CHECK_EQ(next, out.size());
}

// The KV of tokens [from, to), rewriting the partial block it extends.
void EmulatedModel::WriteKv(const SeqWork& w, uint64_t weights_version) {
  const uint32_t bs = shape_.block_tokens;
  const std::span<const Token> prefix = w.tokens.first(w.to);
  for (uint32_t b = w.from / bs; b * bs < w.to; ++b) {
    KV_CHECK_LT(b, w.blocks.size());
    for (uint32_t g = 0; g < kHeadGroups; ++g) {
      memory_->Write(w.blocks[b], g, BlockDigest(weights_version, prefix, bs, b, g));
    }
  }
}

// The next token from the KV actually present in the sequence's blocks.
Token EmulatedModel::Generate(const SeqWork& w, uint64_t weights_version) {
  const uint32_t len = static_cast<uint32_t>(w.tokens.size());
  const uint32_t n = BlocksFor(len, shape_.block_tokens);
  KV_CHECK_LE(n, w.blocks.size());
  read_scratch_.resize(size_t{n} * kHeadGroups);
  memory_->ReadBlocks(w.blocks.first(n), read_scratch_);
  uint64_t folded = 0;
  for (const uint64_t digest : read_scratch_) folded = FoldDigest(folded, digest);
  return NextToken(weights_version, folded, len, shape_.vocab);
}

}  // namespace kvrelay::engine
