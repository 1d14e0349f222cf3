// kv_export_test.cc — a sequence's KV exported from one llama.cpp context,
// framed, cut into blocks, joined and imported into another decodes
// bit-identically; other sequences are untouched; a wrong model, a corrupted
// or truncated transfer and a context of another layout are refused; token
// ranges go through a scratch sequence. Prints the state's bytes per token
// and the export / import cost on a 12-layer made model.
#include "llama/kv_export.h"

#include <gtest/gtest.h>
#include <llama.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "llama/llama_backend.h"
#include "llama/model_maker.h"

namespace kvrelay::llama {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct ModelFree { void operator()(llama_model* m) const { llama_model_free(m); } };
struct ContextFree { void operator()(llama_context* c) const { llama_free(c); } };
using ModelPtr = std::unique_ptr<llama_model, ModelFree>;
using ContextPtr = std::unique_ptr<llama_context, ContextFree>;
using Blocks = std::vector<std::vector<uint8_t>>;

// One compute thread: llama.cpp's workers spin while they wait, so two of them on a
// busy machine (ctest -j) can take 20× longer; one is as fast alone here.
constexpr int32_t kThreads = 1;

ModelPtr Load(const std::string& path) {
  llama_model_params p = llama_model_default_params();
  p.n_gpu_layers = 0;
  return ModelPtr(llama_model_load_from_file(path.c_str(), p));
}

struct ContextShape {
  uint32_t n_ctx = 1024;
  uint32_t n_seq_max = 4;
  bool unified = true;
  llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
};

ContextPtr NewContext(llama_model* model, const ContextShape& s = {}) {
  llama_context_params p = llama_context_default_params();
  p.n_ctx = s.n_ctx;
  p.n_batch = 512;
  p.n_ubatch = 512;
  p.n_seq_max = s.n_seq_max;
  p.kv_unified = s.unified;
  p.flash_attn_type = s.flash_attn;
  p.n_threads = kThreads;
  p.n_threads_batch = kThreads;
  p.no_perf = true;
  return ContextPtr(llama_init_from_model(model, p));
}

uint32_t VocabOf(llama_context* ctx) {
  return static_cast<uint32_t>(llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx))));
}

// Decodes `tokens` into `seq` from position `pos0`; the last token's logits.
std::vector<float> Decode(llama_context* ctx, int32_t seq, const std::vector<llama_token>& tokens,
                          llama_pos pos0) {
  llama_batch b = llama_batch_init(static_cast<int32_t>(tokens.size()), 0, 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    b.token[i] = tokens[i];
    b.pos[i] = pos0 + static_cast<llama_pos>(i);
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = seq;
    b.logits[i] = i + 1 == tokens.size();
  }
  b.n_tokens = static_cast<int32_t>(tokens.size());
  const int32_t rc = llama_decode(ctx, b);
  llama_batch_free(b);
  EXPECT_EQ(rc, 0);
  if (rc != 0) return {};
  const float* logits = llama_get_logits_ith(ctx, -1);
  return std::vector<float>(logits, logits + VocabOf(ctx));
}

std::vector<llama_token> Prompt(uint32_t n, uint32_t vocab, uint32_t salt) {
  std::vector<llama_token> out;
  for (uint32_t i = 0; i < n; ++i) {
    out.push_back(static_cast<llama_token>(3 + (i * 37 + salt * 101 + 11) % (vocab - 3)));
  }
  return out;
}

