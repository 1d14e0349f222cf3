// model.h — the emulated model: pure functions that make every KV byte
// checkable end to end.
//
// Why: kvrelay moves KV it cannot run a network on. Instead the "model" is
// a pure function chosen so that a wrong, missing, stale or foreign KV block
// changes the output:
//
//   * KV of a block, per head group, is a digest of (weights version, hash
//     of the token prefix up to the end of the block's tokens, head group).
//     Real bytes (runtime) are a PRNG stream from the same key; the
//     simulator stores the digest itself.
//   * The next token is a hash of (weights version, the digests actually
//     present in the sequence's blocks, position). Reference() computes it
//     from the prompt alone, so any request's output can be checked token
//     for token.
//
// Head groups: KV heads are split into kHeadGroups groups; a rank of an
// engine with tp t owns groups [r·G/t, (r+1)·G/t). A P rank writes its
// groups into the same groups of D's blocks, whatever the two tp sizes.
//
// Thread safety: pure functions and value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvrelay::engine {

using Token = uint32_t;
inline constexpr uint32_t kHeadGroups = 4;   // tp ∈ {1, 2, 4}

struct ModelShape {
  std::string name;
  uint32_t layers = 2;
  uint32_t kv_heads = 4;
  uint32_t head_dim = 8;
  uint32_t dtype_bytes = 2;
  uint32_t block_tokens = 4;
  uint32_t vocab = 32000;
  uint32_t max_context = 4096;

  // Bytes of one block held by one rank of an engine with `tp` ranks:
  // tokens × layers × {K,V} × heads/tp × head_dim × dtype.
  uint64_t BlockBytesPerRank(uint32_t tp) const {
    return uint64_t{block_tokens} * layers * 2 * (kv_heads / tp) * head_dim * dtype_bytes;
  }
};

// "tiny" (tests, simulator), "small" (8 layers, 4 KV heads, head_dim 64,
// bf16, 16-token blocks: 128 KiB per block; demos) or "8b" (36 layers, 8 KV heads, head_dim 128,
// bf16, 16-token blocks). False for an unknown name.
bool ModelShapeByName(const std::string& name, ModelShape* out);

// Hash of tokens[0, n): the prefix key of a block whose last token is n-1.
uint64_t PrefixHash(uint64_t weights_version, std::span<const Token> tokens);

// Digest of head group `group`'s KV for the tokens covered by a block whose
// prefix (all tokens up to its last present token) hashes to `prefix`.
uint64_t KvDigest(uint64_t prefix, uint32_t group);

// Expected digest of block `index` (all groups folded) for `tokens`.
uint64_t BlockDigest(uint64_t weights_version, std::span<const Token> tokens,
                     uint32_t block_tokens, uint32_t index, uint32_t group);

// The next token given the digests present in the sequence's blocks,
// folded in order (FoldDigests).
Token NextToken(uint64_t weights_version, uint64_t folded_digests, uint32_t position,
                uint32_t vocab);
uint64_t FoldDigest(uint64_t acc, uint64_t digest);

// The output a correct engine produces for `prompt` under `weights_version`.
std::vector<Token> Reference(std::span<const Token> prompt, uint64_t weights_version,
                             uint32_t n, const ModelShape& shape);

// Blocks needed for `tokens` tokens.
inline uint32_t BlocksFor(uint32_t tokens, uint32_t block_tokens) {
  return (tokens + block_tokens - 1) / block_tokens;
}

}  // namespace kvrelay::engine
