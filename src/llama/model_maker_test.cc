// model_maker_test.cc — MakeModel's files: llama.cpp loads them with the
// shape asked for, tokenizes with their vocabulary and decodes with their
// weights; the same options give the same bytes; bad options write nothing.
#include "llama/model_maker.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "llama.h"
#include "llama/llama_backend.h"

namespace kvrelay::llama {
namespace {

namespace fs = std::filesystem;

class ModelMakerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EnsureBackends();
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("kvrelay-model-maker-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string PathOf(const std::string& name) const { return (dir_ / name).string(); }

  MakeModelOptions Options(const std::string& name) const {
    MakeModelOptions o;
    o.out_path = PathOf(name);
    return o;
  }

  fs::path dir_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct ModelFree { void operator()(llama_model* m) const { llama_model_free(m); } };
struct ContextFree { void operator()(llama_context* c) const { llama_free(c); } };
using ModelPtr = std::unique_ptr<llama_model, ModelFree>;
using ContextPtr = std::unique_ptr<llama_context, ContextFree>;

ModelPtr Load(const std::string& path) {
  llama_model_params p = llama_model_default_params();
  p.n_gpu_layers = 0;
  return ModelPtr(llama_model_load_from_file(path.c_str(), p));
}

ContextPtr NewContext(llama_model* model) {
  llama_context_params p = llama_context_default_params();
  p.n_ctx = 256;
  p.n_batch = 256;
  p.n_threads = 2;
  p.n_threads_batch = 2;
  return ContextPtr(llama_init_from_model(model, p));
}

std::vector<llama_token> Tokenize(const llama_vocab* vocab, const std::string& text) {
  std::vector<llama_token> ids(text.size() + 8);
  const int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()),
                                   ids.data(), static_cast<int32_t>(ids.size()),
                                   /*add_special=*/true, /*parse_special=*/false);
  EXPECT_GE(n, 0);
  ids.resize(std::max(n, 0));
  return ids;
}

std::string Piece(const llama_vocab* vocab, llama_token id) {
  char buf[64];
  const int32_t n = llama_token_to_piece(vocab, id, buf, sizeof(buf), /*lstrip=*/0,
                                         /*special=*/false);
  EXPECT_GE(n, 0);
  return std::string(buf, std::max(n, 0));
}

// The logits after decoding `tokens` (at positions 0..) in a fresh context.
std::vector<float> LastLogits(llama_model* model, const std::vector<llama_token>& tokens) {
  ContextPtr ctx = NewContext(model);
  EXPECT_NE(ctx, nullptr);
  if (ctx == nullptr) return {};
  llama_batch batch = llama_batch_init(static_cast<int32_t>(tokens.size()), 0, 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = i + 1 == tokens.size();
  }
  batch.n_tokens = static_cast<int32_t>(tokens.size());
  const int32_t rc = llama_decode(ctx.get(), batch);
  llama_batch_free(batch);
  EXPECT_EQ(rc, 0);
  if (rc != 0) return {};
  const float* logits = llama_get_logits_ith(ctx.get(), -1);
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  return std::vector<float>(logits, logits + n_vocab);
}

TEST_F(ModelMakerTest, LoadsWithTheShapeAsked) {
  MakeModelOptions o = Options("shape.gguf");
  o.layers = 3;
  o.embd = 96;
  o.heads = 6;
  o.kv_heads = 3;
  o.vocab = 600;
  o.context = 2048;
  o.name = "shape-test";
  ASSERT_TRUE(MakeModel(o).ok());
  ASSERT_TRUE(fs::exists(o.out_path));
  EXPECT_EQ(FeedForwardWidth(o), 256u);  // ceil(8*96/3) = 256, a multiple of 32

  ModelPtr model = Load(o.out_path);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(llama_model_n_layer(model.get()), 3);
  EXPECT_EQ(llama_model_n_embd(model.get()), 96);
  EXPECT_EQ(llama_model_n_head(model.get()), 6);
  EXPECT_EQ(llama_model_n_head_kv(model.get()), 3);
  EXPECT_EQ(llama_model_n_ctx_train(model.get()), 2048);
  EXPECT_EQ(llama_vocab_n_tokens(llama_model_get_vocab(model.get())), 600);
  char buf[64];
  ASSERT_GT(llama_model_meta_val_str(model.get(), "general.name", buf, sizeof(buf)), 0);
  EXPECT_STREQ(buf, "shape-test");
  ASSERT_GT(llama_model_meta_val_str(model.get(), "general.architecture", buf, sizeof(buf)), 0);
  EXPECT_STREQ(buf, "llama");
  const llama_vocab* vocab = llama_model_get_vocab(model.get());
  EXPECT_EQ(llama_vocab_bos(vocab), 1);
  EXPECT_EQ(llama_vocab_eos(vocab), 2);
  EXPECT_FALSE(llama_vocab_get_add_bos(vocab));
  EXPECT_FALSE(llama_vocab_get_add_eos(vocab));
}

TEST_F(ModelMakerTest, SameOptionsSameBytes) {
  MakeModelOptions a = Options("a.gguf");
  MakeModelOptions b = Options("b.gguf");
  MakeModelOptions c = Options("c.gguf");
  c.seed = 2;
  ASSERT_TRUE(MakeModel(a).ok());
  ASSERT_TRUE(MakeModel(b).ok());
  ASSERT_TRUE(MakeModel(c).ok());
  const std::string bytes_a = ReadAll(a.out_path);
  EXPECT_GT(bytes_a.size(), 100000u);
  EXPECT_EQ(bytes_a, ReadAll(b.out_path));
  const std::string bytes_c = ReadAll(c.out_path);
  EXPECT_EQ(bytes_a.size(), bytes_c.size());  // the weights differ, not the layout
  EXPECT_NE(bytes_a, bytes_c);

  ASSERT_TRUE(MakeModel(a).ok());  // rewriting replaces the file in place
  EXPECT_EQ(bytes_a, ReadAll(a.out_path));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 3);
}

