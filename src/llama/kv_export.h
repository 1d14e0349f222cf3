// kv_export.h — one llama.cpp sequence's KV cache out of a context as bytes,
// cut into fixed-size blocks for kvrelay to carry, and back into a free
// sequence of another context.
//
// Why: prefill/decode disaggregation on llama.cpp. A prefill engine (P)
// computes a prompt in one of its sequences and exports that sequence's KV
// (ExportSequence); CutIntoBlocks frames it with who made it and a checksum
// and cuts it into kvrelay's blocks; the decode engine (D) joins the blocks
// (JoinBlocks refuses another model, another llama.cpp, a corrupted or
// truncated transfer) and imports the KV into a free sequence of its own
// context (ImportSequence), then decodes from the next position: P's first
// sampled token goes in at position n_tokens. Decoding after an import is
// bit-identical to decoding in P (kv_export_test.cc).
//
// What the bytes are: llama.cpp's own sequence state (llama_state_seq_get_data,
// flags 0), read in llama.cpp 0.5.0 (commit de3ff81, LLAMA_STATE_SEQ_VERSION
// 3) src/llama-context.cpp and src/llama-kv-cache.cpp state_write/state_read:
//   u32 magic 0xaf143cd8, i32 sender's seq id, u32 n_stream (1 when unified),
//   per stream: u32 cell_count, then for a non-empty one: per cell i32 pos,
//   u32 n_seq_id (1), [12-byte cell ext: M-RoPE / PLE models only], i32 seq;
//   u32 v_trans, u32 n_layer; per layer K: i32 ggml type, u64 row bytes, the
//   rows; then V the same way (or, transposed, i32 type, u32 element size,
//   u32 width, then per V dimension one run per contiguous range of cells:
//   with flash attention off, 1.6 / 1.3 µs/token export / import below, and
//   more calls the more the sequence's cells are scattered).
// Layer-major: the first tokens of a sequence are not a prefix of its bytes.
//
// Sizes (F16 cache, flash attention on — llama.cpp's CPU default):
//   bytes per token = 12 + layers × 2 × kv_heads × head_dim × 2
//   fixed bytes     = 24 + 24 × layers
//   the default made model (2 layers, embd 128, kv_heads 2): 524 B/token, 72 fixed;
//   12 layers, embd 768, heads 12, kv_heads 4: 12,300 B/token (5.9 MB for
//   480 tokens), 312 fixed. The frame adds kKvFrameHeaderBytes once and pads
//   the last block.
// Cost (12-layer model, 480 tokens, one 2-core machine shared with other
// builds; kv_export_test prints it): export 1.0-1.3 µs/token (~0.6 ms;
// ~0.86 µs/token of it is llama.cpp's copy, the rest the fresh buffer's
// page faults), import ~1.0 µs/token (~0.5 ms); framing 64 KiB blocks
// ~3 ms, joining ~1 ms (XXH64 at ~5 GB/s each way, plus copies).
//
// Facts of llama.cpp's state API that shape this file:
// - No token range: state_write takes a whole sequence (every non-empty
//   cell holding it). ExportRange gets positions [p0, p1) by copying them to
//   an unused scratch sequence (llama_memory_seq_cp: in a unified cache only
//   the cells' sequence sets change, no KV is copied), exporting that and
//   removing it; AppendSequence imports into a scratch sequence and copies it
//   onto the end of the target. Unified caches only: across streams seq_cp
//   copies whole buffers and asserts on a range.
// - Import replaces: state_read first removes every cell of the destination
//   sequence, then finds cell_count free cells anywhere (not necessarily
//   contiguous); on failure the destination is left empty. Other sequences
//   are never touched. The sender's seq id in the bytes is ignored (any
//   destination id works), the positions are kept.
// - Crashes to avoid, so checked here before llama.cpp sees the bytes: a
//   sequence id past the cache's table (256 unified, n_seq_max otherwise)
//   is a GGML_ASSERT, so ids are held to [0, n_seq_max); -1 restores (and
//   first clears) the WHOLE cache; the single-sequence reader sizes a batch
//   by cell_count before checking it against the cache (a corrupt count
//   allocates without bound). DescribeState walks the bytes first.
// - Where the cells land does not matter: an imported sequence placed after
//   another one's cells decodes to the same bits as in P (CPU flash
//   attention skips masked cells; measured, not promised by llama.cpp).
// - llama.cpp returns 0 on refusal (n_stream, layer count, K/V type or row
//   size, V transposition, or too few free cells; its log says which) and
//   does not check that it read the whole buffer: ImportSequence does.
// - The layout is checked by llama.cpp, not by KvIdentity: P and D need the
//   same type_k/type_v, the same flash attention setting (off stores V
//   transposed, v_trans), and both unified or both not with the same
//   n_seq_max (n_stream). llama.h has no getter for these on a context.
// - LLAMA_STATE_SEQ_FLAGS_ON_DEVICE keeps the KV in per-sequence device
//   buffers of the same context and writes only metadata: useless across
//   processes. PARTIAL_ONLY (= SWA_ONLY) is for SWA / recurrent caches.
// - No alignment needed: llama.cpp memcpy's from and to any address.
// - Logits are not part of the state: D computes its first logits by
//   decoding a token (P's sampled one) at position n_tokens.
//
// Ownership and threading: functions taking a llama_context run on the
// thread that owns it, between llama_decode calls (llama.cpp synchronizes
// first); they own nothing after they return. The framing functions and
// ModelFingerprint are pure and safe from any thread.
//
// This header does not include llama.h (struct llama_context is declared
// only): callers build without llama.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/status.h"

