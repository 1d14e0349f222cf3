// model_maker.cc — MakeModel: options checked, a vocabulary of English
// pieces built, the GGUF metadata written by ggml's gguf writer, then the
// tensor data streamed behind it (the whole model never sits in memory).
#include "llama/model_maker.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ggml.h"
#include "gguf.h"
#include "llama.h"

namespace kvrelay::llama {
namespace {

constexpr uint32_t kMaxLayers = 512;  // llama.cpp's LLAMA_MAX_LAYERS
constexpr uint32_t kMaxWidth = 65536;
constexpr uint32_t kMinVocab = 300;   // 3 special + 256 byte tokens + pieces
constexpr uint32_t kMaxVocab = 131072;
constexpr uint64_t kMaxFileBytes = uint64_t{16} << 30;
constexpr float kWeightScale = 0.0346f;  // uniform [-a, a): std 0.02
constexpr size_t kChunk = 1 << 16;       // values generated per write

constexpr std::string_view kSpace = "\xe2\x96\x81";  // ▁ (U+2581): SPM's space

// Frequent English words, most frequent first: each enters the vocabulary
// as "▁word" with all its prefixes, while there is room. A 512-token
// vocabulary holds the first list, the capitalized words and the bigrams;
// larger ones the second list too, then filler (letter strings).
constexpr std::string_view kWords =
    "the of and to in is it you that he was for on are as with his they at be "
    "this have from or one had by word but not what all were we when your can "
    "said there";
constexpr std::string_view kCapitalized = "The This It I Hello We You He She They In A What";
constexpr std::string_view kBigrams =
    "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng "
    "se ha as ou io le ve co me de hi ri ro ic ne ea ra ce li ch ll be ma si "
    "om ur ing ion ent ay la";
constexpr std::string_view kMoreWords =
    "use an each which she do how their if will up other about out many then "
    "them these so some her would make like him into time has look two more "
    "write go see number no way could people my than first water been call "
    "who its now find long down day did get come made may part hello world "
    "model token cache prompt text over new sound take only little work know "
    "place year live me back give most very after thing our just name good "
    "sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form "
    "three small set put end does another well large must big even such "
    "because turn here why ask went men read need land home us move try kind "
    "hand picture again change off play spell air away animal house point "
    "page letter mother answer found study still learn should";
constexpr std::string_view kPunctuation = ".,!?'\"-:;()/";

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  return h;
}

// Uniform in [-1, 1), exactly representable: 24 random bits scaled by 2^-23.
float UnitUniform(uint64_t* state) {
  return static_cast<float>(SplitMix64(state) >> 40) * 0x1p-23f - 1.0f;
}

size_t Utf8Chars(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

std::vector<std::string_view> SplitWords(std::string_view s) {
  std::vector<std::string_view> out;
  while (!s.empty()) {
    const size_t end = std::min(s.find(' '), s.size());
    if (end > 0) out.push_back(s.substr(0, end));
    s.remove_prefix(std::min(end + 1, s.size()));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Vocabulary

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;  // LLAMA_TOKEN_TYPE_*
};

// The normal pieces, in order, without duplicates, up to a count. Every
// multi-character piece is preceded by a shorter one it extends, so
// llama.cpp's SPM merges (pairs of adjacent pieces whose concatenation is a
// token) always reach it: "▁the" after "▁t" and "▁th".
class PieceList {
 public:
  PieceList(size_t cap, const std::vector<std::string>& taken)
      : cap_(cap), seen_(taken.begin(), taken.end()) {}

  bool full() const { return pieces_.size() >= cap_; }

  void Add(std::string piece) {
    if (full() || !seen_.insert(piece).second) return;
    pieces_.push_back(std::move(piece));
  }
  void AddWord(std::string_view word) {  // ▁ + every prefix of word
    for (size_t n = 1; n <= word.size(); ++n) {
      Add(std::string(kSpace) + std::string(word.substr(0, n)));
    }
  }
  // Every lowercase string of `len` letters, after `prefix`.
  void AddLetterStrings(std::string_view prefix, size_t len) {
    std::string s(len, 'a');
    while (!full()) {
      Add(std::string(prefix) + s);
      size_t i = len;
      while (i > 0 && s[i - 1] == 'z') s[--i] = 'a';
      if (i == 0) return;
      ++s[i - 1];
    }
  }
  std::vector<std::string> Take() { return std::move(pieces_); }

 private:
  size_t cap_;
  std::unordered_set<std::string> seen_;
  std::vector<std::string> pieces_;
};

std::vector<std::string> NormalPieces(size_t count, const std::vector<std::string>& taken) {
  PieceList p(count, taken);
  p.Add(std::string(kSpace));
  for (char c = 'a'; c <= 'z'; ++c) p.AddWord(std::string_view(&c, 1));
  for (char c = 'a'; c <= 'z'; ++c) p.Add(std::string(1, c));  // else bytes: looks only
  for (char c : kPunctuation) p.Add(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) p.Add(std::string(1, c));
  for (std::string_view w : SplitWords(kWords)) p.AddWord(w);
  for (char c = 'A'; c <= 'Z'; ++c) p.AddWord(std::string_view(&c, 1));
  for (std::string_view w : SplitWords(kCapitalized)) p.AddWord(w);
  for (std::string_view b : SplitWords(kBigrams)) p.Add(std::string(b));
  for (std::string_view w : SplitWords(kMoreWords)) p.AddWord(w);
  for (char c = 'A'; c <= 'Z'; ++c) p.Add(std::string(1, c));
  p.AddLetterStrings(kSpace, 2);  // then filler, still prefix-closed
  p.AddLetterStrings("", 2);
  p.AddLetterStrings(kSpace, 3);
  p.AddLetterStrings(kSpace, 4);
  return p.Take();
}

Vocab BuildVocab(uint32_t size) {
  Vocab v;
  auto add = [&v](std::string text, float score, int32_t type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0.0f, LLAMA_TOKEN_TYPE_UNKNOWN);
  add("<s>", 0.0f, LLAMA_TOKEN_TYPE_CONTROL);
  add("</s>", 0.0f, LLAMA_TOKEN_TYPE_CONTROL);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    add(hex, 0.0f, LLAMA_TOKEN_TYPE_BYTE);
  }
  // Longer pieces score higher: SPM merges the best-scoring pair first.
  for (std::string& piece : NormalPieces(size - v.tokens.size(), v.tokens)) {
    const float score = static_cast<float>(Utf8Chars(piece));
    add(std::move(piece), score, LLAMA_TOKEN_TYPE_NORMAL);
  }
  return v;
}

// ---------------------------------------------------------------------------
// Tensors

struct TensorSpec {
  std::string name;
  int64_t cols = 0;  // ne[0], contiguous
  int64_t rows = 0;  // ne[1]; 0: a 1-D norm of `cols` (F32, all 1.0)
};

std::vector<TensorSpec> TensorSpecs(const MakeModelOptions& o, uint32_t ff) {
  const int64_t embd = o.embd, kv = int64_t{o.embd} / o.heads * o.kv_heads;
  std::vector<TensorSpec> t;
  t.push_back({"token_embd.weight", embd, o.vocab});
  for (uint32_t i = 0; i < o.layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    t.push_back({b + "attn_norm.weight", embd, 0});
    t.push_back({b + "attn_q.weight", embd, embd});
    t.push_back({b + "attn_k.weight", embd, kv});
    t.push_back({b + "attn_v.weight", embd, kv});
    t.push_back({b + "attn_output.weight", embd, embd});
    t.push_back({b + "ffn_norm.weight", embd, 0});
    t.push_back({b + "ffn_gate.weight", embd, ff});
    t.push_back({b + "ffn_down.weight", ff, embd});
    t.push_back({b + "ffn_up.weight", embd, ff});
  }
  t.push_back({"output_norm.weight", embd, 0});
  t.push_back({"output.weight", embd, o.vocab});
  return t;
}

uint64_t DataBytes(const std::vector<TensorSpec>& specs) {
  uint64_t n = 0;
  for (const TensorSpec& t : specs) n += t.rows == 0 ? 4 * t.cols : 2 * t.cols * t.rows;
  return n;
}

Status Validate(const MakeModelOptions& o) {
  auto bad = [](const std::string& why) { return InvalidArgumentError("MakeModel: " + why); };
  if (o.out_path.empty()) return bad("out_path is empty");
  if (o.layers == 0 || o.layers > kMaxLayers) return bad("layers must be in 1..512");
  if (o.heads == 0 || o.kv_heads == 0) return bad("heads and kv_heads must be positive");
  if (o.embd == 0 || o.embd > kMaxWidth || o.ff > kMaxWidth) {
    return bad("embd and ff must be in 1..65536");
  }
  if (o.embd % o.heads != 0) {
    return bad("embd " + std::to_string(o.embd) + " is not a multiple of heads " +
               std::to_string(o.heads));
  }
  if ((o.embd / o.heads) % 2 != 0) return bad("the head size embd/heads must be even (RoPE)");
  if (o.heads % o.kv_heads != 0) return bad("heads must be a multiple of kv_heads");
  if (o.vocab < kMinVocab || o.vocab > kMaxVocab) return bad("vocab must be in 300..131072");
  if (o.context == 0) return bad("context must be positive");
  if (DataBytes(TensorSpecs(o, FeedForwardWidth(o))) > kMaxFileBytes) {
    return bad("the model would exceed 16 GiB");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// The GGUF

struct GgmlFree { void operator()(ggml_context* c) const { ggml_free(c); } };
struct GgufFree { void operator()(gguf_context* c) const { gguf_free(c); } };

void SetModelKeys(gguf_context* g, const MakeModelOptions& o, uint32_t ff) {
  gguf_set_val_str(g, "general.architecture", "llama");
  gguf_set_val_str(g, "general.name", o.name.c_str());
  gguf_set_val_u32(g, "general.file_type", LLAMA_FTYPE_MOSTLY_F16);
  gguf_set_val_u32(g, "llama.vocab_size", o.vocab);
  gguf_set_val_u32(g, "llama.context_length", o.context);
  gguf_set_val_u32(g, "llama.embedding_length", o.embd);
  gguf_set_val_u32(g, "llama.block_count", o.layers);
  gguf_set_val_u32(g, "llama.feed_forward_length", ff);
  gguf_set_val_u32(g, "llama.attention.head_count", o.heads);
  gguf_set_val_u32(g, "llama.attention.head_count_kv", o.kv_heads);
  gguf_set_val_u32(g, "llama.rope.dimension_count", o.embd / o.heads);
  gguf_set_val_f32(g, "llama.rope.freq_base", 10000.0f);
  gguf_set_val_f32(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
}

void SetVocabKeys(gguf_context* g, const Vocab& v) {
  std::vector<const char*> texts;
  for (const std::string& t : v.tokens) texts.push_back(t.c_str());
  gguf_set_val_str(g, "tokenizer.ggml.model", "llama");
  gguf_set_arr_str(g, "tokenizer.ggml.tokens", texts.data(), texts.size());
  gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v.scores.data(),
                    v.scores.size());
  gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.types.data(),
                    v.types.size());
  gguf_set_val_u32(g, "tokenizer.ggml.unknown_token_id", 0);
  gguf_set_val_u32(g, "tokenizer.ggml.bos_token_id", 1);
  gguf_set_val_u32(g, "tokenizer.ggml.eos_token_id", 2);
  gguf_set_val_bool(g, "tokenizer.ggml.add_bos_token", false);
  gguf_set_val_bool(g, "tokenizer.ggml.add_eos_token", false);
  gguf_set_val_bool(g, "tokenizer.ggml.add_space_prefix", true);
}

// The file being written: removed unless Commit renames it into place.
class TempFile {
 public:
  explicit TempFile(std::string final_path)
      : final_(std::move(final_path)),
        path_(final_ + ".tmp-" + std::to_string(::getpid())),
        file_(std::fopen(path_.c_str(), "wb")) {}
  ~TempFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (!committed_) std::remove(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  FILE* file() const { return file_; }
  Status Error(const std::string& what) const {
    return UnavailableError("MakeModel: " + what + " " + path_ + ": " + std::strerror(errno));
  }
  bool Write(const void* data, size_t n) { return std::fwrite(data, 1, n, file_) == n; }
  Status Commit() {
    FILE* f = std::exchange(file_, nullptr);
    if (std::fclose(f) != 0) return Error("cannot finish writing");
    std::error_code ec;
    std::filesystem::rename(path_, final_, ec);
    if (ec) {
      return UnavailableError("MakeModel: cannot rename " + path_ + " to " + final_ + ": " +
                              ec.message());
    }
    committed_ = true;
    return Status::Ok();
  }

 private:
  std::string final_;
  std::string path_;
  FILE* file_;
  bool committed_ = false;
};

// One tensor's data: norms 1.0 (F32), else F16 uniform from (seed, name).
bool WriteTensorData(TempFile& out, const TensorSpec& t, uint64_t seed) {
  if (t.rows == 0) {
    const std::vector<float> ones(t.cols, 1.0f);
    return out.Write(ones.data(), ones.size() * sizeof(float));
  }
  uint64_t state = seed ^ Fnv1a(t.name);
  SplitMix64(&state);
  std::vector<float> values(kChunk);
  std::vector<ggml_fp16_t> half(kChunk);
  for (uint64_t left = static_cast<uint64_t>(t.cols) * t.rows; left > 0;) {
    const size_t n = std::min<uint64_t>(left, kChunk);
    for (size_t i = 0; i < n; ++i) values[i] = kWeightScale * UnitUniform(&state);
    ggml_fp32_to_fp16_row(values.data(), half.data(), static_cast<int64_t>(n));
    if (!out.Write(half.data(), n * sizeof(ggml_fp16_t))) return false;
    left -= n;
  }
  return true;
}

// Metadata through gguf_write_to_file_ptr, then each tensor's data at the
// offset ggml's gguf context assigned it, padded to its alignment.
Status WriteFile(gguf_context* g, const std::vector<TensorSpec>& specs,
                 const MakeModelOptions& o) {
  TempFile out(o.out_path);
  if (out.file() == nullptr) return out.Error("cannot create");
  if (!gguf_write_to_file_ptr(g, out.file(), /*only_meta=*/true)) {
    return out.Error("cannot write the metadata of");
  }
  const size_t alignment = gguf_get_alignment(g);
  const std::vector<char> zeros(alignment, 0);
  uint64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (gguf_get_tensor_offset(g, static_cast<int64_t>(i)) != offset) {
      return InternalError("MakeModel: tensor " + specs[i].name + " offset disagrees with gguf's");
    }
    if (!WriteTensorData(out, specs[i], o.seed)) return out.Error("cannot write");
    const uint64_t bytes = gguf_get_tensor_size(g, static_cast<int64_t>(i));
    const uint64_t padded = GGML_PAD(bytes, alignment);
    if (!out.Write(zeros.data(), padded - bytes)) return out.Error("cannot write");
    offset += padded;
  }
  return out.Commit();
}

}  // namespace

Status MakeModel(const MakeModelOptions& o) {
  if (Status s = Validate(o); !s.ok()) return s;
  const uint32_t ff = FeedForwardWidth(o);
  const std::vector<TensorSpec> specs = TensorSpecs(o, ff);

  const ggml_init_params params = {ggml_tensor_overhead() * (specs.size() + 1), nullptr,
                                   /*no_alloc=*/true};
  std::unique_ptr<ggml_context, GgmlFree> ctx(ggml_init(params));
  std::unique_ptr<gguf_context, GgufFree> g(gguf_init_empty());
  if (ctx == nullptr || g == nullptr) return InternalError("MakeModel: ggml/gguf init failed");

  SetModelKeys(g.get(), o, ff);
  SetVocabKeys(g.get(), BuildVocab(o.vocab));
  for (const TensorSpec& t : specs) {
    ggml_tensor* tensor = t.rows == 0
                              ? ggml_new_tensor_1d(ctx.get(), GGML_TYPE_F32, t.cols)
                              : ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F16, t.cols, t.rows);
    ggml_set_name(tensor, t.name.c_str());
    gguf_add_tensor(g.get(), tensor);  // copies the tensor's shape and type
  }
  return WriteFile(g.get(), specs, o);
}

}  // namespace kvrelay::llama
