// llama_checker.h — LlamaChecker: a load's outputs judged against llama.cpp
// alone (llama::ReferenceDecoder) on the file the engines serve, for
// `demo --engine llama` and `bench load --engine llama`.
//
// Why: the emulated model's outputs are checked token by token from the
// prompt alone (engine::CheckOutput); a real model's need the model. The
// rule is the one the llama engine's tests hold: the first token is exact
// always (P computes it alone, where llama.cpp alone cuts the prompt);
// later tokens are decoded in batches with other requests', where a near
// tie may go the other way, so whole outputs are counted, not demanded.
//
// Thread safety: Check may be called from many threads; the decoders run
// one at a time under a mutex.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/result.h"
#include "bench/load_gen.h"
#include "llama/llama_model.h"
#include "llama/reference_decoder.h"

namespace kvrelay::cli {

class LlamaChecker final : public OutputChecker {
 public:
  // `files`: weights version → GGUF (version 1: the served --model);
  // `context_tokens`: the longest prompt and output it checks.
  static Result<std::shared_ptr<LlamaChecker>> Open(std::map<uint64_t, std::string> files,
                                                    uint32_t threads,
                                                    uint32_t context_tokens = 4096);
  static constexpr double kNearTie = 1e-3;
  uint32_t vocab() const override { return vocab_; }
  std::string Check(std::span<const engine::Token> prompt, std::span<const engine::Token> out,
                    std::span<const uint64_t> versions, bool* whole_exact) override;
  std::string Summary() const override;
  // The served file's (version 1's) chat layout: what its engines make of
  // the same chat (llama::LlamaTokenizer::EncodeChat).
  std::optional<std::vector<engine::Token>> ChatPrompt(std::string_view text) const override;

 private:
  LlamaChecker() = default;
  std::map<uint64_t, std::string> files_;
  uint32_t threads_ = 1;
  uint32_t context_tokens_ = 4096;
  uint32_t vocab_ = 0;
  std::unique_ptr<llama::LlamaTokenizer> tokenizer_;   // version 1's; immutable, any thread
  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<llama::ReferenceDecoder>> decoders_;  // by version, lazily
  uint64_t checked_ = 0, near_ties_ = 0;   // under mu_
};

}  // namespace kvrelay::cli
