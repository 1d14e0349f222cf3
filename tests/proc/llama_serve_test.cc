// llama_serve_test.cc — `kvrelay serve --engine llama` as a client sees it:
// a model made by `kvrelay make-model`, served over HTTP, its outputs
// checked token for token against llama.cpp decoding each prompt alone
// (llama::ReferenceDecoder, in this process).
//
//   LlamaServeTest.OutputsEqualLlamaCppAlone
//       /v1/models names the model (its general.name); a text prompt and the
//       same prompt as token ids (tokenized here by the model's own
//       tokenizer) give the reference's tokens at temperature 0; seeded
//       temperature 0.8, and the default temperature 1 seed 0, equal the
//       reference with the same sampling; a streamed request gives the same
//       ids as the non-streamed one; bad input gets a 400 naming the problem.
//   LlamaServeTest.LifecycleCallsUnderLoad
//       16 clients keep completions in flight (a quarter streamed) while each
//       lifecycle call runs (pause abort / wait+clear_cache / keep, sleep 1
//       and 2, reset_prefix_cache with running requests, release_kv_cache_
//       memory, update_weights to version 2): each call answers promptly
//       (latency printed), every request ends 200 with finish_reason length
//       (all its tokens) or abort (the abort modes abort some, the others
//       none), each greedy output's first token is llama.cpp's (whole
//       outputs equal to llama.cpp alone are counted), the engine
//       is idle with no block used, and a temperature-0 probe equals the
//       reference of the weights in force.
//   LlamaServeTest.UnusableWeightsVersionIsRefusedAndServingGoesOn
//       update_weights to a version whose file went away after startup, or
//       to one never given: 409 naming why; version 1 serves on.
//   LlamaServeTest.RefusedFlagSetsExitNonZeroWithAMessage
//       serve --engine llama without --model, with --role prefill, with a
//       missing or non-GGUF file, a bad --weights-version, a missing one or
//       one of another vocabulary: exit 2 and one
//       line on stderr saying why.
//   LlamaServeTest.StreamedTextEqualsWholeText
//       40 sampled requests, streamed and not: the chunks' texts add up to
//       the whole text, although characters whose UTF-8 bytes are byte
//       tokens fall across chunks (server::Utf8Stream holds their first
//       bytes back until the chunk that completes them).
//
// Models: made once per run in a temporary folder (`kvrelay make-model`,
// the defaults: 2 layers, embd 128, vocab 512). Engines run with --threads 1
// and serve's llama defaults (256 blocks of 16 tokens = a 4,096-token
// context, 512-token batches), which the reference decoder copies.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <llama.h>

#include "llama/llama_backend.h"
#include "llama/llama_model.h"
#include "llama/reference_decoder.h"
#include "proc/harness.h"

namespace kvrelay::proctest {
namespace {

using Clock = std::chrono::steady_clock;
using Tokens = std::vector<engine::Token>;

constexpr uint32_t kVocab = 512;          // make-model's default
constexpr uint32_t kContext = 4096;       // serve's llama default: 256 blocks × 16
constexpr uint32_t kBatchTokens = 512;    // serve's llama default --max-batch-tokens
constexpr uint32_t kThreads = 1;
constexpr const char* kNamed = "llama-serve-test-model";

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// --- the models, made once -----------------------------------------------------

// v1 (seed 11, the default name), v2 (seed 22: update_weights' version 2),
// named (seed 11, --name kNamed), wide (vocab 1024: not a valid version 2).
class Models : public ::testing::Environment {
 public:
  static std::string Path(const std::string& which) { return dir_ + "/" + which + ".gguf"; }
  static bool ready() { return ready_; }
  static const std::string& dir() { return dir_; }

