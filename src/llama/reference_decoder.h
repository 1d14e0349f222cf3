// reference_decoder.h — ReferenceDecoder: llama.cpp decoding one prompt
// alone, with nothing of kvrelay in the loop.
//
// Why: it is what a llama engine's output is checked against (tests) and
// what its speed is measured against (bench llama): the library's own
// plain loop — one context, one sequence, the prompt in batches of at most
// `batch_tokens`, then one llama_decode per generated token — sampling
// with the same SampleToken the engine uses.
//
// Ownership and threading: one thread; owns its model and context.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "engine/compute_model.h"

namespace kvrelay::llama {

struct ReferenceOptions {
  std::string model_path;
  uint32_t threads = 2;
  uint32_t context_tokens = 4096;
  uint32_t batch_tokens = 512;
  // The engine's context instead of the library's default for one
  // sequence: llama.cpp's unified KV cache (one pool of cells for all
  // sequences) sized for `max_sequences`. What the engine's LlamaModel runs,
  // so a comparison with it isolates kvrelay's scheduler. On the 2-layer
  // made model that context alone costs llama.cpp ~30% of its decode speed
  // (a fixed cost per step; ~5% at 12 layers).
  bool engine_context = false;
  uint32_t max_sequences = 1;
};

class ReferenceDecoder {
 public:
  static Result<std::unique_ptr<ReferenceDecoder>> Open(const ReferenceOptions& options);
  virtual ~ReferenceDecoder() = default;
  // Up to `n` tokens after `prompt` (the context is cleared first): fewer
  // when one is the model's end-of-generation token (it is the last one
  // returned), as the engine stops, unless `ignore_eos`.
  virtual std::vector<engine::Token> Generate(std::span<const engine::Token> prompt, uint32_t n,
                                              const engine::Sampling& sampling,
                                              bool ignore_eos = false) = 0;
  // The logits after `prompt` (the context cleared first), as Generate
  // computes them for its first token: to tell a near tie from a wrong one.
  virtual std::vector<float> LogitsAfter(std::span<const engine::Token> prompt) = 0;
};

}  // namespace kvrelay::llama
