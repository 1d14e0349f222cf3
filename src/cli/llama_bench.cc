// `kvrelay bench llama`: what kvrelay's engine costs over llama.cpp alone.
//
// The same made (or given) model, the same threads, the same prompts, in one
// process: the engine's scheduler driving a LlamaModel (one llama_decode per
// step) against ReferenceDecoder, llama.cpp's plain loop. Two phases:
//   prefill  P prompts of L tokens, one at a time, one output token each:
//            prompt tokens / s;
//   decode   one short prompt, N output tokens: output tokens / s;
// and, for what batching buys, `batched`: B requests decoding together
// (tokens / s of the engine against the plain loop serving them in turn).
// Rounds alternate engine and loop; the figure is the median of the rounds'
// ratios (this machine is shared). Every greedy output is compared with the
// loop's; a difference fails the run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "base/prng.h"
#include "cli/commands.h"
#include "cli/llama_cluster.h"
#include "engine/engine.h"
#include "llama/llama_model.h"
#include "llama/model_maker.h"
#include "llama/no_kv_memory.h"
#include "llama/reference_decoder.h"
#include "os/clock.h"

namespace kvrelay::cli {
namespace {

using engine::Token;
using Clock = std::chrono::steady_clock;

struct LlamaBenchOptions {
  std::string model;             // empty: make one with the shape below
  llama::MakeModelOptions make;
  uint32_t threads = 2;
  uint32_t prompt_tokens = 480;
  uint32_t prompts = 4;
  uint32_t decode_tokens = 128;
  uint32_t batched = 8;
  uint32_t rounds = 3;
  std::string json_path;
};

constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kBatchTokens = 512;
constexpr uint32_t kMaxSequences = 32;

std::vector<Token> Prompt(uint64_t seed, uint32_t len, uint32_t vocab) {
  Prng prng(seed);
  std::vector<Token> p;
  for (uint32_t i = 0; i < len; ++i) p.push_back(static_cast<Token>(3 + prng.Uniform(vocab - 3)));
  return p;
}

// The engine over a LlamaModel, driven step by step in this thread.
class EngineRunner {
 public:
  EngineRunner(const std::string& model, uint32_t threads, uint32_t context_tokens) {
    llama::LlamaModelOptions lo;
    lo.model_path = model;
    lo.threads = threads;
    lo.context_tokens = context_tokens;
    lo.max_sequences = kMaxSequences;
    lo.batch_tokens = kBatchTokens;
    auto m = llama::LlamaModel::Open(lo);
    KV_CHECK_MSG(m.ok(), m.status().ToString().c_str());
    model_ = std::move(*m);
    engine::EngineOptions o;
    o.role = engine::Role::kPlain;
    o.shape.name = "bench";
    o.shape.block_tokens = kBlockTokens;
    o.shape.vocab = model_->vocab();
    o.shape.max_context = context_tokens;
    o.num_blocks = context_tokens / kBlockTokens;
    o.max_batch_tokens = kBatchTokens + kMaxSequences;
    o.max_running = kMaxSequences;
    o.prefix_caching = false;
    engine_ = std::make_unique<engine::Engine>(o, &memory_, model_.get());
  }
  uint32_t vocab() const { return model_->vocab(); }

  // Serves `prompts` together; the outputs in order.
  std::vector<std::vector<Token>> Serve(const std::vector<std::vector<Token>>& prompts,
                                        uint32_t n) {
    std::map<uint64_t, std::vector<Token>> out;
    for (const auto& p : prompts) {
      engine::RequestSpec spec;
      spec.client = next_++;
      spec.prompt = p;
      spec.max_tokens = n;
      spec.sampling.temperature = 0;
      out[spec.client];
      KV_CHECK(engine_->AddRequest(std::move(spec), now_).ok());
    }
    while (!engine_->Idle()) {
      engine_->Step({}, now_);
      now_ = now_ + Duration::Milliseconds(1);
      while (auto a = engine_->PollAction()) {
        if (auto* t = std::get_if<engine::TokenOut>(&*a)) out[t->client].push_back(t->token);
      }
    }
    std::vector<std::vector<Token>> v;
    for (auto& [c, toks] : out) v.push_back(std::move(toks));
    return v;
  }