// SentencePiece semantics: llama_tokenize prefixes one space ("▁Hello"), so
// the pieces read back with a leading space; llama_detokenize drops it.
TEST_F(ModelMakerTest, TokenizerRoundTrips) {
  for (uint32_t size : {300u, 512u, 8192u}) {
    SCOPED_TRACE("vocab " + std::to_string(size));
    MakeModelOptions o = Options("tok.gguf");
    o.vocab = size;
    ASSERT_TRUE(MakeModel(o).ok());
    ModelPtr model = Load(o.out_path);
    ASSERT_NE(model, nullptr);
    const llama_vocab* vocab = llama_model_get_vocab(model.get());

    const std::string text = "Hello world, this is kvrelay.";
    const std::vector<llama_token> ids = Tokenize(vocab, text);
    ASSERT_FALSE(ids.empty());
    EXPECT_LT(ids.size(), text.size());
    std::string pieces;
    std::string shown;
    for (llama_token id : ids) {
      EXPECT_GE(id, 3);  // no <unk>, no hidden <s> or </s>
      EXPECT_LT(id, static_cast<llama_token>(size));
      pieces += Piece(vocab, id);
      shown += "[" + Piece(vocab, id) + "]";
    }
    std::printf("vocab %u: %zu bytes -> %zu tokens: %s\n", size, text.size(), ids.size(),
                shown.c_str());
    EXPECT_EQ(pieces, " " + text);  // exactly one space added, in front

    std::vector<char> out(text.size() + 16);
    const int32_t n = llama_detokenize(vocab, ids.data(), static_cast<int32_t>(ids.size()),
                                       out.data(), static_cast<int32_t>(out.size()),
                                       /*remove_special=*/false, /*unparse_special=*/false);
    ASSERT_GE(n, 0);
    EXPECT_EQ(std::string(out.data(), n), text);

    // Bytes no piece covers fall back to <0xXX> tokens, and still round-trip.
    const std::string odd = "z\xc3\xa9\n{~}  Zq";
    std::string odd_pieces;
    for (llama_token id : Tokenize(vocab, odd)) odd_pieces += Piece(vocab, id);
    EXPECT_EQ(odd_pieces, " " + odd);
  }
}

