#include "engine/model.h"

#include <algorithm>

#include "base/check.h"
#include "base/prng.h"

namespace kvrelay::engine {

bool ModelShapeByName(const std::string& name, ModelShape* out) {
  if (name == "tiny") {
    *out = ModelShape{"tiny", 2, 4, 8, 2, 4, 32000, 1024};
    return true;
  }
  if (name == "small") {
    *out = ModelShape{"small", 8, 4, 64, 2, 16, 32000, 4096};
    return true;
  }
  if (name == "8b") {
    *out = ModelShape{"8b", 36, 8, 128, 2, 16, 128256, 32768};
    return true;
  }
  return false;
}

uint64_t PrefixHash(uint64_t weights_version, std::span<const Token> tokens) {
  uint64_t h = Mix64(weights_version ^ 0x6B76726C6179ull);
  for (Token t : tokens) h = Mix64(h ^ t);
  return Mix64(h ^ tokens.size());
}

uint64_t KvDigest(uint64_t prefix, uint32_t group) {
  return Mix64(prefix ^ (uint64_t{group} + 1) * 0x9E3779B97F4A7C15ull);
}

uint64_t BlockDigest(uint64_t weights_version, std::span<const Token> tokens,
                     uint32_t block_tokens, uint32_t index, uint32_t group) {
  const size_t end = std::min<size_t>(tokens.size(), size_t{index + 1} * block_tokens);
  KV_CHECK_GT(end, size_t{index} * block_tokens);
  return KvDigest(PrefixHash(weights_version, tokens.subspan(0, end)), group);
}

uint64_t FoldDigest(uint64_t acc, uint64_t digest) { return Mix64(acc ^ digest) + 1; }

Token NextToken(uint64_t weights_version, uint64_t folded_digests, uint32_t position,
                uint32_t vocab) {
  return static_cast<Token>(Mix64((weights_version * 31 + folded_digests) ^ position) % vocab);
}

std::vector<Token> Reference(std::span<const Token> prompt, uint64_t weights_version,
                             uint32_t n, const ModelShape& shape) {
  std::vector<Token> seq(prompt.begin(), prompt.end());
  std::vector<Token> out;
  for (uint32_t k = 0; k < n; ++k) {
    uint64_t folded = 0;
    const uint32_t blocks = BlocksFor(static_cast<uint32_t>(seq.size()), shape.block_tokens);
    for (uint32_t b = 0; b < blocks; ++b) {
      for (uint32_t g = 0; g < kHeadGroups; ++g) {
        folded = FoldDigest(folded, BlockDigest(weights_version, seq, shape.block_tokens, b, g));
      }
    }
    const Token t =
        NextToken(weights_version, folded, static_cast<uint32_t>(seq.size()), shape.vocab);
    out.push_back(t);
    seq.push_back(t);
  }
  return out;
}

}  // namespace kvrelay::engine