llama_token Argmax(const std::vector<float>& logits) {
  return static_cast<llama_token>(std::max_element(logits.begin(), logits.end()) -
                                  logits.begin());
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Decodes `first` at `pos` in both, then `steps` greedy tokens: every
// step's logits must be the same bits.
void ExpectSameContinuation(llama_context* a, int32_t seq_a, llama_context* b, int32_t seq_b,
                            llama_token first, llama_pos pos, int steps) {
  llama_token t = first;
  for (int i = 0; i <= steps; ++i) {
    const std::vector<float> la = Decode(a, seq_a, {t}, pos + i);
    const std::vector<float> lb = Decode(b, seq_b, {t}, pos + i);
    ASSERT_TRUE(SameBits(la, lb)) << "logits differ at step " << i << " (position " << pos + i
                                  << ")";
    t = Argmax(la);
  }
}

std::vector<std::span<const uint8_t>> Views(const Blocks& blocks) {
  return std::vector<std::span<const uint8_t>>(blocks.begin(), blocks.end());
}

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

class KvExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EnsureBackends();
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("kvrelay-kv-export-" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    struct Made {
      const char* name;
      uint64_t seed;
      uint32_t layers;
    };
    for (const Made& m : {Made{"a.gguf", 1, 2}, Made{"b.gguf", 2, 2}, Made{"three.gguf", 1, 3}}) {
      MakeModelOptions o;
      o.out_path = Path(m.name);
      o.seed = m.seed;
      o.layers = m.layers;
      ASSERT_TRUE(MakeModel(o).ok());
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string Path(const std::string& name) { return (*dir_ / name).string(); }

  void SetUp() override {
    model_ = Load(Path("a.gguf"));
    ASSERT_NE(model_, nullptr);
    Result<uint64_t> fp = ModelFingerprint(Path("a.gguf"));
    ASSERT_TRUE(fp.ok()) << fp.status().ToString();
    id_ = LocalIdentity(*fp);
    a_ = NewContext(model_.get());
    b_ = NewContext(model_.get());
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    vocab_ = VocabOf(a_.get());
    prompt_ = Prompt(40, vocab_, 0);
    Decode(a_.get(), 2, prompt_, 0);
  }

  // Seq 2 of A, exported and framed into 8 KiB blocks.
  Blocks ExportedBlocks() {
    Result<std::vector<uint8_t>> state = ExportSequence(a_.get(), 2);
    EXPECT_TRUE(state.ok()) << state.status().ToString();
    if (!state.ok()) return {};
    Result<Blocks> blocks = CutIntoBlocks(id_, *state, 8192);
    EXPECT_TRUE(blocks.ok()) << blocks.status().ToString();
    return blocks.ok() ? *blocks : Blocks{};
  }

  static fs::path* dir_;
  ModelPtr model_;
  KvIdentity id_;
  ContextPtr a_, b_;
  uint32_t vocab_ = 0;
  std::vector<llama_token> prompt_;
};

fs::path* KvExportTest::dir_ = nullptr;

// FrameInto writes every byte of every block once, in order: the header,
// the state, then zeros to the last block's end; reused, the state buffer
// of ExportSequenceInto gives the same bytes.
TEST_F(KvExportTest, FrameIntoWritesEachBlockWholeInOrder) {
  std::vector<uint8_t> state = {1, 2, 3};   // the reused buffer's old bytes
  ASSERT_TRUE(ExportSequenceInto(a_.get(), 2, &state).ok());
  Result<std::vector<uint8_t>> fresh = ExportSequence(a_.get(), 2);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(state, *fresh);
  constexpr size_t kBlock = 4096;
  std::vector<std::vector<uint8_t>> got;
  Result<size_t> n = FrameInto(id_, state, kBlock,
                               [&](size_t b, size_t offset, std::span<const uint8_t> bytes) {
                                 if (b == got.size()) got.emplace_back();
                                 ASSERT_EQ(b + 1, got.size()) << "blocks in order";
                                 ASSERT_EQ(offset, got[b].size()) << "bytes in order";
                                 got[b].insert(got[b].end(), bytes.begin(), bytes.end());
                               });
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, got.size());
  ASSERT_EQ(*n, BlocksFor(state.size(), kBlock));
  std::vector<uint8_t> all;
  for (const auto& b : got) {
    EXPECT_EQ(b.size(), kBlock);
    all.insert(all.end(), b.begin(), b.end());
  }
  EXPECT_TRUE(std::equal(state.begin(), state.end(), all.begin() + kKvFrameHeaderBytes));
  EXPECT_TRUE(std::all_of(all.begin() + kKvFrameHeaderBytes + state.size(), all.end(),
                          [](uint8_t v) { return v == 0; }));
  std::vector<std::span<const uint8_t>> spans(got.begin(), got.end());
  Result<KvReceived> back = JoinBlocks(spans, id_);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->state, state);
}

