// model_maker.h — MakeModel: writes a small, random-weight llama-architecture
// GGUF that llama.cpp loads, runs and tokenizes with.
//
// Why: the llama engine's tests, demos and benchmarks need a real model
// file without downloading one. A made model is a few MB (or a few hundred
// for a 12-layer one), built in well under a second from its options, and
// byte-identical for the same options, so a test can make it on the spot.
// Its outputs are meaningless but deterministic: what matters to kvrelay is
// that the KV cache, the logits and the tokenizer are llama.cpp's own.
//
// The file: general.architecture "llama"; matrices F16 and norms F32, drawn
// from a splitmix64 stream seeded by (seed, tensor name) — so models that
// differ only in layer count share their common tensors; norms 1.0. The
// tokenizer is SentencePiece-style (tokenizer.ggml.model "llama"): <unk>=0,
// <s>=1 (BOS), </s>=2 (EOS), the 256 byte tokens <0x00>..<0xFF> (3..258),
// then pieces of English ("▁the", "▁world", ",", letter pairs ...) up to
// `vocab`. add_bos_token and add_eos_token are false, so llama_tokenize adds
// no hidden token; add_space_prefix is true (SentencePiece's default), so
// "Hello" tokenizes as "▁Hello" and the pieces of a tokenized text read back
// with one leading space (llama_detokenize removes it).
//
// Ownership and threading: a free function; it owns nothing after it
// returns. Concurrent calls are safe if their out_paths differ. It needs no
// llama.cpp backend (EnsureBackends) — only ggml's gguf writer.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace kvrelay::llama {

struct MakeModelOptions {
  std::string out_path;      // written via a temporary file in the same folder
  uint32_t layers = 2;       // llama.block_count, 1..512
  uint32_t embd = 128;       // llama.embedding_length
  uint32_t heads = 4;        // llama.attention.head_count; embd % heads == 0
  uint32_t kv_heads = 2;     // llama.attention.head_count_kv; heads % kv_heads == 0
  uint32_t ff = 0;           // llama.feed_forward_length; 0: 8*embd/3 rounded up to 32
  uint32_t vocab = 512;      // tokens, 300..131072
  uint32_t context = 4096;   // llama.context_length (n_ctx_train)
  uint64_t seed = 1;         // the weights; the vocabulary depends on `vocab` only
  std::string name = "kvrelay-made";  // general.name
};

// The feed-forward width MakeModel writes for `o`: o.ff, or 8*embd/3
// rounded up to a multiple of 32 (LLaMA's SwiGLU sizing). Inline, so the
// build without llama.cpp (llama_missing.cc) needs no copy.
inline uint32_t FeedForwardWidth(const MakeModelOptions& o) {
  if (o.ff != 0) return o.ff;
  const uint64_t ff = (uint64_t{8} * o.embd + 2) / 3;  // ceil(8*embd/3)
  return static_cast<uint32_t>((ff + 31) / 32 * 32);
}

// Writes the model to o.out_path, replacing any file there. Same options,
// same bytes. kInvalidArgument for a bad shape (nothing is written);
// kUnavailable when the file cannot be created, written or renamed into
// place (the message names the path; no partial file is left); kInternal
// if ggml's writer and this one disagree on the layout (a bug).
Status MakeModel(const MakeModelOptions& o);

}  // namespace kvrelay::llama