  void SetUp() override {
    char tmpl[] = "/tmp/kvrelay-llama-serve-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    const auto t0 = Clock::now();
    ready_ = Make("v1", {"--seed", "11"}) && Make("v2", {"--seed", "22"}) &&
             Make("named", {"--seed", "11", "--name", kNamed}) &&
             Make("wide", {"--seed", "33", "--vocab", "1024"});
    std::printf("[models] made 4 models in %s in %.3f s\n", dir_.c_str(), SecondsSince(t0));
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

 private:
  static bool Make(const std::string& which, std::vector<std::string> args) {
    args.insert(args.begin(), {"make-model", "--out", Path(which)});
    std::string err;
    std::unique_ptr<Proc> p = Proc::Start(KvrelayBinary(), args, dir_ + "/make-" + which + ".log",
                                          &err);
    if (!p) {
      std::printf("[models] %s\n", err.c_str());
      return false;
    }
    const std::optional<int> st = p->Wait(30s);
    if (!st || !WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
      std::printf("[models] make-model %s failed:\n%s\n", which.c_str(), p->ReadLog().c_str());
      return false;
    }
    return true;
  }
  static inline std::string dir_;
  static inline bool ready_ = false;
};
[[maybe_unused]] ::testing::Environment* const g_models =
    ::testing::AddGlobalTestEnvironment(new Models);

// llama.cpp alone on `model`, with serve's llama defaults (one decoder per
// file, kept for the run; used from the test's thread only).
Tokens Reference(const std::string& model, const Tokens& prompt, uint32_t n,
                 engine::Sampling sampling = {}) {
  static std::map<std::string, std::unique_ptr<llama::ReferenceDecoder>> decoders;
  std::unique_ptr<llama::ReferenceDecoder>& d = decoders[model];
  if (!d) {
    auto r = llama::ReferenceDecoder::Open(
        llama::ReferenceOptions{model, kThreads, kContext, kBatchTokens});
    if (!r.ok()) {
      ADD_FAILURE() << "ReferenceDecoder " << model << ": " << r.status().ToString();
      return {};
    }
    d = std::move(*r);
  }
  // The load's requests ignore the end token (Request()); so does this.
  return d->Generate(prompt, n, sampling, /*ignore_eos=*/true);
}

// The logits llama.cpp alone gives for the token after `prompt` (the
// reference decoder's context and batches), to tell a near tie from a wrong
// token. One context per file, kept for the run; the test's thread only.
std::vector<float> LogitsAfter(const std::string& model, const Tokens& prompt) {
  struct Ctx {
    llama_model* model = nullptr;
    llama_context* ctx = nullptr;
    uint32_t vocab = 0;
  };
  static std::map<std::string, Ctx> ctxs;
  Ctx& c = ctxs[model];
  if (c.ctx == nullptr) {
    llama::EnsureBackends();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    c.model = llama_model_load_from_file(model.c_str(), mp);
    if (c.model == nullptr) return {};
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = kContext;
    cp.n_batch = kBatchTokens;
    cp.n_ubatch = kBatchTokens;
    cp.n_threads = kThreads;
    cp.n_threads_batch = kThreads;
    cp.no_perf = true;
    c.ctx = llama_init_from_model(c.model, cp);
    if (c.ctx == nullptr) return {};
    c.vocab = static_cast<uint32_t>(llama_vocab_n_tokens(llama_model_get_vocab(c.model)));
  }
  llama_memory_clear(llama_get_memory(c.ctx), false);
  std::vector<llama_token> seq(prompt.begin(), prompt.end());
  for (size_t done = 0; done < seq.size();) {
    const size_t n = std::min<size_t>(kBatchTokens, seq.size() - done);
    if (llama_decode(c.ctx, llama_batch_get_one(seq.data() + done, static_cast<int32_t>(n))) != 0) {
      return {};
    }
    done += n;
  }
  const float* l = llama_get_logits_ith(c.ctx, -1);
  return std::vector<float>(l, l + c.vocab);
}

// The model's tokenizer, for text prompts.
llama::LlamaTokenizer& Tokenizer(const std::string& model) {
  static std::map<std::string, std::unique_ptr<llama::LlamaTokenizer>> toks;
  std::unique_ptr<llama::LlamaTokenizer>& t = toks[model];
  if (!t) {
    auto r = llama::LlamaTokenizer::Open(model);
    if (!r.ok()) std::abort();
    t = std::move(*r);
  }
  return *t;
}

// Bytes as the server's JSON carries them (invalid UTF-8 replaced by U+FFFD).
std::string AsJsonText(const std::string& bytes) {
  return json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

std::unique_ptr<Engine> StartLlama(const std::string& name, const std::string& model,
                                   const std::vector<std::string>& more = {}) {
  EngineConfig c;
  c.name = name;
  c.role = "plain";
  c.extra = {"--engine", "llama", "--model", model, "--threads", std::to_string(kThreads)};
  c.extra.insert(c.extra.end(), more.begin(), more.end());
  std::string err;
  std::unique_ptr<Engine> e = Engine::Start(c, &err);
  EXPECT_NE(e, nullptr) << err;
  return e;
}

json Request(const json& prompt, uint32_t n, std::optional<double> temperature,
             std::optional<int64_t> seed = std::nullopt, bool stream = false) {
  // ignore_eos: outputs of n tokens, whatever the made model draws (the
  // end token's own stop is the engine test's EndOfGenerationStops...).
  json b = {{"prompt", prompt}, {"max_tokens", n}, {"ignore_eos", true}};
  if (temperature) b["temperature"] = *temperature;
  if (seed) b["seed"] = *seed;
  if (stream) {
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
  }
  return b;
}

// `n` ids in [3, vocab): no <unk>, <s> or </s>.
Tokens Prompt(std::mt19937_64& rng, size_t n) {
  Tokens p(n);
  for (auto& t : p) t = static_cast<engine::Token>(3 + rng() % (kVocab - 3));
  return p;
}

// A streamed completion, read back from its server-sent events.
struct Streamed {
  bool ok = false;          // parsed, ended with [DONE], no error event
  Tokens tokens;
  std::vector<uint64_t> versions;
  std::string text;
  std::string finish;       // of the last choice chunk
  int chunks = 0;
  int64_t usage_completion = -1;
  std::string problem;
};

Streamed ParseStream(const HttpReply& r) {
  Streamed s;
  if (r.status != 200) {
    s.problem = Describe(r);
    return s;
  }
  bool done = false;
  size_t pos = 0;
  while (pos < r.raw.size()) {
    size_t end = r.raw.find("\n\n", pos);
    if (end == std::string::npos) end = r.raw.size();
    const std::string event = r.raw.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;   // ": keep-alive" comments
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    if (done) {
      s.problem = "an event after [DONE]";
      return s;
    }
    const json j = json::parse(data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      s.problem = "an event that is not JSON: " + data;
      return s;
    }
    if (j.contains("error")) {
      s.problem = "error event: " + data;
      return s;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      s.usage_completion = j["usage"].value("completion_tokens", int64_t{-1});
    }
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (!s.finish.empty()) {
      s.problem = "a choice chunk after finish_reason";
      return s;
    }
    ++s.chunks;
    try {
      for (const json& t : c.value("token_ids", json::array())) {
        s.tokens.push_back(t.get<engine::Token>());
      }
      for (const json& v : c.value("weights_versions", json::array())) {
        s.versions.push_back(v.get<uint64_t>());
      }
      s.text += c.value("text", std::string());
    } catch (const json::exception& ex) {
      s.problem = std::string("a malformed chunk (") + ex.what() + "): " + data;
      return s;
    }
    if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
      s.finish = c["finish_reason"].get<std::string>();
    }
  }
  if (!done) {
    s.problem = "no [DONE]";
    return s;
  }
  s.ok = true;
  return s;
}

std::string Join(const std::vector<uint64_t>& v) {
  std::string s;
  for (uint64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "[" + s + "]";
}

// --- 1. outputs ----------------------------------------------------------------------

TEST(LlamaServeTest, OutputsEqualLlamaCppAlone) {
  ASSERT_TRUE(Models::ready());
  const std::string model = Models::Path("named");
  std::unique_ptr<Engine> e = StartLlama("llama", model);
  ASSERT_NE(e, nullptr);
  std::mt19937_64 rng(TestSeed());

  // /v1/models: the GGUF's general.name and the context.
  {
    HttpReply m = e->Get("/v1/models");
    ASSERT_EQ(m.status, 200) << Describe(m);
    ASSERT_TRUE(m.is_json() && m.body.contains("data") && m.body["data"].size() == 1)
        << Describe(m);
    EXPECT_EQ(m.body["data"][0].value("id", ""), kNamed) << Describe(m);
    EXPECT_EQ(m.body["data"][0].value("max_model_len", 0u), kContext) << Describe(m);
  }

  // A text prompt, tokenized by the server, and the same prompt as ids.
  const std::string text = "The quick brown fox jumps over the lazy dog, and the world said hello.";
  const Tokens ids = Tokenizer(model).Encode(text);
  ASSERT_FALSE(ids.empty());
  const Tokens greedy = Reference(model, ids, 24, engine::Sampling{0.0f, 0});
  ASSERT_EQ(greedy.size(), 24u);
  {
    // (The helper LifecycleCallsUnderLoad judges near ties with.)
    const std::vector<float> l = LogitsAfter(model, ids);
    ASSERT_EQ(l.size(), kVocab);
    EXPECT_EQ(std::max_element(l.begin(), l.end()) - l.begin(), greedy[0]);
  }
  HttpReply by_text = e->Post("/v1/completions", Request(text, 24, 0.0));
  HttpReply by_ids = e->Post("/v1/completions", Request(ids, 24, 0.0));
  for (const HttpReply* r : {&by_text, &by_ids}) {
    const Choice c = ChoiceOf(*r);
    ASSERT_TRUE(c.ok) << Describe(*r);
    EXPECT_EQ(c.tokens, greedy) << Describe(*r);
    EXPECT_EQ(c.finish_reason, "length");
    EXPECT_EQ(c.versions, std::vector<uint64_t>(24, 1));
    EXPECT_EQ(r->body["usage"].value("prompt_tokens", 0u), ids.size()) << Describe(*r);
    EXPECT_EQ(r->body["usage"].value("completion_tokens", 0u), 24u) << Describe(*r);
    EXPECT_EQ(r->body["choices"][0].value("text", ""), AsJsonText(Tokenizer(model).Decode(greedy)));
    EXPECT_EQ(r->body.value("model", ""), kNamed);
  }
  // `model` in the body: its own name is taken, another refused.
  {
    json b = Request(ids, 4, 0.0);
    b["model"] = kNamed;
    const Choice c = ChoiceOf(e->Post("/v1/completions", b));
    EXPECT_EQ(c.tokens, Tokens(greedy.begin(), greedy.begin() + 4));
  }

  // Id prompts: one token, a block and one, longer than a batch (prefilled
  // in two chunks), near a quarter of the context.
  for (size_t len : {1u, 17u, 600u, 1000u}) {
    const Tokens p = Prompt(rng, len);
    HttpReply r = e->Post("/v1/completions", Request(p, 12, 0.0));
    const Choice c = ChoiceOf(r);
    ASSERT_TRUE(c.ok) << Describe(r);
    EXPECT_EQ(c.tokens, Reference(model, p, 12)) << "prompt of " << len;
  }

  // Seeded sampling at temperature 0.8 (a negative seed is its 64 bits),
  // and the defaults: temperature 1, seed 0.
  const Tokens sp = Prompt(rng, 40);
  int off_greedy = 0;
  const Tokens sp_greedy = Reference(model, sp, 20);
  for (int64_t seed : {int64_t{1}, int64_t{42}, int64_t{-4}}) {
    const engine::Sampling s{0.8f, static_cast<uint64_t>(seed)};
    const Tokens want = Reference(model, sp, 20, s);
    for (int rep = 0; rep < 2; ++rep) {
      HttpReply r = e->Post("/v1/completions", Request(sp, 20, 0.8, seed));
      const Choice c = ChoiceOf(r);
      ASSERT_TRUE(c.ok) << Describe(r);
      EXPECT_EQ(c.tokens, want) << "seed " << seed << ", try " << rep;
    }
    off_greedy += want != sp_greedy ? 1 : 0;
  }
  EXPECT_GT(off_greedy, 0) << "temperature 0.8 drew the greedy path for every seed";
  {
    HttpReply r = e->Post("/v1/completions", json{{"prompt", sp}, {"max_tokens", 20}});
    const Choice c = ChoiceOf(r);
    ASSERT_TRUE(c.ok) << Describe(r);
    EXPECT_EQ(c.tokens, Reference(model, sp, 20, engine::Sampling{1.0f, 0}))
        << "no temperature and no seed: temperature 1, seed 0";
  }

  // Streamed: the same ids as without streaming (greedy and seeded).
  for (std::optional<int64_t> seed : {std::optional<int64_t>(), std::optional<int64_t>(7)}) {
    const double temp = seed ? 0.8 : 0.0;
    const Tokens p = Prompt(rng, 30);
    HttpReply whole = e->Post("/v1/completions", Request(p, 16, temp, seed));
    const Choice w = ChoiceOf(whole);
    ASSERT_TRUE(w.ok) << Describe(whole);
    HttpReply sr = e->Post("/v1/completions", Request(p, 16, temp, seed, /*stream=*/true));
    const Streamed s = ParseStream(sr);
    ASSERT_TRUE(s.ok) << s.problem << "\n" << sr.raw;
    EXPECT_EQ(s.tokens, w.tokens) << "seed " << (seed ? *seed : -1);
    EXPECT_EQ(s.versions, w.versions);
    EXPECT_EQ(s.finish, "length");
    EXPECT_EQ(s.usage_completion, 16);
    const engine::Sampling sampling{static_cast<float>(temp),
                                    static_cast<uint64_t>(seed.value_or(0))};
    EXPECT_EQ(w.tokens, Reference(model, p, 16, sampling));
  }

  // Bad input: 400 with a message naming the problem.
  const Tokens full = Prompt(rng, kContext);
  std::string long_text;
  for (int i = 0; i < 5000; ++i) long_text += "the ";
  json wrong_model = Request(ids, 4, 0.0);
  wrong_model["model"] = "kvrelay-made";
  struct Bad {
    const char* name;
    json body;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {"temperature 3", Request(ids, 4, 3.0), "temperature is 3"},
      {"temperature below 0", Request(ids, 4, -0.5), "it must be in [0, 2]"},
      {"seed not an integer", json{{"prompt", ids}, {"seed", 1.5}}, "seed must be an integer"},
      {"a token id = vocab", Request(json::array({5, 6, kVocab}), 4, 0.0),
       "prompt[2] is 512; token ids must be in [0, 512)"},
      {"a negative token id", Request(json::array({5, -1}), 4, 0.0), "prompt[1] is -1"},
      {"ids as long as the context", Request(full, 1, 0.0), "prompt has 4096 tokens"},
      {"a text longer than the context", Request(long_text, 1, 0.0), "prompt has"},
      {"max_tokens past the context", Request(Tokens(full.begin(), full.begin() + 4090), 10, 0.0),
       "leave room for at most 6"},
      {"another model", wrong_model, "is not served here"},
  };
  for (const Bad& b : bad) {
    HttpReply r = e->Post("/v1/completions", b.body);
    EXPECT_EQ(r.status, 400) << b.name << ": " << Describe(r);
    const std::string msg = r.is_json() && r.body.contains("error")
                                ? r.body["error"].value("message", std::string())
                                : std::string();
    EXPECT_NE(msg.find(b.message), std::string::npos) << b.name << ": " << Describe(r);
    std::printf("[400] %-32s %s\n", b.name, msg.c_str());
  }

  // Still serving, idle, nothing held.
  const Tokens last = Prompt(rng, 9);
  const Choice c = ChoiceOf(e->Post("/v1/completions", Request(last, 8, 0.0)));
  EXPECT_EQ(c.tokens, Reference(model, last, 8));
  EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s)) << e->DebugState().dump();
}

// --- 2. lifecycle calls under load --------------------------------------------------

constexpr uint32_t kLoadTokens = 32;

// What one load request ended with.
struct Outcome {
  int status = 0;
  bool stream = false;
  bool greedy = false;   // temperature 0
  Tokens prompt;
  std::string finish;
  size_t tokens = 0;
  Tokens ids;
  std::vector<uint64_t> versions;
  std::string problem;   // non-empty: not a proper ending
};

// `workers` clients, each issuing one completion after another (32 tokens,
// prompts of 4..250 ids, temperature 0 or 0.8 seeded, one in four streamed)
// until Stop().
class Load {
 public:
  Load(Engine& e, uint32_t workers, uint64_t seed) : e_(e) {
    for (uint32_t w = 0; w < workers; ++w) {
      threads_.emplace_back([this, w, seed] { Run(seed * 1000 + w); });
    }
  }
  ~Load() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  uint64_t completed() const { return completed_.load(); }
  uint32_t in_flight() const { return in_flight_.load(); }
  const std::vector<Outcome>& outcomes() const { return outcomes_; }   // after Stop