TEST_F(ModelMakerTest, DecodesDeterministically) {
  const MakeModelOptions o = Options("decode.gguf");
  ASSERT_TRUE(MakeModel(o).ok());
  ModelPtr model = Load(o.out_path);
  ASSERT_NE(model, nullptr);

  const std::vector<llama_token> tokens = {300, 301, 17, 400, 280, 500, 3, 333};
  const std::vector<float> first = LastLogits(model.get(), tokens);
  ASSERT_EQ(first.size(), o.vocab);
  EXPECT_TRUE(std::all_of(first.begin(), first.end(), [](float x) { return std::isfinite(x); }));
  const auto [lo, hi] = std::minmax_element(first.begin(), first.end());
  EXPECT_LT(*lo, *hi);

  const std::vector<float> second = LastLogits(model.get(), tokens);
  ASSERT_EQ(second.size(), first.size());
  const auto argmax = [](const std::vector<float>& v) {
    return std::max_element(v.begin(), v.end()) - v.begin();
  };
  EXPECT_EQ(argmax(first), argmax(second));
  EXPECT_EQ(first, second);  // bit for bit, same threads and batch

  // The KV matters: another prefix before the same last token, other logits.
  std::vector<llama_token> other = tokens;
  other[0] = 444;
  EXPECT_NE(LastLogits(model.get(), other), first);
}

TEST_F(ModelMakerTest, BadOptionsWriteNothing) {
  MakeModelOptions o = Options("bad.gguf");
  o.embd = 100;
  o.heads = 3;
  EXPECT_EQ(MakeModel(o).code(), StatusCode::kInvalidArgument);

  o = Options("bad.gguf");
  o.vocab = 10;
  EXPECT_EQ(MakeModel(o).code(), StatusCode::kInvalidArgument);

  o = Options("bad.gguf");
  o.kv_heads = 3;  // heads 4
  EXPECT_EQ(MakeModel(o).code(), StatusCode::kInvalidArgument);

  o = Options("bad.gguf");
  o.layers = 0;
  EXPECT_EQ(MakeModel(o).code(), StatusCode::kInvalidArgument);

  o.out_path.clear();
  o.layers = 2;
  EXPECT_EQ(MakeModel(o).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::is_empty(dir_));

  o.out_path = PathOf("no-such-dir/x.gguf");
  const Status s = MakeModel(o);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(PathOf("no-such-dir/x.gguf")), std::string::npos) << s.ToString();
  EXPECT_TRUE(fs::is_empty(dir_));
}

// Not a check: how long making and loading take, for the engine's tests.
TEST_F(ModelMakerTest, PrintsMakeAndLoadTimes) {
  struct Shape { uint32_t layers, embd, heads, kv_heads, vocab; };
  for (const Shape& s : {Shape{2, 128, 4, 2, 512}, Shape{12, 768, 12, 4, 8192}}) {
    MakeModelOptions o = Options("timed.gguf");
    o.layers = s.layers;
    o.embd = s.embd;
    o.heads = s.heads;
    o.kv_heads = s.kv_heads;
    o.vocab = s.vocab;
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    ASSERT_TRUE(MakeModel(o).ok());
    const auto t1 = Clock::now();
    ModelPtr model = Load(o.out_path);
    const auto t2 = Clock::now();
    ASSERT_NE(model, nullptr);
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    std::printf("layers %u embd %u heads %u/%u ff %u vocab %u: %.1f MB, %llu params, "
                "make %.0f ms, load %.0f ms\n",
                s.layers, s.embd, s.heads, s.kv_heads, FeedForwardWidth(o), s.vocab,
                fs::file_size(o.out_path) / 1e6,
                static_cast<unsigned long long>(llama_model_n_params(model.get())), ms(t1 - t0),
                ms(t2 - t1));
  }
}

}  // namespace
}  // namespace kvrelay::llama