 private:
  llama::NoKvMemory memory_;
  std::unique_ptr<llama::LlamaModel> model_;
  std::unique_ptr<engine::Engine> engine_;
  Instant now_;
  uint64_t next_ = 1;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One phase's samples, per round: tokens/s of the engine, of llama.cpp's
// loop with its default context for one sequence, and of the loop with the
// engine's context (unified KV cache for kMaxSequences sequences): what
// isolates kvrelay's scheduler.
struct PhaseResult {
  std::vector<double> engine_tps, llama_tps, same_tps;
  std::vector<double> ratios, scheduler_ratios;
  bool outputs_equal = true;
  // Against the default loop: outputs equal token for token, outputs whose
  // first token equals, outputs compared.
  uint32_t exact = 0, first_exact = 0, compared = 0;

  void Add(double tokens, double engine_s, double llama_s, double same_s) {
    engine_tps.push_back(tokens / engine_s);
    llama_tps.push_back(tokens / llama_s);
    same_tps.push_back(tokens / same_s);
    ratios.push_back(llama_s / engine_s);
    scheduler_ratios.push_back(same_s / engine_s);
  }
};

void PrintPhase(std::FILE* f, const char* name, const PhaseResult& r, bool last) {
  std::fprintf(f,
               "  \"%s\": {\"engine_tokens_per_s\": %.1f, \"llama_tokens_per_s\": %.1f, "
               "\"llama_engine_context_tokens_per_s\": %.1f, \"ratio\": %.3f, "
               "\"scheduler_ratio\": %.3f, \"outputs_equal\": %s, \"outputs\": %u, "
               "\"exact_outputs\": %u, \"exact_first_tokens\": %u}%s\n",
               name, Median(r.engine_tps), Median(r.llama_tps), Median(r.same_tps),
               Median(r.ratios), Median(r.scheduler_ratios), r.outputs_equal ? "true" : "false",
               r.compared, r.exact, r.first_exact, last ? "" : ",");
}

using Ref = std::unique_ptr<llama::ReferenceDecoder>;

using Outputs = std::vector<std::vector<Token>>;

// One phase of one round: the engine (serving `prompts` together, or one at
// a time), the loop with its default context and the loop with the
// engine's, each timed; the order rotates with the round. The loops'
// outputs are compared with the engine's (counted against the default one).
void Measure(EngineRunner& runner, Ref* refs, const Outputs& prompts, uint32_t n, bool together,
             double tokens, uint32_t round, PhaseResult* r) {
  Outputs outs[3];
  double secs[3] = {0, 0, 0};
  for (uint32_t k = 0; k < 3; ++k) {
    const uint32_t who = (round + k) % 3;
    const auto t0 = Clock::now();
    if (who == 0 && together) {
      outs[0] = runner.Serve(prompts, n);
    } else {
      for (const auto& p : prompts) {
        outs[who].push_back(who == 0 ? runner.Serve({p}, n)[0]
                                     : refs[who - 1]->Generate(p, n, {}));
      }
    }
    secs[who] = SecondsSince(t0);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const bool equal = outs[1][i] == outs[0][i];
    r->outputs_equal = r->outputs_equal && equal && outs[2][i] == outs[0][i];
    ++r->compared;
    r->exact += equal ? 1 : 0;
    r->first_exact += outs[1][i][0] == outs[0][i][0] ? 1 : 0;
  }
  r->Add(tokens, secs[0], secs[1], secs[2]);
}

int RunLlamaBench(const LlamaBenchOptions& o) {
  if (std::string why = llama::Unavailable(); !why.empty()) {
    std::fprintf(stderr, "kvrelay bench llama: %s\n", why.c_str());
    return 2;
  }
  std::string path = o.model;
  std::filesystem::path tmp;
  if (path.empty()) {
    tmp = std::filesystem::temp_directory_path() /
          ("kvrelay-bench-llama-" + std::to_string(::getpid()) + ".gguf");
    llama::MakeModelOptions m = o.make;
    m.out_path = tmp.string();
    if (Status s = llama::MakeModel(m); !s.ok()) {
      std::fprintf(stderr, "kvrelay bench llama: %s\n", s.message().c_str());
      return 1;
    }
    path = m.out_path;
  }
  const uint32_t context = 4096;
  EngineRunner runner(path, o.threads, context);
  Ref refs[2];
  for (int same = 0; same < 2; ++same) {
    auto r = llama::ReferenceDecoder::Open(llama::ReferenceOptions{
        path, o.threads, context, kBatchTokens, same == 1, kMaxSequences});
    if (!r.ok()) {
      std::fprintf(stderr, "kvrelay bench llama: %s\n", r.status().message().c_str());
      return 1;
    }
    refs[same] = std::move(*r);
  }
  const uint32_t vocab = runner.vocab();
  PhaseResult prefill, decode, batched;
  for (uint32_t round = 0; round < o.rounds; ++round) {
    // Prefill: prompts one at a time, one output token each.
    Outputs prompts;
    for (uint32_t i = 0; i < o.prompts; ++i) {
      prompts.push_back(Prompt(round * 1000 + i, o.prompt_tokens, vocab));
    }
    Measure(runner, refs, prompts, 1, false, static_cast<double>(o.prompt_tokens) * o.prompts,
            round, &prefill);
    // Decode: one request, many tokens.
    const Outputs one = {Prompt(round + 77, 16, vocab)};
    Measure(runner, refs, one, o.decode_tokens, false, o.decode_tokens, round, &decode);
    // Batched: B requests at once against the loop serving them in turn.
    Outputs many;
    for (uint32_t i = 0; i < o.batched; ++i) many.push_back(Prompt(round * 31 + i + 5, 16, vocab));
    Measure(runner, refs, many, o.decode_tokens, true,
            static_cast<double>(o.decode_tokens) * o.batched, round, &batched);
    std::fprintf(stderr,
                 "bench llama: round %u/%u: engine ÷ llama.cpp alone (÷ same context): "
                 "prefill %.2f (%.2f), decode %.2f (%.2f), batched ×%u %.2f (%.2f)\n",
                 round + 1, o.rounds, prefill.ratios.back(), prefill.scheduler_ratios.back(),
                 decode.ratios.back(), decode.scheduler_ratios.back(), o.batched,
                 batched.ratios.back(), batched.scheduler_ratios.back());
  }
  std::FILE* f = o.json_path.empty() ? stdout : std::fopen(o.json_path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "kvrelay bench llama: cannot write %s\n", o.json_path.c_str());
    return 1;
  }
  std::fprintf(f, "{\n  \"model\": \"%s\",\n  \"threads\": %u,\n  \"rounds\": %u,\n",
               o.model.empty() ? "made" : o.model.c_str(), o.threads, o.rounds);
  if (o.model.empty()) {
    std::fprintf(f, "  \"made\": {\"layers\": %u, \"embd\": %u, \"heads\": %u, \"kv_heads\": %u, "
                    "\"vocab\": %u},\n",
                 o.make.layers, o.make.embd, o.make.heads, o.make.kv_heads, o.make.vocab);
  }
  std::fprintf(f, "  \"prompt_tokens\": %u, \"prompts\": %u, \"decode_tokens\": %u, "
                  "\"batched_requests\": %u,\n",
               o.prompt_tokens, o.prompts, o.decode_tokens, o.batched);
  PrintPhase(f, "prefill", prefill, false);
  PrintPhase(f, "decode", decode, false);
  PrintPhase(f, "batched", batched, true);
  std::fprintf(f, "}\n");
  if (f != stdout) std::fclose(f);
  if (!tmp.empty()) std::filesystem::remove(tmp);
  // Alone, the engine must decode exactly as llama.cpp does; batched
  // outputs are reported (llama.cpp's sums may run in another order).
  if (!prefill.outputs_equal || !decode.outputs_equal) {
    std::fprintf(stderr, "kvrelay bench llama: FAIL: an output served alone differs from "
                         "llama.cpp's\n");
    return 1;
  }
  return 0;
}

}  // namespace

void RegisterLlamaBench(CLI::App* bench) {
  auto o = std::make_shared<LlamaBenchOptions>();
  auto* cmd = bench->add_subcommand(
      "llama",
      "The llama.cpp engine's prefill and decode tokens/s against llama.cpp's own loop, same "
      "model and threads, in one run (ratios: engine ÷ llama.cpp; 1.0 = no cost)");
  cmd->add_option("--model", o->model, "a GGUF file; without it a model is made (--layers ...)");
  AddMadeModelFlags(cmd, &o->make);
  cmd->add_option("--threads", o->threads, "llama.cpp threads (both sides)")
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "prefill: tokens per prompt (<= 4095)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 4000u));
  cmd->add_option("--prompts", o->prompts, "prefill: prompts per round")->capture_default_str();
  cmd->add_option("--decode-tokens", o->decode_tokens, "decode: output tokens per request")
      ->capture_default_str()
      ->check(CLI::Range(1u, 2048u));
  cmd->add_option("--batched", o->batched, "batched: requests decoding together")
      ->capture_default_str()
      ->check(CLI::Range(1u, 32u));
  cmd->add_option("--rounds", o->rounds, "rounds (the figure is their median)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 99u));
  cmd->add_option("--json", o->json_path, "write the JSON here instead of stdout");
  cmd->callback([o] { SetExitCode(RunLlamaBench(*o)); });
}

}  // namespace kvrelay::cli