 private:
  void Run(uint64_t seed) {
    std::mt19937_64 rng(seed);
    while (!stop_) {
      const Tokens p = Prompt(rng, 4 + rng() % 247);
      const bool stream = rng() % 4 == 0;
      const bool sampled = rng() % 2 == 0;
      const json body = Request(p, kLoadTokens, sampled ? 0.8 : 0.0,
                                sampled ? std::optional<int64_t>(rng() % 1000) : std::nullopt,
                                stream);
      ++in_flight_;
      const HttpReply r = e_.Post("/v1/completions", body, 30s);
      --in_flight_;
      Outcome o;
      o.status = r.status;
      o.stream = stream;
      o.greedy = !sampled;
      o.prompt = p;
      if (stream) {
        const Streamed s = ParseStream(r);
        o.finish = s.finish;
        o.ids = s.tokens;
        o.versions = s.versions;
        if (!s.ok) o.problem = s.problem;
      } else {
        const Choice c = ChoiceOf(r);
        o.finish = c.finish_reason;
        o.ids = c.tokens;
        o.versions = c.versions;
        if (!c.ok) o.problem = Describe(r);
      }
      o.tokens = o.ids.size();
      if (o.problem.empty()) {
        if (o.finish == "length" && o.tokens != kLoadTokens) {
          o.problem = "length with " + std::to_string(o.tokens) + " tokens";
        } else if (o.finish != "length" && o.finish != "abort") {
          o.problem = "finish_reason '" + o.finish + "'";
        } else if (o.versions.size() != o.tokens) {
          o.problem = "weights_versions " + Join(o.versions) + " for " +
                      std::to_string(o.tokens) + " tokens";
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        outcomes_.push_back(std::move(o));
      }
      ++completed_;
    }
  }

  Engine& e_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint32_t> in_flight_{0};
  std::mutex mu_;
  std::vector<Outcome> outcomes_;
  std::vector<std::thread> threads_;
};

TEST(LlamaServeTest, LifecycleCallsUnderLoad) {
  ASSERT_TRUE(Models::ready());
  std::unique_ptr<Engine> e =
      StartLlama("llama", Models::Path("v1"), {"--weights-version", "2=" + Models::Path("v2")});
  ASSERT_NE(e, nullptr);
  {
    HttpReply m = e->Get("/v1/models");
    ASSERT_TRUE(m.is_json() && m.body.contains("data") && !m.body["data"].empty()) << Describe(m);
    EXPECT_EQ(m.body["data"][0].value("id", ""), "kvrelay-made") << Describe(m);
  }
  std::mt19937_64 rng(TestSeed());

  struct Call {
    const char* name;
    std::string path;
    json body;            // null: no body
    std::string state;    // the engine's state right after the call
    std::string undo;     // the call that ends it ("" for none)
    bool aborts;          // in-flight requests end with abort (else none does)
    uint64_t version;     // weights in force after it
  };
  const std::vector<Call> calls = {
      {"pause abort", "/pause?mode=abort", nullptr, "paused", "/resume", true, 1},
      {"pause wait clear_cache", "/pause?mode=wait&clear_cache=true", nullptr, "paused",
       "/resume", false, 1},
      {"pause keep", "/pause?mode=keep", nullptr, "paused", "/resume", false, 1},
      {"sleep level 1 (wait)", "/sleep?level=1&mode=wait", nullptr, "sleeping", "/wake_up",
       false, 1},
      {"sleep level 2 (abort)", "/sleep?level=2", nullptr, "sleeping", "/wake_up", true, 1},
      {"reset_prefix_cache running", "/reset_prefix_cache?reset_running_requests=true", nullptr,
       "active", "", false, 1},
      {"release_kv_cache_memory", "/release_kv_cache_memory", nullptr, "kv_released",
       "/wake_up", false, 1},
      {"update_weights 2 (abort)", "/update_weights", json{{"version", 2}}, "active", "", true, 2},
  };
  const Tokens probe = Prompt(rng, 50);
  const std::map<uint64_t, Tokens> want = {{1, Reference(Models::Path("v1"), probe, 16)},
                                           {2, Reference(Models::Path("v2"), probe, 16)}};
  ASSERT_NE(want.at(1), want.at(2)) << "the two weights versions decode the probe alike";

  auto admin = [&](const std::string& path, const json& body) {
    return body.is_null() ? e->PostRaw(path, "") : e->Post(path, body);
  };
  std::printf("%-38s %9s %9s %9s %8s %7s %7s %11s\n", "[lifecycle] call", "latency", "undo",
              "in-flight", "requests", "length", "abort", "greedy=ref");
  for (const Call& call : calls) {
    SCOPED_TRACE(call.name);
    const auto t0 = Clock::now();
    Load load(*e, 16, rng());
    // Under way: requests have ended and more are in flight.
    ASSERT_TRUE(WaitFor([&] { return load.completed() >= 16 && load.in_flight() >= 8; }, 20s))
        << "completed " << load.completed() << ", in flight " << load.in_flight();
    const uint32_t in_flight = load.in_flight();
    const HttpReply r = admin(call.path, call.body);
    EXPECT_EQ(r.status, 200) << Describe(r);
    EXPECT_TRUE(r.is_json() && r.body.value("ok", false)) << Describe(r);
    EXPECT_LT(r.seconds, 5.0) << Describe(r);
    const json state = e->DebugState();
    EXPECT_EQ(state.is_object() ? state["engine"].value("state", "") : "", call.state)
        << state.dump();
    // Requests keep arriving while it holds (they wait for the undo).
    std::this_thread::sleep_for(150ms);
    double undo_s = 0;
    if (!call.undo.empty()) {
      const HttpReply u = admin(call.undo, nullptr);
      EXPECT_EQ(u.status, 200) << call.undo << ": " << Describe(u);
      EXPECT_TRUE(u.is_json() && u.body.value("ok", false)) << call.undo << ": " << Describe(u);
      EXPECT_LT(u.seconds, 5.0) << call.undo << ": " << Describe(u);
      undo_s = u.seconds;
    }
    // Serving again: 16 more requests end after the call.
    const uint64_t mark = load.completed();
    EXPECT_TRUE(WaitFor([&] { return load.completed() >= mark + 16; }, 20s))
        << "no progress after the call: " << load.completed() - mark << " ended";
    load.Stop();

    size_t length = 0, aborted = 0, problems = 0, greedy = 0, exact = 0, first_off = 0,
           near_ties = 0;
    for (const Outcome& o : load.outcomes()) {
      if (!o.problem.empty()) {
        if (++problems <= 5) ADD_FAILURE() << (o.stream ? "stream: " : "") << o.problem;
        continue;
      }
      (o.finish == "length" ? length : aborted)++;
      const bool uniform = std::all_of(o.versions.begin(), o.versions.end(),
                                       [&](uint64_t v) { return v == o.versions.front(); });
      // A greedy output against llama.cpp alone. The first token must be
      // llama.cpp's: the engine computes every prompt chunk in a
      // llama_decode of its own, cut where llama.cpp alone cuts it
      // (LlamaModel::Run). Later tokens are computed in batches with other
      // sequences' tokens, where llama.cpp sums in another order, so a near
      // tie between two logits may go either way (the made model's logits
      // are close: ties within 1e-4 happen in a few hundred prompts); whole
      // outputs are counted, and a wrong first token is reported with its
      // logit against llama.cpp's top one.
      if (o.greedy && !o.ids.empty() && uniform) {
        ++greedy;
        const std::string path = Models::Path("v" + std::to_string(o.versions.front()));
        const Tokens ref = Reference(path, o.prompt, static_cast<uint32_t>(o.ids.size()));
        exact += ref == o.ids ? 1 : 0;
        if (ref.empty() || ref[0] != o.ids[0]) {
          const std::vector<float> l = LogitsAfter(path, o.prompt);
          const float top = l.empty() ? 0 : *std::max_element(l.begin(), l.end());
          const bool near_tie = !l.empty() && o.ids[0] < l.size() && l[o.ids[0]] >= top - 1e-3f;
          near_ties += near_tie ? 1 : 0;
          if (++first_off <= 3 && !near_tie) {
            ADD_FAILURE() << "first token " << o.ids[0] << " (logit "
                          << (o.ids[0] < l.size() ? l[o.ids[0]] : -1) << "), llama.cpp alone "
                          << (ref.empty() ? -1 : static_cast<int64_t>(ref[0])) << " (logit "
                          << top << ") for prompt " << json(o.prompt).dump();
          }
        }
      }
      if (call.version == 1) {
        EXPECT_TRUE(std::all_of(o.versions.begin(), o.versions.end(),
                                [](uint64_t v) { return v == 1; }))
            << Join(o.versions);
      } else if (o.finish == "length") {
        // update_weights in abort mode: a request that ran to its end ran
        // on one version.
        EXPECT_TRUE(uniform) << Join(o.versions);
      }
    }
    std::printf("%-38s %8.3fs %8.3fs %9u %8zu %7zu %7zu %9zu/%zu%s\n",
                ("[lifecycle] " + std::string(call.name)).c_str(), r.seconds, undo_s, in_flight,
                load.outcomes().size(), length, aborted, exact, greedy,
                near_ties == 0 ? ""
                               : (" (" + std::to_string(near_ties) +
                                  " first token a near tie)").c_str());
    std::fflush(stdout);
    EXPECT_EQ(problems, 0u);
    // A first token off only in a near tie (within 1e-3 of llama.cpp's top
    // logit): seen once in ~35 greedy outputs under a pause's load, 1.2e-4
    // apart (docs/llama.md, "Correctness against llama.cpp alone").
    EXPECT_EQ(first_off, near_ties) << "a first token off by more than a near tie";
    if (call.aborts) {
      EXPECT_GT(aborted, 0u) << "nothing was aborted: was anything in flight?";
    } else {
      EXPECT_EQ(aborted, 0u);
    }

    EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 15s)) << e->DebugState().dump();
    const json after = e->DebugState();
    EXPECT_EQ(after["engine"].value("state", ""), "active") << after.dump();
    EXPECT_EQ(after["engine"].value("weights_version", uint64_t{0}), call.version);
    HttpReply pr = e->Post("/v1/completions", Request(probe, 16, 0.0));
    const Choice c = ChoiceOf(pr);
    ASSERT_TRUE(c.ok) << Describe(pr);
    EXPECT_EQ(c.tokens, want.at(call.version)) << "the probe after " << call.name;
    EXPECT_EQ(c.versions, std::vector<uint64_t>(16, call.version)) << Describe(pr);
    std::printf("[lifecycle]   ... idle, probe = reference of version %llu (%.2f s in all)\n",
                static_cast<unsigned long long>(call.version), SecondsSince(t0));
  }
  EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s)) << e->DebugState().dump();
}