TEST_F(KvExportTest, ImportedSequenceDecodesBitIdentically) {
  Result<std::vector<uint8_t>> state = ExportSequence(a_.get(), 2);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  Result<KvStateInfo> info = DescribeState(*state);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->seq_id, 2);
  EXPECT_EQ(info->n_stream, 1u);
  EXPECT_EQ(info->n_tokens, 40u);
  EXPECT_EQ(info->pos_min, 0);
  EXPECT_EQ(info->pos_max, 39);
  EXPECT_EQ(info->layers, 2u);
  EXPECT_FALSE(info->cell_ext);
  EXPECT_EQ(info->k_type, GGML_TYPE_F16);
  EXPECT_EQ(info->v_type, GGML_TYPE_F16);
  // 12 bytes of cell metadata + 2 layers × (K + V) × 2 kv heads × 32 dims × 2 bytes.
  EXPECT_EQ(info->bytes_per_token, 12u + 2 * 2 * 2 * 32 * 2);
  EXPECT_EQ(info->fixed_bytes, 24u + 24 * 2);
  std::printf("[kv] 2 layers, embd 128, kv_heads 2: %llu B/token + %llu fixed; 40 tokens = %zu B"
              " (V %s)\n",
              static_cast<unsigned long long>(info->bytes_per_token),
              static_cast<unsigned long long>(info->fixed_bytes), state->size(),
              info->v_trans ? "transposed" : "not transposed");

  Result<Blocks> blocks = CutIntoBlocks(id_, *state, 8192);
  ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
  EXPECT_EQ(blocks->size(), BlocksFor(state->size(), 8192));
  for (const auto& b : *blocks) EXPECT_EQ(b.size(), 8192u);
  Result<KvReceived> got = JoinBlocks(Views(*blocks), id_);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->state, *state);
  EXPECT_EQ(got->n_tokens, 40u);
  EXPECT_EQ(got->sender, id_);

  ASSERT_TRUE(ImportSequence(b_.get(), 1, got->state).ok());
  EXPECT_EQ(llama_memory_seq_pos_min(llama_get_memory(b_.get()), 1), 0);
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(b_.get()), 1), 39);
  ExpectSameContinuation(a_.get(), 2, b_.get(), 1, /*first=*/77, /*pos=*/40, /*steps=*/10);
}

TEST_F(KvExportTest, ImportLeavesOtherSequencesAlone) {
  // B's seq 0 holds another prompt; its next logits, before and after the import.
  const std::vector<llama_token> other = Prompt(25, vocab_, 1);
  Decode(b_.get(), 0, other, 0);
  const std::vector<float> before = Decode(b_.get(), 0, {5}, 25);
  llama_memory_seq_rm(llama_get_memory(b_.get()), 0, 25, -1);

  Result<KvReceived> got = JoinBlocks(Views(ExportedBlocks()), id_);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(ImportSequence(b_.get(), 3, got->state).ok());

  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(b_.get()), 0), 24);
  const std::vector<float> after = Decode(b_.get(), 0, {5}, 25);
  EXPECT_TRUE(SameBits(before, after));
  ExpectSameContinuation(a_.get(), 2, b_.get(), 3, /*first=*/77, /*pos=*/40, /*steps=*/10);
}

