// llama_model.cc — LlamaModel over llama.cpp's C API: one llama_decode per
// engine step, one sequence per live request, lifecycle by freeing and
// re-making the context and the model.
#include "llama/llama_model.h"

#include <llama.h>

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include "base/check.h"
#include "engine/sampling.h"
#include "llama/llama_backend.h"

namespace kvrelay::llama {

std::string Unavailable() { return ""; }

namespace {

constexpr uint32_t kMaxSequences = 256;  // llama.cpp's LLAMA_MAX_SEQ

ModelInfo InfoOf(const llama_model* m, const std::string& path) {
  ModelInfo info;
  info.path = path;
  std::error_code ec;
  info.file_bytes = std::filesystem::file_size(path, ec);
  char buf[256] = {0};
  if (llama_model_meta_val_str(m, "general.name", buf, sizeof buf) > 0) {
    info.name = buf;
  } else {
    info.name = std::filesystem::path(path).stem().string();
  }
  info.vocab = static_cast<uint32_t>(llama_vocab_n_tokens(llama_model_get_vocab(m)));
  info.layers = static_cast<uint32_t>(llama_model_n_layer(m));
  info.embd = static_cast<uint32_t>(llama_model_n_embd(m));
  info.heads = static_cast<uint32_t>(llama_model_n_head(m));
  info.kv_heads = static_cast<uint32_t>(llama_model_n_head_kv(m));
  info.context_train = static_cast<uint32_t>(llama_model_n_ctx_train(m));
  info.params = llama_model_n_params(m);
  return info;
}

Result<llama_model*> LoadWeights(const std::string& path, bool vocab_only) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return NotFoundError("model file " + path + " does not exist");
  }
  EnsureBackends();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.vocab_only = vocab_only;
  llama_model* m = llama_model_load_from_file(path.c_str(), mp);
  if (m == nullptr) {
    return InternalError("llama.cpp could not load " + path +
                         " (not a GGUF model it supports; its log above says why)");
  }
  return m;
}

class LlamaModelImpl final : public LlamaModel {
 public:
  explicit LlamaModelImpl(const LlamaModelOptions& o) : options_(o) {
    batch_ = llama_batch_init(static_cast<int32_t>(o.batch_tokens), 0, 1);
  }
  ~LlamaModelImpl() override {
    FreeContext();
    if (model_ != nullptr) llama_model_free(model_);
    llama_batch_free(batch_);
  }

  const ModelInfo& info() const override { return info_; }
  engine::Residency Resident() const override {
    return engine::Residency{ctx_ != nullptr, model_ != nullptr, loaded_version_};
  }
  bool SharesBlocks() const override { return false; }
  uint32_t PrefillAlign() const override { return options_.batch_tokens; }
  bool EndsGeneration(engine::Token t) const override {
    return model_ != nullptr &&
           llama_vocab_is_eog(llama_model_get_vocab(model_), static_cast<llama_token>(t));
  }
  uint32_t vocab() const override { return info_.vocab; }
  std::string Describe() const override {
    return "llama.cpp " + info_.name + " (" + std::to_string(info_.layers) + " layers, embd " +
           std::to_string(info_.embd) + ", vocab " + std::to_string(info_.vocab) + ")";
  }

  void Run(std::span<const engine::SeqWork> batch, uint64_t weights_version,
           std::span<engine::Token> out) override;
  void Forget(uint64_t key) override;
  void ForgetAll() override;
  Status Reside(const engine::Residency& want) override;

 private:
  int32_t SeqFor(uint64_t key, uint32_t from);
  void BeginBatch();
  void AddToBatch(std::span<const engine::SeqWork> batch, size_t i);
  void DecodeAndSample(std::span<const engine::SeqWork> batch, std::span<engine::Token> out);
  Status MakeContext();
  void FreeContext();
  Result<std::string> FileOf(uint64_t version) const;