// --- 3. unusable weights, refused flags ----------------------------------------------

TEST(LlamaServeTest, UnusableWeightsVersionIsRefusedAndServingGoesOn) {
  ASSERT_TRUE(Models::ready());
  // A file checked at startup (serve refuses a missing one, or another
  // vocabulary: RefusedFlagSets...) and gone by the time it is asked for.
  const std::string gone = Models::dir() + "/gone-v2.gguf";
  std::filesystem::copy_file(Models::Path("v2"), gone,
                             std::filesystem::copy_options::overwrite_existing);
  std::unique_ptr<Engine> e = StartLlama("llama", Models::Path("v1"),
                                         {"--weights-version", "2=" + gone});
  ASSERT_NE(e, nullptr);
  std::filesystem::remove(gone);
  const Tokens p = {5, 6, 7, 300, 400, 42};
  const Tokens want = Reference(Models::Path("v1"), p, 8);
  struct Case {
    uint64_t version;
    std::string detail;
  };
  for (const Case& c : {Case{2, "model file " + gone + " does not exist"},
                        Case{4, "no weights file for version 4"}}) {
    HttpReply r = e->Post("/update_weights", json{{"version", c.version}});
    EXPECT_EQ(r.status, 409) << Describe(r);
    const std::string detail = r.is_json() ? r.body.value("detail", std::string()) : "";
    EXPECT_NE(detail.find(c.detail), std::string::npos) << Describe(r);
    std::printf("[409] update_weights %llu: %s\n", static_cast<unsigned long long>(c.version),
                detail.c_str());
    const Choice ch = ChoiceOf(e->Post("/v1/completions", Request(p, 8, 0.0)));
    ASSERT_TRUE(ch.ok);
    EXPECT_EQ(ch.tokens, want);
    EXPECT_EQ(ch.versions, std::vector<uint64_t>(8, 1));
  }
  EXPECT_TRUE(WaitFor([&] { return e->IdleAndEmpty(); }, 10s)) << e->DebugState().dump();
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

TEST(LlamaServeTest, RefusedFlagSetsExitNonZeroWithAMessage) {
  ASSERT_TRUE(Models::ready());
  const std::string v1 = Models::Path("v1");
  const std::string missing = TestDir() + "/no-such-model.gguf";
  const std::string not_gguf = TestDir() + "/not-a-model.gguf";
  {
    FILE* f = std::fopen(not_gguf.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("this is not a GGUF file\n", f);
    std::fclose(f);
  }
  struct Case {
    const char* name;
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no --model", {"--role", "plain"}, "kvrelay serve: --engine llama needs --model FILE.gguf"},
      {"--tp 2 on a prefill engine", {"--role", "prefill", "--model", v1, "--tp", "2"},
       "kvrelay serve: --engine llama runs with --tp 1"},
      {"a missing file", {"--role", "plain", "--model", missing},
       "kvrelay serve: model file " + missing + " does not exist"},
      {"not a GGUF file", {"--role", "plain", "--model", not_gguf},
       "kvrelay serve: llama.cpp could not load " + not_gguf},
      {"--weights-version without a file",
       {"--role", "plain", "--model", v1, "--weights-version", "2"},
       "kvrelay serve: --weights-version takes VERSION=FILE.gguf"},
      {"--tp 2", {"--role", "plain", "--model", v1, "--tp", "2"},
       "kvrelay serve: --engine llama runs with --tp 1"},
      {"a missing --weights-version file",
       {"--role", "plain", "--model", v1, "--weights-version", "2=" + missing},
       "kvrelay serve: --weights-version 2: model file " + missing + " does not exist"},
      {"a --weights-version file of another vocabulary",
       {"--role", "plain", "--model", v1, "--weights-version", "3=" + Models::Path("wide")},
       "kvrelay serve: --weights-version 3: " + Models::Path("wide") +
           " has a vocabulary of 1024 tokens; --model has 512"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const uint16_t port = FreePort();
    ASSERT_NE(port, 0);
    // stderr alone (stdout dropped); `timeout` in case it starts serving.
    std::string cmd = "timeout 20 " + Quote(KvrelayBinary()) +
                      " serve --engine llama --host 127.0.0.1 --port " + std::to_string(port);
    for (const std::string& a : c.args) cmd += " " + Quote(a);
    cmd += " 2>&1 1>/dev/null";
    const auto t0 = Clock::now();
    FILE* f = ::popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string err;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, f) != nullptr) err += buf;
    const int st = ::pclose(f);
    ASSERT_TRUE(WIFEXITED(st)) << cmd;
    EXPECT_EQ(WEXITSTATUS(st), 2) << cmd << "\nstderr:\n" << err;
    EXPECT_NE(err.find(c.message), std::string::npos) << cmd << "\nstderr:\n" << err;
    std::string last = err;
    while (!last.empty() && last.back() == '\n') last.pop_back();
    last = last.substr(last.find_last_of('\n') + 1);
    std::printf("[exit %d, %.2f s] %-34s %s\n", WEXITSTATUS(st), SecondsSince(t0), c.name,
                last.c_str());
  }
}

// --- P/D: llama.cpp engines behind the router ----------------------------------------

struct PdCluster {
  std::unique_ptr<Engine> p, d;
  std::unique_ptr<Router> router;
};

PdCluster StartPd(const std::string& p_model, const std::string& d_model,
                  const std::string& transport, const std::vector<std::string>& d_more = {}) {
  PdCluster c;
  for (bool prefill : {true, false}) {
    EngineConfig cfg;
    cfg.name = prefill ? "P" : "D";
    cfg.role = prefill ? "prefill" : "decode";
    cfg.transport = transport;
    cfg.extra = {"--engine", "llama", "--model", prefill ? p_model : d_model, "--threads",
                 std::to_string(kThreads)};
    if (!prefill) cfg.extra.insert(cfg.extra.end(), d_more.begin(), d_more.end());
    std::string err;
    (prefill ? c.p : c.d) = Engine::Start(cfg, &err);
    EXPECT_NE(prefill ? c.p : c.d, nullptr) << err;
    if (!(prefill ? c.p : c.d)) return c;
  }
  std::string err;
  c.router = Router::Start({UrlOf(c.p->http_port())}, {UrlOf(c.d->http_port())}, {}, &err);
  EXPECT_NE(c.router, nullptr) << err;
  return c;
}

struct PdJob {
  Tokens prompt;
  uint32_t n = 0;
  std::optional<double> temperature;
  std::optional<int64_t> seed;
  Choice got;
  std::string problem;
};

// Every job through the router, `clients` at a time.
void RunThroughRouter(Router& router, std::vector<PdJob>& jobs, size_t clients) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < clients; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        PdJob& j = jobs[i];
        const HttpReply r = PostOn(router.port(), "/v1/completions",
                                   Request(j.prompt, j.n, j.temperature, j.seed).dump());
        j.got = ChoiceOf(r);
        if (!j.got.ok) j.problem = Describe(r);
      }
    });
  }
  for (auto& t : threads) t.join();
}

