// compute_model.h — ComputeModel: the model behind the engine, as the
// engine's scheduler sees it.
//
// Why an interface: the scheduler, block pool, connector and every
// lifecycle rule are one piece of code (engine.h); what computes KV and
// tokens is not. Two implementations: EmulatedModel (emulated_model.h; pure,
// every token checkable, the simulator's and the default) and llama.cpp
// (src/llama/, outside the pure layers: it computes on threads).
//
// The contract. The engine owns the sequences: which tokens each has, how
// many have KV (`computed`), its blocks. Each step it hands the model one
// batch: per sequence, compute KV for tokens [from, to) — the sequence's
// KV for [0, from) is there from earlier batches — and, if `wants_token`,
// the next token after position to-1 (then to == tokens.size()). The model
// answers every entry that wants a token, in order. Between batches the
// engine tells the model which sequences lost their KV (Forget: preempted,
// finished, aborted; the key may come back later with from == 0) and what
// must be resident (Reside: lifecycle).
//
// Keys are the engine's request slots (RequestId.index): unique among live
// sequences, reused only after Forget.
//
// Ownership and threading: the engine holds a pointer; the driver owns the
// model and keeps it alive as long as the engine. One thread: the engine's.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"
#include "core/block_id.h"
#include "engine/kv_memory.h"
#include "engine/model.h"

namespace kvrelay::engine {

// Sampling of one request. temperature 0: greedy (ties to the lower id).
// Otherwise the token at position p is drawn from softmax(logits / T) with
// a generator seeded from (seed, p) alone, so a request's tokens do not
// depend on what else shares its batches. The emulated model ignores it.
struct Sampling {
  float temperature = 0.0f;
  uint64_t seed = 0;
};

struct SeqWork {
  uint64_t key = 0;                  // the engine's request slot
  std::span<const Token> tokens;     // the whole sequence: prompt, then output
  std::span<const BlockId> blocks;   // its blocks (the emulated model's KV)
  uint32_t from = 0, to = 0;         // compute KV for tokens [from, to)
  bool wants_token = false;          // then also the token after to-1
  // Not one decode token: a prompt chunk, or a preempted request's
  // recompute (anything but from == tokens.size() - 1 past the prompt).
  bool prefill = false;
  Sampling sampling;
};

// What the engine's lifecycle wants resident (sleep, release, wake, new
// weights). A model makes it so before the next Run.
struct Residency {
  bool kv = true;        // the KV context (sleep >= 1 and release free it)
  bool weights = true;   // the weights (sleep 2 frees them)
  uint64_t weights_version = 1;
};

// What a model's hand-off copies cost so far (ExportKv / ImportKv that
// succeeded): a model that keeps its own KV measures them (llama.cpp); the
// emulated model copies nothing and reports zeros. Times in nanoseconds.
struct KvCopyCosts {
  uint64_t exports = 0, exported_tokens = 0, export_ns = 0;
  uint64_t imports = 0, imported_tokens = 0, import_ns = 0;
};

class ComputeModel {
 public:
  virtual ~ComputeModel() = default;
  // One step's batch. out.size() = the entries with wants_token; out[i] is
  // the i-th such entry's token. REQUIRES: Reside'd with kv and weights.
  virtual void Run(std::span<const SeqWork> batch, uint64_t weights_version,
                   std::span<Token> out) = 0;
  // The sequence's KV is gone; the key is free.
  virtual void Forget(uint64_t key) = 0;
  // Every sequence's KV is gone (the pool was reset).
  virtual void ForgetAll() = 0;
  // Make `want` resident. An error (a weights file that does not load)
  // leaves the model as it was; the engine reports it on the operation.
  virtual Status Reside(const Residency& want) = 0;
  // True if KV blocks can be shared between sequences (the engine's
  // prefix cache). llama.cpp keeps each sequence's KV in its own cells.
  virtual bool SharesBlocks() const = 0;
  // 0: a prefill chunk may end anywhere the step's token budget does.
  // N: it ends at a multiple of N or at the sequence's end, and the engine
  // waits for a step with room for it whole — where llama.cpp alone cuts a
  // prompt, since its sums depend on how many rows share a batch.
  virtual uint32_t PrefillAlign() const { return 0; }
  // True for a token that ends the output (llama.cpp's end-of-generation
  // tokens); the request then finishes with FinishReason::kStop unless it
  // asked to ignore it. The emulated model has none.
  virtual bool EndsGeneration(Token) const { return false; }
  // --- P/D: KV a model keeps itself, carried in blocks -------------------
  // The emulated model's KV is the blocks' content already (it writes and
  // reads them through KvMemory), so these are no-ops for it. llama.cpp
  // keeps KV in its own cells: P copies a sequence out into the request's
  // blocks when its prefill ends, D copies the blocks that landed into a
  // sequence of its own before it decodes.
  //
  // P: the prefill of `key` ended (its KV covers tokens [0, n_tokens)) and
  // the request hands off: write that KV into `blocks` through `memory`.
  // An error (blocks too small) ends the hand-off as an aborted one.
  virtual Status ExportKv(uint64_t /*key*/, uint32_t /*n_tokens*/,
                          std::span<const BlockId> /*blocks*/, KvMemory& /*memory*/) {
    return Status::Ok();
  }
  // D: `blocks` hold what P exported for a prompt of n_tokens: make it the
  // KV of `key` (a key with no sequence now), so the next batch may start at
  // from == n_tokens. An error (another model, a corrupted or cut frame, no
  // free sequence) is a failed load: the engine recomputes or fails the
  // request by its policy, and the key holds nothing.
  virtual Status ImportKv(uint64_t /*key*/, uint32_t /*n_tokens*/,
                          std::span<const BlockId> /*blocks*/, KvMemory& /*memory*/) {
    return Status::Ok();
  }
  // True if a prompt chunk's KV is in the request's blocks, final, as soon
  // as its batch ran (the emulated model writes blocks as it computes): P
  // may then hand finished chunks over while the prefill goes on
  // (EngineOptions::stream_chunks). llama.cpp keeps KV in its own cells
  // and exports a sequence whole (ExportKv): it hands off whole.
  virtual bool KvInBlocksAsComputed() const { return false; }
  // Folded into the prompt fingerprint P and D compare (connector), so KV
  // from another model is refused before a byte moves: the emulated model
  // 0 (its fingerprint is the weights version's), llama.cpp a hash of the
  // weights file.
  virtual uint64_t Identity() const { return 0; }
  // The copies' costs so far (KvCopyCosts); read on the engine's thread.
  virtual KvCopyCosts CopyCosts() const { return {}; }
  // True if the next token can come from the KV alone (SeqWork with from
  // == to and wants_token): the emulated model reads its digests. llama.cpp
  // samples from logits, which are not part of the KV: D then uses the
  // token P computed (core/first_token.h) whenever it has one.
  virtual bool NextTokenFromKv() const { return true; }

  // The vocabulary: token ids are below it.
  virtual uint32_t vocab() const = 0;
  // What it is, for logs and /v1/models ("emulated tiny", a GGUF's name).
  virtual std::string Describe() const = 0;
};

}  // namespace kvrelay::engine