  const LlamaModelOptions options_;
  llama_model* model_ = nullptr;
  uint64_t loaded_version_ = 0;
  llama_context* ctx_ = nullptr;
  llama_batch batch_;
  ModelInfo info_;
  std::unordered_map<uint64_t, int32_t> seq_of_key_;
  std::vector<int32_t> free_seqs_;
  // Run's scratch: out's index per entry, and (entry, row) of the rows
  // whose logits the current llama_decode yields.
  std::vector<int32_t> out_of_entry_;
  std::vector<std::pair<size_t, int32_t>> rows_;
};

Result<std::string> LlamaModelImpl::FileOf(uint64_t version) const {
  auto it = options_.versions.find(version);
  if (it != options_.versions.end()) return it->second;
  if (version == 1) return options_.model_path;
  return NotFoundError("no weights file for version " + std::to_string(version) +
                       " (serve --weights-version " + std::to_string(version) + "=FILE.gguf)");
}

Status LlamaModelImpl::MakeContext() {
  KV_CHECK(model_ != nullptr && ctx_ == nullptr);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = options_.context_tokens;
  cp.n_batch = options_.batch_tokens;
  cp.n_ubatch = options_.batch_tokens;
  cp.n_seq_max = options_.max_sequences;
  cp.n_threads = static_cast<int32_t>(options_.threads);
  cp.n_threads_batch = static_cast<int32_t>(options_.threads);
  cp.kv_unified = true;  // one pool of cells, as the engine's block pool
  cp.no_perf = true;
  ctx_ = llama_init_from_model(model_, cp);
  if (ctx_ == nullptr) {
    return InternalError("llama.cpp could not make a context of " +
                         std::to_string(options_.context_tokens) + " tokens for " + info_.path);
  }
  free_seqs_.clear();
  for (int32_t s = static_cast<int32_t>(options_.max_sequences) - 1; s >= 0; --s) {
    free_seqs_.push_back(s);
  }
  seq_of_key_.clear();
  return Status::Ok();
}

void LlamaModelImpl::FreeContext() {
  if (ctx_ != nullptr) llama_free(ctx_);
  ctx_ = nullptr;
  seq_of_key_.clear();
  free_seqs_.clear();
}

Status LlamaModelImpl::Reside(const engine::Residency& want) {
  if (!want.weights) {
    FreeContext();
    if (model_ != nullptr) llama_model_free(model_);
    model_ = nullptr;
    return Status::Ok();
  }
  if (model_ == nullptr || loaded_version_ != want.weights_version) {
    // Load the new weights before letting the old ones go: a file that
    // does not load leaves the model as it was.
    Result<std::string> path = FileOf(want.weights_version);
    if (!path.ok()) return path.status();
    Result<llama_model*> m = LoadWeights(*path, /*vocab_only=*/false);
    if (!m.ok()) return m.status();
    ModelInfo info = InfoOf(*m, *path);
    if (model_ != nullptr && info.vocab != info_.vocab) {
      llama_model_free(*m);
      return InvalidArgumentError(*path + " has a vocabulary of " + std::to_string(info.vocab) +
                                  " tokens; the served model has " +
                                  std::to_string(info_.vocab));
    }
    FreeContext();
    if (model_ != nullptr) llama_model_free(model_);
    model_ = *m;
    info_ = std::move(info);
    loaded_version_ = want.weights_version;
  }
  if (!want.kv) {
    FreeContext();
    return Status::Ok();
  }
  if (ctx_ == nullptr) return MakeContext();
  return Status::Ok();
}

int32_t LlamaModelImpl::SeqFor(uint64_t key, uint32_t from) {
  auto it = seq_of_key_.find(key);
  if (it != seq_of_key_.end()) return it->second;
  // A sequence starts at its first token: the engine computed nothing of it
  // here before (a preempted request starts over from 0).
  KV_CHECK_EQ(from, 0u);
  KV_CHECK(!free_seqs_.empty());
  const int32_t s = free_seqs_.back();
  free_seqs_.pop_back();
  seq_of_key_.emplace(key, s);
  return s;
}

