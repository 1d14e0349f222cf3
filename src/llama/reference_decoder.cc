// reference_decoder.cc — the plain llama.cpp loop.
#include "llama/reference_decoder.h"

#include <llama.h>

#include <algorithm>

#include "base/check.h"
#include "engine/sampling.h"
#include "llama/llama_backend.h"

namespace kvrelay::llama {
namespace {

class ReferenceDecoderImpl final : public ReferenceDecoder {
 public:
  ReferenceDecoderImpl(llama_model* m, llama_context* c, uint32_t batch_tokens)
      : model_(m), ctx_(c), batch_tokens_(batch_tokens),
        vocab_(static_cast<uint32_t>(llama_vocab_n_tokens(llama_model_get_vocab(m)))) {}
  ~ReferenceDecoderImpl() override {
    llama_free(ctx_);
    llama_model_free(model_);
  }

  std::vector<engine::Token> Generate(std::span<const engine::Token> prompt, uint32_t n,
                                      const engine::Sampling& sampling,
                                      bool ignore_eos) override {
    llama_memory_clear(llama_get_memory(ctx_), false);
    std::vector<llama_token> seq(prompt.begin(), prompt.end());
    std::vector<engine::Token> out;
    size_t done = 0;
    while (out.size() < n) {
      // The prompt in batches, then each new token alone.
      const size_t end = std::min(seq.size(), done + batch_tokens_);
      llama_batch b = llama_batch_get_one(seq.data() + done, static_cast<int32_t>(end - done));
      KV_CHECK_MSG(llama_decode(ctx_, b) == 0, "llama_decode failed");
      done = end;
      if (done < seq.size()) continue;
      const float* logits = llama_get_logits_ith(ctx_, -1);
      const engine::Token t = engine::SampleToken(std::span<const float>(logits, vocab_),
                                                  sampling, static_cast<uint32_t>(seq.size()));
      out.push_back(t);
      seq.push_back(static_cast<llama_token>(t));
      if (!ignore_eos && llama_vocab_is_eog(llama_model_get_vocab(model_),
                                            static_cast<llama_token>(t))) {
        break;
      }
    }
    return out;
  }

  std::vector<float> LogitsAfter(std::span<const engine::Token> prompt) override {
    llama_memory_clear(llama_get_memory(ctx_), false);
    std::vector<llama_token> seq(prompt.begin(), prompt.end());
    for (size_t done = 0; done < seq.size();) {
      const size_t end = std::min(seq.size(), done + batch_tokens_);
      llama_batch b = llama_batch_get_one(seq.data() + done, static_cast<int32_t>(end - done));
      KV_CHECK_MSG(llama_decode(ctx_, b) == 0, "llama_decode failed");
      done = end;
    }
    const float* logits = llama_get_logits_ith(ctx_, -1);
    return std::vector<float>(logits, logits + vocab_);
  }

 private:
  llama_model* const model_;
  llama_context* const ctx_;
  const uint32_t batch_tokens_;
  const uint32_t vocab_;
};

}  // namespace

Result<std::unique_ptr<ReferenceDecoder>> ReferenceDecoder::Open(const ReferenceOptions& o) {
  EnsureBackends();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* m = llama_model_load_from_file(o.model_path.c_str(), mp);
  if (m == nullptr) return InternalError("llama.cpp could not load " + o.model_path);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = o.context_tokens;
  cp.n_batch = o.batch_tokens;
  cp.n_ubatch = o.batch_tokens;
  cp.n_seq_max = o.engine_context ? o.max_sequences : 1;
  cp.kv_unified = o.engine_context;
  cp.n_threads = static_cast<int32_t>(o.threads);
  cp.n_threads_batch = static_cast<int32_t>(o.threads);
  cp.no_perf = true;
  llama_context* c = llama_init_from_model(m, cp);
  if (c == nullptr) {
    llama_model_free(m);
    return InternalError("llama.cpp could not make a context for " + o.model_path);
  }
  return std::unique_ptr<ReferenceDecoder>(
      std::make_unique<ReferenceDecoderImpl>(m, c, o.batch_tokens));
}

}  // namespace kvrelay::llama