TEST_F(KvExportTest, ImportReplacesTheDestination) {
  Decode(b_.get(), 1, Prompt(60, vocab_, 2), 0);  // longer than the import
  Result<std::vector<uint8_t>> state = ExportSequence(a_.get(), 2);
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(ImportSequence(b_.get(), 1, *state).ok());
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(b_.get()), 1), 39);
  ExpectSameContinuation(a_.get(), 2, b_.get(), 1, /*first=*/9, /*pos=*/40, /*steps=*/3);
}

TEST_F(KvExportTest, JoinRefusesAnotherModelAndDamagedTransfers) {
  const Blocks blocks = ExportedBlocks();
  ASSERT_GE(blocks.size(), 3u);

  Result<uint64_t> other_fp = ModelFingerprint(Path("b.gguf"));
  ASSERT_TRUE(other_fp.ok());
  EXPECT_NE(*other_fp, id_.model_hash);
  Result<KvReceived> r = JoinBlocks(Views(blocks), LocalIdentity(*other_fp));
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("another model"), std::string::npos)
      << r.status().message();

  KvIdentity other_llama = id_;
  other_llama.llama_version = "0.4.9";
  r = JoinBlocks(Views(blocks), other_llama);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("llama.cpp"), std::string::npos);

  Blocks flipped = blocks;
  flipped[2][100] ^= 0x01;
  r = JoinBlocks(Views(flipped), id_);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status().message();

  Blocks bad_header = blocks;
  bad_header[0][30] ^= 0x80;
  r = JoinBlocks(Views(bad_header), id_);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("header"), std::string::npos) << r.status().message();

  Blocks truncated(blocks.begin(), blocks.end() - 1);
  r = JoinBlocks(Views(truncated), id_);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("blocks"), std::string::npos) << r.status().message();

  Blocks short_last = blocks;
  short_last.back().resize(100);
  EXPECT_EQ(JoinBlocks(Views(short_last), id_).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(JoinBlocks({}, id_).status().code(), StatusCode::kDataLoss);

  Blocks not_kv = blocks;
  not_kv[0][0] ^= 0xff;
  EXPECT_EQ(JoinBlocks(Views(not_kv), id_).status().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(CutIntoBlocks(id_, std::vector<uint8_t>(64, 0), 8192).status().code(),
            StatusCode::kInvalidArgument);
  Result<std::vector<uint8_t>> state = ExportSequence(a_.get(), 2);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(CutIntoBlocks(id_, *state, 32).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(KvExportTest, ImportRefusesWhatDoesNotFit) {
  Result<std::vector<uint8_t>> state = ExportSequence(a_.get(), 2);
  ASSERT_TRUE(state.ok());
  llama_memory_t mem_b = llama_get_memory(b_.get());

  EXPECT_EQ(ImportSequence(b_.get(), -1, *state).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ImportSequence(b_.get(), 4, *state).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportSequence(a_.get(), 0).status().code(), StatusCode::kFailedPrecondition);

  // Truncated or trailing bytes never reach llama.cpp.
  const std::vector<uint8_t> cut(state->begin(), state->end() - 10);
  Status s = ImportSequence(b_.get(), 1, cut);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  std::vector<uint8_t> longer = *state;
  longer.push_back(0);
  EXPECT_EQ(ImportSequence(b_.get(), 1, longer).code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> huge_count = *state;
  huge_count[12] = huge_count[13] = huge_count[14] = huge_count[15] = 0xff;  // cell_count
  EXPECT_EQ(ImportSequence(b_.get(), 1, huge_count).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(llama_memory_seq_pos_max(mem_b, 1), -1);

  // Another layer count.
  ModelPtr three = Load(Path("three.gguf"));
  ASSERT_NE(three, nullptr);
  ContextPtr c3 = NewContext(three.get());
  s = ImportSequence(c3.get(), 1, *state);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("layers"), std::string::npos) << s.message();

  // A non-unified cache: one stream per sequence.
  ContextShape split;
  split.unified = false;
  ContextPtr c_split = NewContext(model_.get(), split);
  s = ImportSequence(c_split.get(), 1, *state);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("streams"), std::string::npos) << s.message();

  // Flash attention off stores V transposed: llama.cpp refuses, and the
  // destination it had cleared stays empty.
  ContextShape no_fa;
  no_fa.flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  ContextPtr c_nofa = NewContext(model_.get(), no_fa);
  Decode(c_nofa.get(), 1, Prompt(8, vocab_, 3), 0);
  s = ImportSequence(c_nofa.get(), 1, *state);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("flash attention"), std::string::npos) << s.message();
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(c_nofa.get()), 1), -1);

  // More tokens than a sequence of the context holds.
  ContextShape small;
  small.n_ctx = 256;
  small.n_seq_max = 1;
  ContextPtr c_small = NewContext(model_.get(), small);
  ASSERT_EQ(llama_n_ctx_seq(c_small.get()), 256u);
  Decode(a_.get(), 0, Prompt(300, vocab_, 4), 0);
  Result<std::vector<uint8_t>> long_state = ExportSequence(a_.get(), 0);
  ASSERT_TRUE(long_state.ok());
  s = ImportSequence(c_small.get(), 0, *long_state);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();

  // Fewer free cells than tokens: llama.cpp refuses, the others stay.
  ContextShape two;
  two.n_ctx = 256;
  two.n_seq_max = 2;
  ContextPtr c_full = NewContext(model_.get(), two);
  Decode(c_full.get(), 0, Prompt(230, vocab_, 5), 0);
  s = ImportSequence(c_full.get(), 1, *state);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("free cells"), std::string::npos) << s.message();
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(c_full.get()), 0), 229);
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(c_full.get()), 1), -1);
}