std::vector<PdJob> PdJobs(std::mt19937_64& rng, size_t n) {
  std::vector<PdJob> jobs;
  const size_t lens[] = {1, 15, 16, 17, 40, 100, 300, 600};
  for (size_t i = 0; i < n; ++i) {
    PdJob j;
    j.prompt = Prompt(rng, lens[i % std::size(lens)]);
    j.n = 4 + static_cast<uint32_t>(rng() % 13);
    if (i % 3 == 1) {
      j.temperature = 0.8;
      j.seed = static_cast<int64_t>(rng() % 1000);
    } else {
      j.temperature = 0.0;
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

// Outputs through P and D, against llama.cpp alone on the same file: the
// first token always exact (it is P's, computed alone); whole outputs
// counted, as for one engine under load (a near tie in a shared decode
// batch may go the other way). Every load ok, every first token P's.
TEST(LlamaPdServeTest, OutputsThroughTheRouterEqualLlamaCppAlone) {
  ASSERT_TRUE(Models::ready());
  const std::string model = Models::Path("v1");
  for (const char* transport : {"shm", "tcp", "ucx"}) {
    SCOPED_TRACE(transport);
    PdCluster c = StartPd(model, model, transport);
    ASSERT_TRUE(c.router);
    std::mt19937_64 rng(TestSeed());
    std::vector<PdJob> jobs = PdJobs(rng, 24);
    RunThroughRouter(*c.router, jobs, 6);
    size_t exact = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const PdJob& j = jobs[i];
      ASSERT_TRUE(j.got.ok) << "job " << i << ": " << j.problem;
      const Tokens want = Reference(
          model, j.prompt, j.n,
          engine::Sampling{static_cast<float>(j.temperature.value_or(1.0)),
                           static_cast<uint64_t>(j.seed.value_or(0))});
      ASSERT_EQ(j.got.tokens.size(), j.n);
      EXPECT_EQ(j.got.tokens[0], want[0]) << "job " << i << ": prompt of " << j.prompt.size();
      exact += j.got.tokens == want ? 1 : 0;
    }
    std::printf("[pd %s] %zu of %zu outputs whole-exact, every first token exact\n", transport,
                exact, jobs.size());
    EXPECT_GE(exact * 4, jobs.size() * 3) << "most outputs are whole-exact";
    const std::string dm = c.d->Metrics();
    EXPECT_EQ(MetricSum(dm, "kvrelay_loads_total", R"(outcome="ok")"), jobs.size());
    EXPECT_EQ(MetricSum(dm, "kvrelay_kv_imports_failed_total"), 0);
    EXPECT_EQ(MetricSum(dm, "kvrelay_first_tokens_from_producer_total"), jobs.size());
    EXPECT_EQ(MetricSum(c.p->Metrics(), "kvrelay_kv_exports_failed_total"), 0);
  }
}

// A chat through P and D: both legs lay it out with the file's template
// (ChatML here: a made model has none), P hands its KV to D, and the answer
// is the reference decoder's for that prompt — greedy, so whole-exact — in
// chat's shape; a plain engine answers the same.
TEST(LlamaPdServeTest, AChatThroughTheRouterIsTheTemplatesPrompt) {
  ASSERT_TRUE(Models::ready());
  const std::string model = Models::Path("v1");
  PdCluster c = StartPd(model, model, "shm");
  ASSERT_TRUE(c.router);
  Result<std::unique_ptr<llama::LlamaTokenizer>> tok = llama::LlamaTokenizer::Open(model);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::vector<std::pair<std::string, std::string>> chat = {
      {"system", "Answer briefly."}, {"user", "Hello there, how are you?"}};
  const Tokens prompt = (*tok)->EncodeChat(chat);
  const Tokens want = Reference(model, prompt, 8, engine::Sampling{0.0f, 0});
  json messages = json::array();
  for (const auto& [role, content] : chat) {
    messages.push_back({{"role", role}, {"content", content}});
  }
  const json body = {{"messages", messages}, {"max_completion_tokens", 8}, {"temperature", 0}};
  const HttpReply via = PostOn(c.router->port(), "/v1/chat/completions", body.dump());
  const Choice got = ChoiceOf(via);
  ASSERT_TRUE(got.ok) << Describe(via);
  EXPECT_EQ(got.tokens, want);
  EXPECT_EQ(via.body["object"], "chat.completion");
  EXPECT_EQ(via.body["usage"]["prompt_tokens"], prompt.size());
  // (The made model's pieces are bytes that need not be UTF-8: the content is
  // their text with U+FFFD in place of bad bytes, so only its kind is checked.)
  EXPECT_TRUE(via.body["choices"][0]["message"]["content"].is_string());
  const HttpReply alone = c.d->Post("/v1/chat/completions", body);
  EXPECT_EQ(ChoiceOf(alone).tokens, want) << Describe(alone);
  const std::string dm = c.d->Metrics();
  EXPECT_EQ(MetricSum(dm, "kvrelay_loads_total", R"(outcome="ok")"), 1);
  EXPECT_EQ(MetricSum(dm, "kvrelay_first_tokens_from_producer_total"), 1);
}

// D serves another file than P: the fingerprints differ, P refuses D's
// pulls, D computes every prompt itself, and its outputs are its own
// model's.
TEST(LlamaPdServeTest, DServingAnotherFileComputesThePromptItself) {
  ASSERT_TRUE(Models::ready());
  PdCluster c = StartPd(Models::Path("v1"), Models::Path("v2"), "shm");
  ASSERT_TRUE(c.router);
  std::mt19937_64 rng(TestSeed());
  std::vector<PdJob> jobs = PdJobs(rng, 6);
  for (PdJob& j : jobs) j.temperature = 0.0;
  RunThroughRouter(*c.router, jobs, 3);
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(jobs[i].got.ok) << jobs[i].problem;
    EXPECT_EQ(jobs[i].got.tokens[0], Reference(Models::Path("v2"), jobs[i].prompt, 1)[0])
        << "job " << i;
  }
  const std::string dm = c.d->Metrics();
  EXPECT_EQ(MetricSum(dm, "kvrelay_loads_total", R"(outcome="ok")"), 0);
  EXPECT_EQ(MetricSum(dm, "kvrelay_loads_total", R"(outcome="failed")"), jobs.size());
}

// `bench load --check-model` judges a llama cluster's load against llama.cpp
// alone on that file: it passes on the file P and D serve, and fails on
// another one (every first token then differs from the judge's).
TEST(LlamaPdServeTest, BenchLoadJudgesOutputsAgainstTheGivenModel) {
  ASSERT_TRUE(Models::ready());
  PdCluster c = StartPd(Models::Path("v1"), Models::Path("v1"), "shm");
  ASSERT_TRUE(c.router);
  const std::string json_path =
      (std::filesystem::temp_directory_path() / ("bench-load-" + std::to_string(getpid()) +
                                                 ".json")).string();
  auto load = [&](const std::string& model) {
    const std::string cmd = std::string(KvrelayBinary()) + " bench load --url http://127.0.0.1:" +
                            std::to_string(c.router->port()) + " -n 40 -c 8 --probes 2 " +
                            "--prompt-tokens-max 200 --check-model '" + model + "' --json '" +
                            json_path + "' 2>&1";
    std::fflush(stdout);
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  ASSERT_EQ(load(Models::Path("v1")), 0);
  std::ifstream in(json_path);
  const json report = json::parse(in, nullptr, false);
  ASSERT_FALSE(report.is_discarded());
  EXPECT_EQ(report.value("failed", -1), 0);
  EXPECT_GE(report.value("whole_exact", -1), 30) << "most of the 40 outputs whole-exact";
  EXPECT_EQ(load(Models::Path("v2")), 1) << "outputs of v1 judged against v2 must fail";
  std::filesystem::remove(json_path);
}

// --- streamed text ------------------------------------------------------------------

// A stream's chunk decodes its own tokens; a character whose bytes are byte
// tokens (<0xC3><0xA9>) can fall across two chunks. Each chunk's text is cut
// between characters, so a client appending chunk texts (as the SDKs do)
// gets the non-streamed text, not "\uFFFD\uFFFD". The run counts the texts
// with characters beyond ASCII, where a split can happen, and needs one:
// sampled at temperature 0.8 from the test model's vocabulary, all 40 have
// them, and with the cut disabled 10 of 40 streams differ.
TEST(LlamaServeTest, StreamedTextEqualsWholeText) {
  ASSERT_TRUE(Models::ready());
  std::unique_ptr<Engine> e = StartLlama("llama", Models::Path("v1"));
  ASSERT_NE(e, nullptr);
  std::mt19937_64 rng(7);
  int differ = 0, non_ascii = 0;
  for (int i = 0; i < 40; ++i) {
    const Tokens p = Prompt(rng, 1 + rng() % 60);
    const json body = Request(p, 32, 0.8, i);
    const Choice w = ChoiceOf(e->Post("/v1/completions", body));
    const HttpReply sr = e->Post("/v1/completions", Request(p, 32, 0.8, i, /*stream=*/true));
    const Streamed s = ParseStream(sr);
    ASSERT_TRUE(w.ok && s.ok) << s.problem;
    ASSERT_EQ(s.tokens, w.tokens);
    HttpReply again = e->Post("/v1/completions", body);
    const std::string whole_text = again.body["choices"][0].value("text", "");
    non_ascii += std::any_of(whole_text.begin(), whole_text.end(),
                             [](char c) { return static_cast<uint8_t>(c) >= 0x80; });
    if (s.text != whole_text) {
      if (++differ <= 3) {
        ADD_FAILURE() << "prompt " << json(p).dump() << " seed " << i << ": stream "
                      << json(s.text).dump() << " vs " << json(whole_text).dump();
      }
    }
  }
  std::printf("streamed text differs from the whole text in %d of 40 requests (%d texts with "
              "characters beyond ASCII)\n", differ, non_ascii);
  EXPECT_GT(non_ascii, 0) << "no request produced a multi-byte character: the case is untested";
}

}  // namespace
}  // namespace kvrelay::proctest