struct llama_context;

namespace kvrelay::llama {

// What P and D must share for a sequence's KV to mean the same in both;
// D checks it (JoinBlocks) before llama.cpp sees a byte.
struct KvIdentity {
  uint64_t model_hash = 0;    // ModelFingerprint of the GGUF file
  std::string llama_version;  // llama_version(): "0.5.0-dev" (at most 32 bytes kept)
  uint32_t state_version = 0; // LLAMA_STATE_SEQ_VERSION

  friend bool operator==(const KvIdentity&, const KvIdentity&) = default;
};

// This process's identity for a model of fingerprint `model_hash`.
KvIdentity LocalIdentity(uint64_t model_hash);

// XXH64 (seed 0) of the whole file, read in 4 MiB chunks: ~37-42 ms for
// the 176 MB 12-layer made model from the page cache on this machine
// (SHA-256, base/sha256.h, would take ~550 ms). It grows with the file
// (~3 s for a 14 GB model): compute it once per weights load, not per
// transfer. Same bytes, same fingerprint (a model made twice, a copy).
// kNotFound / kUnavailable when the file cannot be read.
Result<uint64_t> ModelFingerprint(const std::string& path);

// What a sequence state holds, read from llama.cpp's bytes (layout above).
struct KvStateInfo {
  int32_t seq_id = -1;          // the sender's sequence (import ignores it)
  uint32_t n_stream = 0;        // 1: a unified cache
  uint32_t n_tokens = 0;        // cells
  int32_t pos_min = -1, pos_max = -1;
  bool v_trans = false;         // V stored transposed (flash attention off)
  bool cell_ext = false;        // 12 more bytes per cell (M-RoPE / PLE models)
  uint32_t layers = 0;
  int32_t k_type = -1, v_type = -1;  // ggml_type of layer 0's K and V
  uint64_t bytes_per_token = 0;
  uint64_t fixed_bytes = 0;     // the rest of the state
};

// Walks the whole state and checks that its fields add up to its size.
// kInvalidArgument when they do not (or for a layout it does not know:
// a layer without V, as in MLA models).
Result<KvStateInfo> DescribeState(std::span<const uint8_t> state);

// The KV of `seq_id` (0 ≤ seq_id < n_seq_max), llama.cpp's bytes.
// kFailedPrecondition for an empty sequence.
Result<std::vector<uint8_t>> ExportSequence(llama_context* ctx, int32_t seq_id);
// The same into `*out`, whose capacity is reused: an engine exporting
// prompt after prompt touches no fresh pages (on this VM kind a fresh page
// costs a fault; a 4 MiB state in new memory took ~25 ms, in reused 2 ms).
Status ExportSequenceInto(llama_context* ctx, int32_t seq_id, std::vector<uint8_t>* out);

// Puts `state` (from ExportSequence of a context of the same model and
// layout) into `seq_id`, replacing whatever it held; its positions are the
// exported ones. kInvalidArgument for a bad seq id or malformed bytes;
// kFailedPrecondition when the state does not fit this context (layers,
// streams, KV types, V layout) — the message names the sender's layout;
// kResourceExhausted when it holds more tokens than a sequence can.
Status ImportSequence(llama_context* ctx, int32_t seq_id, std::span<const uint8_t> state);

// Positions [p0, p1) of `seq_id`, through `scratch_seq` (a different,
// empty sequence; empty again afterwards). Unified caches only
// (kFailedPrecondition otherwise).
Result<std::vector<uint8_t>> ExportRange(llama_context* ctx, int32_t seq_id, int32_t p0,
                                         int32_t p1, int32_t scratch_seq);

// Appends `state` (ExportRange's or ExportSequence's) to `seq_id`: its
// positions must continue the sequence's (pos_min = its last + 1, no gaps;
// an empty sequence takes a state from position 0). Through `scratch_seq`,
// as ExportRange. On error `seq_id` is unchanged.
Status AppendSequence(llama_context* ctx, int32_t seq_id, int32_t scratch_seq,
                      std::span<const uint8_t> state);

// The frame: block 0 starts with this header, then the state runs on
// through the blocks; the last block is zero-padded. Header fields,
// little-endian: u32 magic "KVSQ", u16 frame version, u16 header bytes,
// u32 block bytes, u32 blocks, u64 state bytes, u64 XXH64 of the state,
// u32 n_tokens, i32 pos_min, i32 pos_max, u64 model hash, u32 state version,
// char[32] llama version, u64 XXH64 of the header before it.
inline constexpr uint32_t kKvFrameVersion = 1;
inline constexpr size_t kKvFrameHeaderBytes = 96;

// Blocks of `block_bytes` a state of `state_bytes` takes, framed.
size_t BlocksFor(size_t state_bytes, size_t block_bytes);

// `state` framed as `id`'s and cut into blocks of exactly `block_bytes`
// (at least kKvFrameHeaderBytes; else kInvalidArgument, as for a state
// DescribeState refuses).
Result<std::vector<std::vector<uint8_t>>> CutIntoBlocks(const KvIdentity& id,
                                                        std::span<const uint8_t> state,
                                                        size_t block_bytes);
// The same frame written in place: `write(block, offset, bytes)` is called
// with every byte of every block exactly once, in order (the header, the
// state, the last block's zero padding). Returns the blocks written.
using FrameWriter = std::function<void(size_t block, size_t offset, std::span<const uint8_t>)>;
Result<size_t> FrameInto(const KvIdentity& id, std::span<const uint8_t> state,
                         size_t block_bytes, const FrameWriter& write);

// The number of blocks a frame says it has, read from its first block (as
// JoinBlocks reads it): a receiver that holds more blocks than the frame
// used passes JoinBlocks only that many. kInvalidArgument / kFailedPrecondition
// / kDataLoss as JoinBlocks for the header.
Result<uint32_t> FramedBlockCount(std::span<const uint8_t> first_block);

struct KvReceived {
  KvIdentity sender;
  uint32_t n_tokens = 0;
  int32_t pos_min = -1, pos_max = -1;
  std::vector<uint8_t> state;  // for ImportSequence
};

// The state back out of CutIntoBlocks' blocks, in order. kInvalidArgument:
// not a kvrelay KV frame; kFailedPrecondition: another frame version, or a
// sender whose identity is not `expected` (the message says which field);
// kDataLoss: a corrupted header or state (checksums), missing or extra
// blocks, a block of the wrong size.
Result<KvReceived> JoinBlocks(std::span<const std::span<const uint8_t>> blocks,
                              const KvIdentity& expected);
// The same into `*out`, whose state buffer's capacity is reused (see
// ExportSequenceInto); on error *out holds no usable state.
Status JoinBlocksInto(std::span<const std::span<const uint8_t>> blocks, const KvIdentity& expected,
                      KvReceived* out);

}  // namespace kvrelay::llama