// Decode tokens share one llama_decode; each prefill chunk has one of its
// own, cut where llama.cpp alone cuts a prompt (PrefillAlign): llama.cpp's
// matrix and attention kernels sum in an order that depends on how many
// rows a batch has, so a prompt computed beside other rows could end on
// another first token when two logits nearly tie. Alone, with the same
// cuts, it ends on llama.cpp's.
void LlamaModelImpl::Run(std::span<const engine::SeqWork> batch, uint64_t weights_version,
                         std::span<engine::Token> out) {
  KV_CHECK(ctx_ != nullptr && model_ != nullptr);
  KV_CHECK_EQ(weights_version, loaded_version_);
  // out's index of each entry that wants a token.
  out_of_entry_.assign(batch.size(), -1);
  int32_t wanting = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    // llama.cpp samples from the logits of a token it computes in this
    // batch: a token is always wanted right after a computed one.
    KV_CHECK(!batch[i].wants_token || batch[i].to > batch[i].from);
    if (batch[i].wants_token) out_of_entry_[i] = wanting++;
  }
  KV_CHECK_EQ(static_cast<size_t>(wanting), out.size());
  BeginBatch();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].prefill && batch[i].to > batch[i].from) AddToBatch(batch, i);
  }
  DecodeAndSample(batch, out);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].prefill || batch[i].to == batch[i].from) continue;
    BeginBatch();
    AddToBatch(batch, i);
    DecodeAndSample(batch, out);
  }
}

void LlamaModelImpl::BeginBatch() {
  batch_.n_tokens = 0;
  rows_.clear();
}

void LlamaModelImpl::AddToBatch(std::span<const engine::SeqWork> batch, size_t i) {
  const engine::SeqWork& w = batch[i];
  const int32_t seq = SeqFor(w.key, w.from);
  KV_CHECK_LE(batch_.n_tokens + (w.to - w.from), options_.batch_tokens);
  for (uint32_t t = w.from; t < w.to; ++t) {
    const int32_t row = batch_.n_tokens++;
    batch_.token[row] = static_cast<llama_token>(w.tokens[t]);
    batch_.pos[row] = static_cast<llama_pos>(t);
    batch_.n_seq_id[row] = 1;
    batch_.seq_id[row][0] = seq;
    batch_.logits[row] = (w.wants_token && t + 1 == w.to) ? 1 : 0;
  }
  if (w.wants_token) rows_.push_back({i, batch_.n_tokens - 1});
}

void LlamaModelImpl::DecodeAndSample(std::span<const engine::SeqWork> batch,
                                     std::span<engine::Token> out) {
  if (batch_.n_tokens == 0) return;
  const int32_t rc = llama_decode(ctx_, batch_);
  // The pool admitted this step: its cells exist (context = pool size).
  KV_CHECK_MSG(rc == 0, "llama_decode failed");
  for (const auto& [entry, row] : rows_) {
    const engine::SeqWork& w = batch[entry];
    const float* logits = llama_get_logits_ith(ctx_, row);
    KV_CHECK(logits != nullptr);
    out[static_cast<size_t>(out_of_entry_[entry])] = engine::SampleToken(
        std::span<const float>(logits, info_.vocab), w.sampling,
        static_cast<uint32_t>(w.tokens.size()));
  }
}

void LlamaModelImpl::Forget(uint64_t key) {
  auto it = seq_of_key_.find(key);
  if (it == seq_of_key_.end()) return;
  if (ctx_ != nullptr) llama_memory_seq_rm(llama_get_memory(ctx_), it->second, -1, -1);
  free_seqs_.push_back(it->second);
  seq_of_key_.erase(it);
  // The last sequence gone: clear the cache, so the next one starts at
  // cell 0. Removing a sequence frees its cells but not the span the
  // attention walks (up to the highest cell in use, which llama.cpp keeps
  // moving forward); a lone request would attend over its predecessors'
  // empty cells (measured: decode at 0.70 of llama.cpp alone, 2 layers).
  if (seq_of_key_.empty() && ctx_ != nullptr) {
    llama_memory_clear(llama_get_memory(ctx_), /*data=*/false);
  }
}

