// llama_checker.cc — LlamaChecker: outputs against llama.cpp alone.
#include "cli/llama_checker.h"

#include "engine/sampling.h"
#include "llama/llama_model.h"

namespace kvrelay::cli {

Result<std::shared_ptr<LlamaChecker>> LlamaChecker::Open(std::map<uint64_t, std::string> files,
                                                         uint32_t threads,
                                                         uint32_t context_tokens) {
  if (files.count(1) == 0) return InvalidArgumentError("no model file for weights version 1");
  Result<std::unique_ptr<llama::LlamaTokenizer>> tok = llama::LlamaTokenizer::Open(files.at(1));
  if (!tok.ok()) return tok.status();
  std::shared_ptr<LlamaChecker> c(new LlamaChecker());
  c->files_ = std::move(files);
  c->threads_ = threads;
  c->context_tokens_ = context_tokens;
  c->vocab_ = (*tok)->vocab();
  c->tokenizer_ = std::move(*tok);
  return c;
}

std::optional<std::vector<engine::Token>> LlamaChecker::ChatPrompt(std::string_view text) const {
  const std::pair<std::string, std::string> m{"user", std::string(text)};
  return tokenizer_->EncodeChat({&m, 1});
}

std::string LlamaChecker::Check(std::span<const engine::Token> prompt,
                                std::span<const engine::Token> out,
                                std::span<const uint64_t> versions, bool* whole_exact) {
  *whole_exact = false;
  if (out.empty()) return "no tokens";
  if (versions.size() != out.size()) return "a weights version per token missing";
  if (prompt.size() + out.size() > context_tokens_) {
    return "a prompt and output of " + std::to_string(prompt.size() + out.size()) +
           " tokens exceed the checker's context of " + std::to_string(context_tokens_);
  }
  const uint64_t v = versions[0];
  auto file = files_.find(v);
  if (file == files_.end()) return "no model file for weights version " + std::to_string(v);
  // The load's requests: temperature 1, seed 0 (the server's defaults),
  // ignore_eos.
  const engine::Sampling sampling{1.0f, 0};
  std::vector<engine::Token> want;
  bool near_tie = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<llama::ReferenceDecoder>& d = decoders_[v];
    if (!d) {
      llama::ReferenceOptions ro;
      ro.model_path = file->second;
      ro.threads = threads_;
      ro.context_tokens = context_tokens_;
      Result<std::unique_ptr<llama::ReferenceDecoder>> r = llama::ReferenceDecoder::Open(ro);
      if (!r.ok()) return "reference decoder: " + r.status().message();
      d = std::move(*r);
    }
    want = d->Generate(prompt, static_cast<uint32_t>(out.size()), sampling, /*ignore_eos=*/true);
    ++checked_;
    if (!want.empty() && out[0] != want[0]) {
      const std::vector<float> logits = d->LogitsAfter(prompt);
      near_tie = engine::WithinDrawMargin(logits, sampling, static_cast<uint32_t>(prompt.size()),
                                          out[0], kNearTie);
      near_ties_ += near_tie ? 1 : 0;
    }
  }
  if (want.empty() || (out[0] != want[0] && !near_tie)) {
    return "first token " + std::to_string(out[0]) + ", llama.cpp alone gives " +
           (want.empty() ? std::string("none") : std::to_string(want[0])) + " (weights v" +
           std::to_string(v) + ")";
  }
  bool one_version = true;
  for (uint64_t x : versions) one_version = one_version && x == v;
  *whole_exact = one_version && want.size() == out.size() &&
                 std::equal(want.begin(), want.end(), out.begin());
  return "";
}

std::string LlamaChecker::Summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return "first tokens: " + std::to_string(checked_ - near_ties_) + " of " +
         std::to_string(checked_) + " exact, " + std::to_string(near_ties_) +
         " a near tie (within 1e-3 of flipping)";
}

}  // namespace kvrelay::cli
