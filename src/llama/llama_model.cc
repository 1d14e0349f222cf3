// llama_model.cc — LlamaModel over llama.cpp's C API: one llama_decode per
// engine step, one sequence per live request, lifecycle by freeing and
// re-making the context and the model.
#include "llama/llama_model.h"

#include <llama.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "base/check.h"
#include "engine/sampling.h"
#include "llama/kv_export.h"
#include "llama/llama_backend.h"
#include "os/clock.h"

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
  Status ExportKv(uint64_t key, uint32_t n_tokens, std::span<const BlockId> blocks,
                  engine::KvMemory& memory) override {
    return Counted(&costs_.exports, &costs_.exported_tokens, &costs_.export_ns, n_tokens,
                   [&] { return CopyOut(key, n_tokens, blocks, memory); });
  }
  Status ImportKv(uint64_t key, uint32_t n_tokens, std::span<const BlockId> blocks,
                  engine::KvMemory& memory) override {
    return Counted(&costs_.imports, &costs_.imported_tokens, &costs_.import_ns, n_tokens,
                   [&] { return CopyIn(key, n_tokens, blocks, memory); });
  }
  engine::KvCopyCosts CopyCosts() const override { return costs_; }
  uint64_t Identity() const override { return fingerprint_; }
  bool NextTokenFromKv() const override { return false; }

  // Measures info_.kv_bytes_per_token / kv_fixed_bytes (Open).
  Status ProbeKvSize();

 private:
  // Runs `copy`; if it succeeded, counts it, its tokens and its time.
  template <typename Copy>
  static Status Counted(uint64_t* copies, uint64_t* tokens, uint64_t* ns, uint32_t n_tokens,
                        Copy copy) {
    const Instant t0 = MonoNow();
    Status s = copy();
    if (s.ok()) {
      ++*copies;
      *tokens += n_tokens;
      *ns += static_cast<uint64_t>((MonoNow() - t0).ns());
    }
    return s;
  }
  Status CopyOut(uint64_t key, uint32_t n_tokens, std::span<const BlockId> blocks,
                 engine::KvMemory& memory);
  Status CopyIn(uint64_t key, uint32_t n_tokens, std::span<const BlockId> blocks,
                engine::KvMemory& memory);
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
  uint64_t fingerprint_ = 0;   // ModelFingerprint of the loaded file
  std::unordered_map<uint64_t, int32_t> seq_of_key_;
  std::vector<int32_t> free_seqs_;
  // Run's scratch: out's index per entry, and (entry, row) of the rows
  // whose logits the current llama_decode yields.
  std::vector<int32_t> out_of_entry_;
  std::vector<std::pair<size_t, int32_t>> rows_;
  std::vector<engine::SeqWork> redo_;   // Run's batch, last positions redone
  // ExportKv / ImportKv scratch: a block's pieces, block contents.
  std::vector<std::span<uint8_t>> pieces_;
  std::vector<std::vector<uint8_t>> joined_;
  std::vector<uint8_t> state_;   // CopyOut's export, its capacity reused
  KvReceived received_;          // CopyIn's joined state, its capacity reused
  engine::KvCopyCosts costs_;   // the copies that succeeded (engine thread)
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
    Result<uint64_t> fingerprint = ModelFingerprint(*path);
    if (!fingerprint.ok()) {
      llama_model_free(*m);
      return fingerprint.status();
    }
    if (model_ != nullptr && info.vocab != info_.vocab) {
      llama_model_free(*m);
      return InvalidArgumentError(*path + " has a vocabulary of " + std::to_string(info.vocab) +
                                  " tokens; the served model has " +
                                  std::to_string(info_.vocab));
    }
    FreeContext();
    if (model_ != nullptr) llama_model_free(model_);
    model_ = *m;
    info.kv_bytes_per_token = info_.kv_bytes_per_token;  // same layout: ProbeKvSize's
    info.kv_fixed_bytes = info_.kv_fixed_bytes;
    info_ = std::move(info);
    fingerprint_ = *fingerprint;
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
    if (batch[i].wants_token) out_of_entry_[i] = wanting++;
  }
  KV_CHECK_EQ(static_cast<size_t>(wanting), out.size());
  // llama.cpp samples from the logits of a token it computes in a batch,
  // and logits are not part of the KV: a token wanted from KV alone (D
  // after an import, without P's token) recomputes the last position.
  redo_.assign(batch.begin(), batch.end());
  for (engine::SeqWork& w : redo_) {
    if (!w.wants_token || w.to > w.from) continue;
    KV_CHECK_GT(w.from, 0u);
    llama_memory_seq_rm(llama_get_memory(ctx_), SeqFor(w.key, w.from), w.from - 1, -1);
    --w.from;
  }
  const std::span<const engine::SeqWork> work(redo_);
  BeginBatch();
  for (size_t i = 0; i < work.size(); ++i) {
    if (work[i].prefill || work[i].to == work[i].from) continue;
    // More decode tokens than llama.cpp's batch (D's imports can take the
    // running count past max_running): another llama_decode.
    if (batch_.n_tokens + (work[i].to - work[i].from) > options_.batch_tokens) {
      DecodeAndSample(work, out);
      BeginBatch();
    }
    AddToBatch(work, i);
  }
  DecodeAndSample(work, out);
  for (size_t i = 0; i < work.size(); ++i) {
    if (!work[i].prefill || work[i].to == work[i].from) continue;
    BeginBatch();
    AddToBatch(work, i);
    DecodeAndSample(work, out);
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

// Two tokens in sequence 0 of the fresh context, exported: the state's
// bytes per token and fixed bytes, whatever the cache's types and layout.
Status LlamaModelImpl::ProbeKvSize() {
  KV_CHECK(ctx_ != nullptr && seq_of_key_.empty());
  BeginBatch();
  for (int32_t t = 0; t < 2; ++t) {
    batch_.token[t] = std::min<llama_token>(t, static_cast<llama_token>(info_.vocab) - 1);
    batch_.pos[t] = t;
    batch_.n_seq_id[t] = 1;
    batch_.seq_id[t][0] = 0;
    batch_.logits[t] = 0;
  }
  batch_.n_tokens = 2;
  if (llama_decode(ctx_, batch_) != 0) return InternalError("llama.cpp could not decode a probe");
  Result<std::vector<uint8_t>> state = ExportSequence(ctx_, 0);
  llama_memory_clear(llama_get_memory(ctx_), /*data=*/false);
  batch_.n_tokens = 0;
  if (!state.ok()) return state.status();
  Result<KvStateInfo> described = DescribeState(*state);
  if (!described.ok()) return described.status();
  info_.kv_bytes_per_token = described->bytes_per_token;
  info_.kv_fixed_bytes = described->fixed_bytes;
  return Status::Ok();
}

// The sequence's state, framed, written across the blocks' pieces in
// order (engine/kv_memory.h BlockBytes); blocks past the frame's are left
// as they are (D reads the frame's count from its header).
Status LlamaModelImpl::CopyOut(uint64_t key, uint32_t n_tokens, std::span<const BlockId> blocks,
                                engine::KvMemory& memory) {
  if (ctx_ == nullptr) return FailedPreconditionError("the KV context is not resident");
  auto it = seq_of_key_.find(key);
  if (it == seq_of_key_.end() || blocks.empty()) {
    return FailedPreconditionError("no KV to export for this request");
  }
  if (Status s = ExportSequenceInto(ctx_, it->second, &state_); !s.ok()) return s;
  const std::span<const uint8_t> state(state_);
  Result<KvStateInfo> described = DescribeState(state);
  if (!described.ok()) return described.status();
  if (described->n_tokens != n_tokens || described->pos_min != 0 ||
      described->pos_max + 1 != static_cast<int32_t>(n_tokens)) {
    return InternalError("the sequence holds " + std::to_string(described->n_tokens) +
                         " tokens (positions " + std::to_string(described->pos_min) + ".." +
                         std::to_string(described->pos_max) + "), not the prompt's " +
                         std::to_string(n_tokens));
  }
  memory.BlockBytes(blocks[0], &pieces_);
  size_t block_bytes = 0;
  for (const auto& p : pieces_) block_bytes += p.size();
  if (block_bytes < kKvFrameHeaderBytes) {
    return FailedPreconditionError("the engine's blocks hold no bytes for llama.cpp's KV");
  }
  const size_t needed = BlocksFor(state.size(), block_bytes);
  if (needed > blocks.size()) {
    return ResourceExhaustedError(std::to_string(state.size()) + " bytes of KV need " +
                                  std::to_string(needed) + " blocks of " +
                                  std::to_string(block_bytes) + " bytes; the request has " +
                                  std::to_string(blocks.size()));
  }
  // Straight into the blocks' pieces: no copy of the frame in between.
  size_t pieces_of = SIZE_MAX;   // the block pieces_ holds
  Result<size_t> framed = FrameInto(
      LocalIdentity(fingerprint_), state, block_bytes,
      [&](size_t b, size_t offset, std::span<const uint8_t> bytes) {
        if (b != pieces_of) {
          memory.BlockBytes(blocks[b], &pieces_);
          pieces_of = b;
        }
        for (const auto& p : pieces_) {   // the pieces [offset, offset + bytes) falls in
          if (bytes.empty()) break;
          if (offset >= p.size()) {
            offset -= p.size();
            continue;
          }
          const size_t n = std::min(p.size() - offset, bytes.size());
          std::memcpy(p.data() + offset, bytes.data(), n);
          bytes = bytes.subspan(n);
          offset = 0;
        }
        KV_CHECK(bytes.empty());
      });
  if (!framed.ok()) return framed.status();
  KV_CHECK_EQ(*framed, needed);
  return Status::Ok();
}

Status LlamaModelImpl::CopyIn(uint64_t key, uint32_t n_tokens, std::span<const BlockId> blocks,
                                engine::KvMemory& memory) {
  if (ctx_ == nullptr) return FailedPreconditionError("the KV context is not resident");
  KV_CHECK(seq_of_key_.find(key) == seq_of_key_.end());
  if (blocks.empty()) return DataLossError("no KV blocks");
  auto gather = [&](BlockId b, std::vector<uint8_t>* out) {
    memory.BlockBytes(b, &pieces_);
    out->clear();
    for (const auto& p : pieces_) out->insert(out->end(), p.begin(), p.end());
  };
  joined_.resize(std::max<size_t>(joined_.size(), 1));
  gather(blocks[0], &joined_[0]);
  Result<uint32_t> count = FramedBlockCount(joined_[0]);
  if (!count.ok()) return count.status();
  if (*count == 0 || *count > blocks.size()) {
    return DataLossError("the KV frame says " + std::to_string(*count) + " blocks; " +
                         std::to_string(blocks.size()) + " landed");
  }
  if (joined_.size() < *count) joined_.resize(*count);
  std::vector<std::span<const uint8_t>> spans;
  spans.reserve(*count);
  for (uint32_t b = 0; b < *count; ++b) {
    if (b > 0) gather(blocks[b], &joined_[b]);
    spans.emplace_back(joined_[b]);
  }
  KvReceived* received = &received_;
  if (Status s = JoinBlocksInto(spans, LocalIdentity(fingerprint_), received); !s.ok()) {
    return s;
  }
  if (received->n_tokens != n_tokens || received->pos_min != 0 ||
      received->pos_max + 1 != static_cast<int32_t>(n_tokens)) {
    return FailedPreconditionError("the KV holds " + std::to_string(received->n_tokens) +
                                   " tokens; the prompt has " + std::to_string(n_tokens));
  }
  if (free_seqs_.empty()) {
    return ResourceExhaustedError("no free llama.cpp sequence for the loaded KV");
  }
  const int32_t seq = free_seqs_.back();
  if (Status s = ImportSequence(ctx_, seq, received->state); !s.ok()) return s;
  free_seqs_.pop_back();
  seq_of_key_.emplace(key, seq);
  return Status::Ok();
}

class LlamaTokenizerImpl final : public LlamaTokenizer {
 public:
  explicit LlamaTokenizerImpl(llama_model* m)
      : model_(m), vocab_(llama_model_get_vocab(m)),
        n_vocab_(static_cast<uint32_t>(llama_vocab_n_tokens(vocab_))) {}
  ~LlamaTokenizerImpl() override { llama_model_free(model_); }

  std::vector<engine::Token> Encode(std::string_view text) const override {
    return Tokenize(text, /*add_special=*/false, /*parse_special=*/false);
  }

  std::vector<engine::Token> EncodeChat(
      std::span<const std::pair<std::string, std::string>> messages) const override {
    std::vector<llama_chat_message> chat;
    size_t chars = 0;
    for (const auto& [role, content] : messages) {
      chat.push_back(llama_chat_message{role.c_str(), content.c_str()});
      chars += role.size() + content.size();
    }
    const char* tmpl = llama_model_chat_template(model_, nullptr);
    std::string out(2 * chars + 256, '\0');
    int32_t n = -1;
    for (const char* t : {tmpl, "chatml"}) {
      if (t == nullptr) continue;
      n = llama_chat_apply_template(t, chat.data(), chat.size(), /*add_ass=*/true, out.data(),
                                    static_cast<int32_t>(out.size()));
      if (n > static_cast<int32_t>(out.size())) {
        out.resize(static_cast<size_t>(n));
        n = llama_chat_apply_template(t, chat.data(), chat.size(), true, out.data(), n);
      }
      if (n >= 0) break;   // else a template llama.cpp does not know: ChatML
    }
    KV_CHECK_GE(n, 0);   // ChatML is built in
    out.resize(static_cast<size_t>(n));
    // As llama.cpp's server tokenizes a chat: BOS if the file asks for it.
    return Tokenize(out, /*add_special=*/true, /*parse_special=*/true);
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
  std::vector<engine::Token> Tokenize(std::string_view text, bool add_special,
                                      bool parse_special) const {
    std::vector<llama_token> ids(text.size() + 8);
    int32_t n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                               static_cast<int32_t>(ids.size()), add_special, parse_special);
    if (n < 0) {
      ids.resize(static_cast<size_t>(-n));
      n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                         static_cast<int32_t>(ids.size()), add_special, parse_special);
      KV_CHECK_GE(n, 0);
    }
    return std::vector<engine::Token>(ids.begin(), ids.begin() + n);
  }

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
  if (options.batch_tokens == 0 || options.context_tokens < options.batch_tokens) {
    return InvalidArgumentError("the KV context (" + std::to_string(options.context_tokens) +
                                " tokens) must hold one batch (" +
                                std::to_string(options.batch_tokens) + " tokens)");
  }
  auto model = std::make_unique<LlamaModelImpl>(options);
  Status s = model->Reside(engine::Residency{true, true, 1});
  if (!s.ok()) return s;
  if (s = model->ProbeKvSize(); !s.ok()) return s;
  return std::unique_ptr<LlamaModel>(std::move(model));
}

Result<std::unique_ptr<LlamaTokenizer>> LlamaTokenizer::Open(const std::string& path) {
  Result<llama_model*> m = LoadWeights(path, /*vocab_only=*/true);
  if (!m.ok()) return m.status();
  return std::unique_ptr<LlamaTokenizer>(std::make_unique<LlamaTokenizerImpl>(*m));
}

}  // namespace kvrelay::llama