void LlamaModelImpl::ForgetAll() {
  if (ctx_ != nullptr) llama_memory_clear(llama_get_memory(ctx_), /*data=*/false);
  seq_of_key_.clear();
  free_seqs_.clear();
  for (int32_t s = static_cast<int32_t>(options_.max_sequences) - 1; s >= 0; --s) {
    free_seqs_.push_back(s);
  }
}

class LlamaTokenizerImpl final : public LlamaTokenizer {
 public:
  explicit LlamaTokenizerImpl(llama_model* m)
      : model_(m), vocab_(llama_model_get_vocab(m)),
        n_vocab_(static_cast<uint32_t>(llama_vocab_n_tokens(vocab_))) {}
  ~LlamaTokenizerImpl() override { llama_model_free(model_); }

  std::vector<engine::Token> Encode(std::string_view text) const override {
    std::vector<llama_token> ids(text.size() + 8);
    int32_t n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                               static_cast<int32_t>(ids.size()), /*add_special=*/false,
                               /*parse_special=*/false);
    if (n < 0) {
      ids.resize(static_cast<size_t>(-n));
      n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                         static_cast<int32_t>(ids.size()), false, false);
      KV_CHECK_GE(n, 0);
    }
    return std::vector<engine::Token>(ids.begin(), ids.begin() + n);
  }

  std::string Decode(std::span<const engine::Token> tokens) const override {
    std::string out;
    char buf[256];
    for (const engine::Token t : tokens) {
      if (t >= n_vocab_) continue;
      const int32_t n = llama_token_to_piece(vocab_, static_cast<llama_token>(t), buf,
                                             sizeof buf, 0, /*special=*/false);
      if (n > 0) out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  uint32_t vocab() const override { return n_vocab_; }

 private:
  llama_model* const model_;
  const llama_vocab* const vocab_;
  const uint32_t n_vocab_;
};

}  // namespace

Result<std::unique_ptr<LlamaModel>> LlamaModel::Open(const LlamaModelOptions& options) {
  if (options.model_path.empty()) return InvalidArgumentError("no model file (--model FILE.gguf)");
  if (options.threads == 0) return InvalidArgumentError("threads must be at least 1");
  if (options.max_sequences == 0 || options.max_sequences > kMaxSequences) {
    return InvalidArgumentError("llama.cpp runs 1 to " + std::to_string(kMaxSequences) +
                                " sequences at once (--max-running)");
  }
  if (options.batch_tokens < options.max_sequences) {
    return InvalidArgumentError("a step's decode tokens (one per running request, " +
                                std::to_string(options.max_sequences) +
                                ") must fit llama.cpp's batch of " +
                                std::to_string(options.batch_tokens) + " tokens");
  }
  if (options.batch_tokens == 0 || options.context_tokens < options.batch_tokens) {
    return InvalidArgumentError("the KV context (" + std::to_string(options.context_tokens) +
                                " tokens) must hold one batch (" +
                                std::to_string(options.batch_tokens) + " tokens)");
  }
  auto model = std::make_unique<LlamaModelImpl>(options);
  Status s = model->Reside(engine::Residency{true, true, 1});
  if (!s.ok()) return s;
  return std::unique_ptr<LlamaModel>(std::move(model));
}

Result<std::unique_ptr<LlamaTokenizer>> LlamaTokenizer::Open(const std::string& path) {
  Result<llama_model*> m = LoadWeights(path, /*vocab_only=*/true);
  if (!m.ok()) return m.status();
  return std::unique_ptr<LlamaTokenizer>(std::make_unique<LlamaTokenizerImpl>(*m));
}

}  // namespace kvrelay::llama
