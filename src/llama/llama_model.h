// llama_model.h — LlamaModel: a llama.cpp model behind the engine's
// ComputeModel seam (engine/compute_model.h), and LlamaTokenizer, its
// vocabulary for the HTTP threads.
//
// Why: the engine's scheduler, pool, connector and lifecycle rules are the
// emulated engine's, unchanged; only the compute differs. Each engine step
// is one llama_decode over the scheduled sequences (prefill chunks and
// decode tokens together). Every live request is a llama.cpp sequence in
// one unified KV cache of num_blocks × block_tokens cells, so the engine's
// block accounting is what keeps llama.cpp's cache from filling: a step the
// pool admitted always finds its cells. Preemption and the end of a request
// remove the sequence's cells (llama_memory_seq_rm); a pool reset clears the
// cache. There is no prefix cache: a sequence's KV lives in its own cells
// (SharesBlocks() is false; the engine runs with prefix caching off).
//
// P/D: ExportKv frames a finished prefill's sequence state (kv_export.h)
// into the request's blocks; ImportKv joins the blocks that landed on D,
// checks the sender's identity (this weights file's XXH64, llama.cpp's
// version) and imports them into a free sequence. Identity() is the
// loaded file's fingerprint, so P and D serving different files refuse
// each other's KV at the first pull.
//
// Lifecycle: Reside() frees the KV context (sleep 1, release), also the
// weights (sleep 2), and loads them back (wake_up) or loads another GGUF
// (update_weights: version 1 is --model, others come from `versions`).
//
// This header does not include llama.h: without llama.cpp the build keeps
// llama_missing.cc, whose Open() says why the engine is unavailable.
//
// Ownership and threading: the driver owns the model and keeps it alive as
// long as the engine; every call on the engine's thread. llama.cpp computes
// on `threads` threads of its own inside Run(). LlamaTokenizer is immutable
// and safe from any thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "engine/compute_model.h"
#include "llama/kv_export.h"

namespace kvrelay::llama {

// "" when the llama.cpp engine is built in; else why not, for the user.
std::string Unavailable();

struct LlamaModelOptions {
  std::string model_path;                    // weights version 1
  std::map<uint64_t, std::string> versions;  // update_weights version → GGUF
  uint32_t threads = 2;                      // llama.cpp's compute threads
  uint32_t context_tokens = 4096;            // KV cells: num_blocks × block_tokens
  // Sequences at once (≤ 256): the engine's max_running, more on D, where
  // loads that land join the running requests whatever their count.
  uint32_t max_sequences = 32;
  // llama.cpp's n_batch: a prefill chunk's most tokens; decode tokens
  // beyond it go in a second llama_decode of the same step. The engine's
  // token budget should hold one chunk and every decode token of a step:
  // batch_tokens + max_sequences.
  uint32_t batch_tokens = 512;
};

// What a GGUF file holds, as the server and the logs tell it.
struct ModelInfo {
  std::string name;          // general.name, else the file's stem
  std::string path;
  uint64_t file_bytes = 0;
  uint32_t vocab = 0;
  uint32_t layers = 0, embd = 0, heads = 0, kv_heads = 0;
  uint32_t context_train = 0;
  uint64_t params = 0;
  // P/D: the KV one sequence exports (kv_export.h), measured at Open by
  // exporting a probe: bytes per token and the fixed rest. A block that
  // carries it needs KvBlockBytes(block_tokens).
  uint64_t kv_bytes_per_token = 0;
  uint64_t kv_fixed_bytes = 0;
  // Bytes a block of `block_tokens` tokens must hold so that any sequence
  // of n tokens, framed (kKvFrameHeaderBytes), fits the ceil(n /
  // block_tokens) blocks the engine gives it.
  // (The worst case is a sequence of exactly block_tokens tokens: one
  // block holds the header, the fixed bytes and a full block of tokens.)
  uint64_t KvBlockBytes(uint32_t block_tokens) const {
    return uint64_t{block_tokens} * kv_bytes_per_token + kv_fixed_bytes + kKvFrameHeaderBytes;
  }
};

// The engine's shape for a llama.cpp model: its blocks carry llama.cpp's
// sequence state as opaque bytes (kv_export.h), one layer of K|V pieces per
// head group, each block at least info.KvBlockBytes(block_tokens); the
// vocabulary and context are the model's (context at most `context_tokens`).
inline engine::ModelShape ShapeFor(const ModelInfo& info, uint32_t block_tokens,
                                   uint32_t context_tokens) {
  engine::ModelShape shape;
  shape.name = info.name;
  shape.layers = 1;
  shape.kv_heads = engine::kHeadGroups;
  shape.dtype_bytes = 2;
  shape.block_tokens = block_tokens;
  const uint64_t bytes_per_dim = uint64_t{2} * engine::kHeadGroups * block_tokens * 2;
  shape.head_dim = static_cast<uint32_t>(
      (info.KvBlockBytes(block_tokens) + bytes_per_dim - 1) / bytes_per_dim);
  shape.vocab = info.vocab;
  shape.max_context =
      info.context_train > 0 ? std::min(context_tokens, info.context_train) : context_tokens;
  return shape;
}

class LlamaModel : public engine::ComputeModel {
 public:
  // Loads version 1 (options.model_path) and makes its KV context.
  // kInvalidArgument for bad options, kNotFound / kInternal for a file that
  // does not load, kUnavailable without llama.cpp.
  static Result<std::unique_ptr<LlamaModel>> Open(const LlamaModelOptions& options);
  virtual const ModelInfo& info() const = 0;
  // What is resident now: the KV context, the weights and their version.
  virtual engine::Residency Resident() const = 0;
};

class LlamaTokenizer {
 public:
  // The vocabulary of a GGUF file (its weights are not loaded).
  static Result<std::unique_ptr<LlamaTokenizer>> Open(const std::string& path);
  virtual ~LlamaTokenizer() = default;
  // Text → ids, as the model's tokenizer splits it, no BOS added.
  virtual std::vector<engine::Token> Encode(std::string_view text) const = 0;
  // Ids → text (each token's piece, concatenated).
  virtual std::string Decode(std::span<const engine::Token> tokens) const = 0;
  // A chat's (role, content) messages → the prompt's ids up to where the
  // assistant's answer starts: laid out by the file's chat template
  // (llama_chat_apply_template: the templates llama.cpp knows; ChatML when
  // the file has none or another), tokenized as llama.cpp's server does a
  // chat: special tokens read as such (in the messages' text too), BOS
  // added if the file asks for it.
  virtual std::vector<engine::Token> EncodeChat(
      std::span<const std::pair<std::string, std::string>> messages) const = 0;
  virtual uint32_t vocab() const = 0;
};

}  // namespace kvrelay::llama