TEST_F(KvExportTest, TransposedVRoundTripsBetweenFlashAttentionOffContexts) {
  ContextShape no_fa;
  no_fa.flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  ContextPtr p = NewContext(model_.get(), no_fa);
  ContextPtr d = NewContext(model_.get(), no_fa);
  Decode(p.get(), 2, prompt_, 0);
  Result<std::vector<uint8_t>> state = ExportSequence(p.get(), 2);
  ASSERT_TRUE(state.ok());
  Result<KvStateInfo> info = DescribeState(*state);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->v_trans);
  EXPECT_EQ(info->bytes_per_token, 524u);
  ASSERT_TRUE(ImportSequence(d.get(), 0, *state).ok());
  ExpectSameContinuation(p.get(), 2, d.get(), 0, /*first=*/77, /*pos=*/40, /*steps=*/3);
}

TEST_F(KvExportTest, TokenRangesGoThroughAScratchSequence) {
  Result<std::vector<uint8_t>> head = ExportRange(a_.get(), 2, 0, 16, /*scratch=*/3);
  Result<std::vector<uint8_t>> tail = ExportRange(a_.get(), 2, 16, 40, /*scratch=*/3);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  llama_memory_t mem_a = llama_get_memory(a_.get());
  EXPECT_EQ(llama_memory_seq_pos_max(mem_a, 3), -1);  // the scratch is free again
  EXPECT_EQ(llama_memory_seq_pos_max(mem_a, 2), 39);
  Result<KvStateInfo> hi = DescribeState(*head);
  Result<KvStateInfo> ti = DescribeState(*tail);
  ASSERT_TRUE(hi.ok() && ti.ok());
  EXPECT_EQ(hi->n_tokens, 16u);
  EXPECT_EQ(ti->n_tokens, 24u);
  EXPECT_EQ(ti->pos_min, 16);
  EXPECT_EQ(ti->pos_max, 39);
  EXPECT_EQ(ExportRange(a_.get(), 2, 50, 60, 3).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ExportRange(a_.get(), 2, 0, 16, 2).status().code(), StatusCode::kInvalidArgument);

  // The tail first does not continue an empty sequence; head then tail does.
  Status s = AppendSequence(b_.get(), 1, 3, *tail);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  ASSERT_TRUE(AppendSequence(b_.get(), 1, 3, *head).ok());
  EXPECT_EQ(AppendSequence(b_.get(), 1, 3, *head).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(AppendSequence(b_.get(), 1, 3, *tail).ok());
  llama_memory_t mem_b = llama_get_memory(b_.get());
  EXPECT_EQ(llama_memory_seq_pos_min(mem_b, 1), 0);
  EXPECT_EQ(llama_memory_seq_pos_max(mem_b, 1), 39);
  EXPECT_EQ(llama_memory_seq_pos_max(mem_b, 3), -1);
  ExpectSameContinuation(a_.get(), 2, b_.get(), 1, /*first=*/77, /*pos=*/40, /*steps=*/10);

  // Not in a cache of one stream per sequence.
  ContextShape split;
  split.unified = false;
  ContextPtr c_split = NewContext(model_.get(), split);
  Decode(c_split.get(), 0, prompt_, 0);
  EXPECT_EQ(ExportRange(c_split.get(), 0, 0, 16, 1).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(KvExportTest, FingerprintIsXxh64OfTheFile) {
  const auto write = [&](const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream(Path(name), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return Path(name);
  };
  const auto pattern = [](size_t n) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
    return v;
  };
  // Reference values: libxxhash's XXH64(data, len, 0).
  EXPECT_EQ(*ModelFingerprint(write("empty", {})), 0xef46db3751d8e999ull);
  EXPECT_EQ(*ModelFingerprint(write("abc", {'a', 'b', 'c'})), 0x44bc2cf5ad770999ull);
  EXPECT_EQ(*ModelFingerprint(write("p37", pattern(37))), 0xe32ef63802f5a3fdull);
  EXPECT_EQ(*ModelFingerprint(write("p1000", pattern(1000))), 0x5f235fa033f1a3fbull);
  EXPECT_EQ(ModelFingerprint(Path("missing")).status().code(), StatusCode::kNotFound);
  // Same options, same bytes, same fingerprint.
  MakeModelOptions o;
  o.out_path = Path("a-again.gguf");
  ASSERT_TRUE(MakeModel(o).ok());
  EXPECT_EQ(*ModelFingerprint(Path("a-again.gguf")), id_.model_hash);
}

// The 12-layer made model: bytes per token, export / import cost for 480
// tokens (printed, not asserted), and the fingerprint's cost on 176 MB.
TEST_F(KvExportTest, MeasuresTheTwelveLayerModel) {
  MakeModelOptions o;
  o.out_path = Path("big.gguf");
  o.layers = 12;
  o.embd = 768;
  o.heads = 12;
  o.kv_heads = 4;
  o.vocab = 8192;
  ASSERT_TRUE(MakeModel(o).ok());
  const uint64_t file_bytes = fs::file_size(o.out_path);

  Clock::time_point t0 = Clock::now();
  Result<uint64_t> fp = ModelFingerprint(o.out_path);
  const double fp_us = MicrosSince(t0);
  ASSERT_TRUE(fp.ok());
  {
    // SHA-256 over the first 32 MB, for comparison.
    std::ifstream in(o.out_path, std::ios::binary);
    std::vector<uint8_t> buf(32u << 20);
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    t0 = Clock::now();
    Sha256Digest d = Sha256::Hash(buf);
    const double sha_us = MicrosSince(t0) * static_cast<double>(file_bytes) / buf.size();
    std::printf("[kv] fingerprint of %.1f MB: XXH64 %.1f ms (read included); SHA-256 would take"
                " ~%.0f ms (digest %02x..)\n",
                file_bytes / 1e6, fp_us / 1e3, sha_us / 1e3, d[0]);
  }

  ModelPtr big = Load(o.out_path);
  ASSERT_NE(big, nullptr);
  ContextPtr p = NewContext(big.get());
  ContextPtr d = NewContext(big.get());
  const uint32_t vocab = VocabOf(p.get());
  constexpr uint32_t kTokens = 480;
  Decode(p.get(), 2, Prompt(kTokens, vocab, 5), 0);

  double export_us = 1e30, import_us = 1e30;
  std::vector<uint8_t> state;
  for (int i = 0; i < 3; ++i) {
    t0 = Clock::now();
    Result<std::vector<uint8_t>> s = ExportSequence(p.get(), 2);
    export_us = std::min(export_us, MicrosSince(t0));
    ASSERT_TRUE(s.ok());
    state = std::move(*s);
  }
  Result<KvStateInfo> info = DescribeState(state);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->bytes_per_token, 12u + 12 * 2 * 4 * 64 * 2);
  EXPECT_EQ(info->fixed_bytes, 24u + 24 * 12);

  const KvIdentity id = LocalIdentity(*fp);
  t0 = Clock::now();
  Result<Blocks> blocks = CutIntoBlocks(id, state, 64 << 10);
  const double cut_us = MicrosSince(t0);
  ASSERT_TRUE(blocks.ok());
  t0 = Clock::now();
  Result<KvReceived> got = JoinBlocks(Views(*blocks), id);
  const double join_us = MicrosSince(t0);
  ASSERT_TRUE(got.ok());
  for (int i = 0; i < 3; ++i) {
    t0 = Clock::now();
    ASSERT_TRUE(ImportSequence(d.get(), 1, got->state).ok());
    import_us = std::min(import_us, MicrosSince(t0));
  }
  // llama.cpp alone, into a buffer already written (no page faults).
  double warm_us = 1e30;
  std::vector<uint8_t> warm(state.size(), 1);
  for (int i = 0; i < 3; ++i) {
    t0 = Clock::now();
    ASSERT_EQ(llama_state_seq_get_data(p.get(), warm.data(), warm.size(), 2), warm.size());
    warm_us = std::min(warm_us, MicrosSince(t0));
  }
  std::printf("[kv] 12 layers, embd 768, kv_heads 4: %llu B/token + %llu fixed;"
              " %u tokens = %.2f MB\n"
              "[kv]   export %.2f us/token (%.0f us; into a warm buffer %.2f us/token),"
              " import %.2f us/token (%.0f us)\n"
              "[kv]   cut %.0f us + join %.0f us (64 KiB blocks, XXH64 both ways)\n",
              static_cast<unsigned long long>(info->bytes_per_token),
              static_cast<unsigned long long>(info->fixed_bytes), kTokens, state.size() / 1e6,
              export_us / kTokens, export_us, warm_us / kTokens, import_us / kTokens, import_us,
              cut_us, join_us);
  ExpectSameContinuation(p.get(), 2, d.get(), 1, /*first=*/77, /*pos=*/kTokens, /*steps=*/2);

  // Flash attention off: V is stored transposed, and llama.cpp moves it one
  // row of one dimension at a time.
  ContextShape no_fa;
  no_fa.flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  p = NewContext(big.get(), no_fa);
  d = NewContext(big.get(), no_fa);
  Decode(p.get(), 2, Prompt(kTokens, vocab, 5), 0);
  double t_export = 1e30, t_import = 1e30;
  for (int i = 0; i < 3; ++i) {
    t0 = Clock::now();
    Result<std::vector<uint8_t>> s = ExportSequence(p.get(), 2);
    t_export = std::min(t_export, MicrosSince(t0));
    ASSERT_TRUE(s.ok());
    state = std::move(*s);
    t0 = Clock::now();
    ASSERT_TRUE(ImportSequence(d.get(), 1, state).ok());
    t_import = std::min(t_import, MicrosSince(t0));
  }
  std::printf("[kv]   flash attention off (V transposed): export %.2f us/token, import %.2f"
              " us/token\n",
              t_export / kTokens, t_import / kTokens);
}

}  // namespace
}  // namespace kvrelay::llama
