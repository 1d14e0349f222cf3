// ttft_bench.cc — see ttft_bench.h. Run order: start the engines and the
// router, warm every path up, then per prompt length and sample: plain and
// P/D (alternating which goes first), then one transfer with P done first;
// then the figures (CompareTtft), the verdicts and --json.
#include "cli/ttft_bench.h"


#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/prng.h"
#include "bench/percentile.h"
#include "bench/ttft_compare.h"
#include "cli/bench_cluster.h"
#include "cli/llama_checker.h"
#include "cli/decode_under_prefill.h"
#include "cli/engine_deltas.h"
#include "cli/llama_serving.h"
#include "cli/stream_completion.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "llama/llama_model.h"
#include "os/clock.h"
#include "router/transfer_id_source.h"

namespace kvrelay::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kProducerTokens[] = "kvrelay_first_tokens_from_producer_total";
constexpr uint32_t kDecodePromptTokens = 16;   // the decode-under-prefill phase's

std::vector<engine::Token> PromptOf(const json& body) {
  return body.at("prompt").get<std::vector<engine::Token>>();
}

// The samples of one prompt length, as they come in.
struct LengthRun {
  uint32_t tokens = 0, blocks = 0;
  TtftSamples samples;
  double producer_tokens = -1;  // P/D requests whose first token D took from P
  KvCopies copies;              // during this length's samples (llama.cpp engines)
  uint32_t reference_checked = 0;  // plain outputs checked against llama.cpp alone
  double chunks_streamed = -1;     // the streaming P's chunks handed over (--stream-chunks)
  // Per request: the plain engine's steps, the whole P's, the streaming P's.
  StepTimes plain_steps, p_steps, streamed_p_steps;
};

class TtftRun {
 public:
  // `checker`: llama.cpp alone on the engines' model (--engine llama), else
  // null (the emulated model's outputs are checked from the prompt).
  TtftRun(const TtftBenchOptions& o, BenchCluster& c, std::shared_ptr<LlamaChecker> checker)
      : o_(o), c_(c), prng_(o.seed), checker_(std::move(checker)) {}

  // Untimed: connections, handshakes, and the first touches of every pool
  // (on this machine kind a first touch of a page costs tens of µs; see
  // docs/performance.md), as a long-running cluster has them.
  Status WarmUp(uint32_t smallest, uint32_t largest) {
    std::vector<uint32_t> lengths = {smallest};
    for (uint32_t i = 0; i < o_.warmup; ++i) lengths.push_back(largest);
    for (uint32_t tokens : lengths) {
      json body = Stream(c_.Prompt(prng_, tokens));
      std::vector<engine::Token> plain, pd;
      if (Status s = Plain(body, nullptr, &plain); !s.ok()) return s;
      if (Status s = ThroughRouter(body, tokens, nullptr, &pd, false); !s.ok()) return s;
      if (Status s = Same(body, plain, pd, nullptr); !s.ok()) return s;
      if (twin_) {
        std::vector<engine::Token> streamed;
        if (Status s = ThroughRouter(body, tokens, nullptr, &streamed, true); !s.ok()) return s;
      }
      if (Status s = Transfer(tokens, nullptr); !s.ok()) return s;
    }
    return Status::Ok();
  }

  Status Measure(LengthRun* run) {
    const Clock::time_point t0 = Clock::now();
    const double producer_tokens0 = MetricSample(c_.d_url(), kProducerTokens);
    const KvCopies copies0 = KvCopies::Read(c_);
    const double streamed0 = StreamedChunks();
    Clock::time_point last_line = t0;
    const uint32_t paths = twin_ ? 3 : 2;   // plain, P/D whole[, P/D streamed]
    for (uint32_t i = 0; i < o_.samples; ++i) {
      json body = Stream(c_.Prompt(prng_, run->tokens));
      std::vector<engine::Token> plain, pd, streamed;
      // Rotate which path goes first, so none always follows another's
      // leftovers (caches, the kernel's page reclaim).
      for (uint32_t k = 0; k < paths; ++k) {
        const uint32_t path = (i + k) % paths;
        Status s = path == 0   ? Plain(body, run, &plain)
                   : path == 1 ? ThroughRouter(body, run->tokens, run, &pd, false)
                               : ThroughRouter(body, run->tokens, run, &streamed, true);
        if (!s.ok()) return s;
      }
      if (Status s = Same(body, plain, pd, i == 0 ? run : nullptr); !s.ok()) return s;
      if (Status s = Transfer(run->tokens, run); !s.ok()) return s;
      if (SecondsSince(last_line) >= 10 || i + 1 == o_.samples) {
        last_line = Clock::now();
        const TtftSamples& s = run->samples;
        std::printf("  [%u tokens] %u/%u samples, %.0f s: last plain %.1f ms, P/D %.1f ms, ",
                    run->tokens, i + 1, o_.samples, SecondsSince(t0), s.plain_s.back() * 1e3,
                    s.pd_s.back() * 1e3);
        if (twin_) std::printf("streamed %.1f ms, ", s.streamed_s.back() * 1e3);
        std::printf("transfer %.1f ms\n", s.transfer_s.back() * 1e3);
        std::fflush(stdout);
      }
    }
    // Every request's engine steps were read, and each path's engine
    // computed (the P/D ones on P): a missing series is a broken bench.
    struct PathSteps {
      const char* what;
      const StepTimes* times;
      size_t want;
    };
    for (const PathSteps& p : {PathSteps{"the plain engine", &run->plain_steps, o_.samples},
                               PathSteps{"P", &run->p_steps, o_.samples},
                               PathSteps{"the streaming P", &run->streamed_p_steps,
                                         twin_ ? o_.samples : 0}}) {
      if (p.times->work_s.size() != p.want ||
          (p.want > 0 && !(Percentile(p.times->work_s, 0.5) > 0))) {
        return InternalError(std::string("could not read ") + p.what +
                             "'s step time per request (kvrelay_engine_step_work_seconds_total)");
      }
    }
    run->copies = KvCopies::Read(c_).Minus(copies0);
    const double producer_tokens1 = MetricSample(c_.d_url(), kProducerTokens);
    if (producer_tokens0 >= 0 && producer_tokens1 >= 0) {
      run->producer_tokens = producer_tokens1 - producer_tokens0;
    }
    if (twin_) {
      // A streaming P that handed nothing over measured nothing new.
      run->chunks_streamed = StreamedChunks() - streamed0;
      if (run->tokens > o_.max_batch_tokens && !(run->chunks_streamed > 0)) {
        return InternalError("the streaming P streamed no chunk of prompts of " +
                             std::to_string(run->tokens) + " tokens (" +
                             std::to_string(run->chunks_streamed) + "; see its log)");
      }
    }
    return Status::Ok();
  }

 private:
  // Two tokens, streamed: TTFT is the first; the second makes D read every
  // byte it loaded (D emits P's first token without a step on the KV,
  // docs/design.md), so the output check covers the transfer.
  json Stream(json body) const {
    body["stream"] = true;
    body["max_tokens"] = kTokens;
    if (checker_) body["ignore_eos"] = true;   // a real model may draw its end token
    return body;
  }
  static constexpr uint32_t kTokens = 2;

  // llama.cpp engines: the P/D output equals the plain engine's token for
  // token (both served alone); with `run`, the plain one is also checked
  // against llama.cpp alone. The emulated model's were checked already.
  Status Same(const json& body, const std::vector<engine::Token>& plain,
              const std::vector<engine::Token>& pd, LengthRun* run) {
    if (!checker_) return Status::Ok();
    if (plain != pd) {
      return InternalError("through the router: the output differs from the plain engine's "
                           "for the same prompt of " + std::to_string(PromptOf(body).size()) +
                           " tokens (both served alone)");
    }
    if (run == nullptr) return Status::Ok();
    const std::vector<engine::Token> prompt = PromptOf(body);
    const std::vector<uint64_t> versions(plain.size(), 1);
    bool whole_exact = false;
    const std::string bad = checker_->Check(prompt, plain, versions, &whole_exact);
    if (!bad.empty() || !whole_exact) {
      return InternalError("plain engine: not llama.cpp alone's output: " +
                           (bad.empty() ? std::string("a later token differs") : bad));
    }
    ++run->reference_checked;
    return Status::Ok();
  }

  // TTFT on the plain engine.
  Status Plain(const json& body, LengthRun* run, std::vector<engine::Token>* tokens) {
    if (Status s = c_.WaitIdle(); !s.ok()) return s;
    const StepTime steps0 = StepTime::Read(c_.plain_url());
    Result<Streamed> r = StreamCompletion(plain_, body, o_.request_timeout_s);
    if (!r.ok()) return Status(r.status().code(), "plain engine: " + r.status().message());
    if (Status s = Checked(body, *r, "plain engine"); !s.ok()) return s;
    for (const engine::TokenOut& t : r->tokens) tokens->push_back(t.token);
    if (run != nullptr) {
      run->samples.plain_s.push_back(r->ttft_s);
      if (Status s = c_.WaitIdle(); !s.ok()) return s;
      run->plain_steps.Add(steps0, StepTime::Read(c_.plain_url()));
    }
    return Status::Ok();
  }

  // P's chunks handed over so far (the streaming P's metric); -1: not read.
  double StreamedChunks() const {
    return twin_ ? MetricSample(c_.twin_p_url(), "kvrelay_prefill_chunks_streamed_total") : -1;
  }

  // TTFT through the router (`streamed`: the streaming P's); the request's
  // own pull from D's log.
  Status ThroughRouter(const json& body, uint32_t tokens, LengthRun* run,
                       std::vector<engine::Token>* out, bool streamed) {
    if (Status s = c_.WaitIdle(); !s.ok()) return s;
    if (Result<std::vector<BenchCluster::Pulled>> old = c_.NewPulls(); !old.ok()) {
      return old.status();
    }
    const std::string path = streamed ? "through the streaming P's router" : "through the router";
    const std::string& p_url = streamed ? c_.twin_p_url() : c_.p_url();
    const StepTime steps0 = StepTime::Read(p_url);
    Result<Streamed> r = StreamCompletion(streamed ? *twin_ : router_, body, o_.request_timeout_s);
    if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
    if (Status s = Checked(body, *r, path); !s.ok()) return s;
    for (const engine::TokenOut& t : r->tokens) out->push_back(t.token);
    // One request at a time, so D logged exactly this request's answer
    // (tp 1: one pull) — once its rank actor got it, which may be a moment
    // after the token left.
    std::vector<BenchCluster::Pulled> pulls;
    for (int attempt = 0; attempt < 100 && pulls.empty(); ++attempt) {
      Result<std::vector<BenchCluster::Pulled>> got = c_.NewPulls();
      if (!got.ok()) return got.status();
      pulls = std::move(*got);
      if (pulls.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (Status s = Served(pulls, tokens, "a P/D request " + path); !s.ok()) return s;
    if (run != nullptr) {
      if (Status s = c_.WaitIdle(); !s.ok()) return s;
      (streamed ? run->streamed_p_steps : run->p_steps).Add(steps0, StepTime::Read(p_url));
    }
    if (run != nullptr && streamed) {
      run->samples.streamed_s.push_back(r->ttft_s);
    } else if (run != nullptr) {
      run->samples.pd_s.push_back(r->ttft_s);
      run->samples.pd_pull_s.push_back(pulls[0].seconds);
      run->samples.answer_to_token_s.push_back(
          std::max<double>(0, static_cast<double>(r->first_token_mono_ns -
                                                  pulls[0].answered_mono_ns) / 1e9));
    }
    return Status::Ok();
  }

  // A fresh prompt's P leg, then (P done) its D leg: D's pull→answer.
  Status Transfer(uint32_t tokens, LengthRun* run) {
    if (Status s = c_.WaitIdle(); !s.ok()) return s;
    json client = c_.Prompt(prng_, tokens);
    Result<TransferId> t = router::NewTransferIdFromOs();
    if (!t.ok()) return t.status();
    if (Status s = c_.Prefill(client, *t); !s.ok()) return s;
    Result<BenchCluster::Pulled> p = c_.Decode(client, *t);
    if (!p.ok()) return p.status();
    if (Status s = Served({*p}, tokens, "a transfer with P done first"); !s.ok()) return s;
    if (run != nullptr) run->samples.transfer_s.push_back(p->seconds);
    return Status::Ok();
  }

  Status Checked(const json& body, const Streamed& r, const std::string& path) {
    if (r.tokens.size() != kTokens) {
      return InternalError(path + ": " + std::to_string(r.tokens.size()) + " tokens, asked for " +
                           std::to_string(kTokens));
    }
    if (checker_) return Status::Ok();   // Same() compares a real model's
    const std::vector<engine::Token> prompt = PromptOf(body);
    const std::string bad = engine::CheckOutput(prompt, r.tokens, c_.shape());
    if (!bad.empty()) return InternalError(path + ": wrong output: " + bad);
    return Status::Ok();
  }

  // The request was served by one transfer of the prompt's whole KV.
  Status Served(const std::vector<BenchCluster::Pulled>& pulls, uint32_t tokens,
                const std::string& what) {
    const uint32_t blocks = (tokens + c_.shape().block_tokens - 1) / c_.shape().block_tokens;
    if (pulls.size() != 1) {
      return InternalError(what + ": D logged " + std::to_string(pulls.size()) +
                           " answers, expected 1");
    }
    if (pulls[0].result != "ok" || pulls[0].blocks != blocks) {
      return InternalError(what + ": D's pull of " + std::to_string(pulls[0].blocks) +
                           " blocks (expected " + std::to_string(blocks) + ") was answered " +
                           pulls[0].result + "; D recomputed, so TTFT would not measure a "
                           "hand-off");
    }
    return Status::Ok();
  }

  const TtftBenchOptions& o_;
  BenchCluster& c_;
  Prng prng_;
  // Nagle is off on the client's sockets (as aiohttp's): with it on, the
  // body waits behind the headers for the server's delayed ACK (~40 ms).
  std::shared_ptr<LlamaChecker> checker_;
  const http::Client plain_{c_.plain_url()};
  const http::Client router_{c_.router_url()};
  // The streaming P's router (--stream-chunks), else null.
  const std::unique_ptr<http::Client> twin_ =
      c_.twin_router_url().empty() ? nullptr : std::make_unique<http::Client>(c_.twin_router_url());
};

Status Validate(const TtftBenchOptions& o, const engine::ModelShape& shape) {
  if (o.transport != "shm" && o.transport != "tcp" && o.transport != "ucx") {
    return InvalidArgumentError("--transport must be shm, tcp or ucx (got '" + o.transport + "')");
  }
  if (o.prompt_tokens.empty()) return InvalidArgumentError("--prompt-tokens is empty");
  for (uint32_t t : o.prompt_tokens) {
    if (t == 0 || t + 1 > shape.max_context) {
      return InvalidArgumentError("--prompt-tokens: " + std::to_string(t) +
                                  " is not between 1 and " +
                                  std::to_string(shape.max_context - 1) + " (" + shape.name +
                                  "'s context of " + std::to_string(shape.max_context) +
                                  " tokens, less the token to generate)");
    }
  }
  if (o.samples == 0) return InvalidArgumentError("--samples must be at least 1");
  if (!(o.decode_under_prefill_s >= 0) || !std::isfinite(o.decode_under_prefill_s)) {
    return InvalidArgumentError("--decode-under-prefill-s must be >= 0");
  }
  if (o.decode_under_prefill_s > 0 && (o.decoders == 0 || o.decode_tokens < 2)) {
    return InvalidArgumentError("--decoders must be >= 1 and --decode-tokens >= 2");
  }
  if (o.decode_under_prefill_s > 0 && kDecodePromptTokens + o.decode_tokens > shape.max_context) {
    return InvalidArgumentError("--decode-tokens " + std::to_string(o.decode_tokens) +
                                " does not fit the model's context");
  }
  if (!(o.stream_goal > 0) || !std::isfinite(o.stream_goal)) {
    return InvalidArgumentError("--stream-goal must be a ratio > 0");
  }
  if (!(o.target_ratio > 0) || !std::isfinite(o.target_ratio)) {
    return InvalidArgumentError("--target must be a ratio > 0");
  }
  if (!(o.step_base_us >= 0) || !(o.step_per_token_us >= 0)) {
    return InvalidArgumentError("--step-base-us and --step-per-token-us must be >= 0");
  }
  if (o.max_batch_tokens == 0) return InvalidArgumentError("--max-batch-tokens must be >= 1");
  if (!(o.request_timeout_s > 0)) return InvalidArgumentError("--request-timeout-s must be > 0");
  const uint32_t largest = *std::max_element(o.prompt_tokens.begin(), o.prompt_tokens.end());
  const uint32_t need = (largest + shape.block_tokens - 1) / shape.block_tokens;
  if (o.pool_blocks != 0 && o.pool_blocks < need) {
    return InvalidArgumentError("--pool-blocks " + std::to_string(o.pool_blocks) +
                                " cannot hold a prompt of " + std::to_string(largest) +
                                " tokens (" + std::to_string(need) + " blocks)");
  }
  return Status::Ok();
}

}  // namespace

// --engine llama: the model (made in `logs` unless o.model names one, its
// context long enough for `largest` tokens), its shape for `pool_blocks`,
// the engines' flags and llama.cpp alone on it. Prints what it made.
Status SetUpLlama(const TtftBenchOptions& o, const std::string& logs, uint32_t pool_blocks,
                  BenchClusterOptions* co, std::shared_ptr<LlamaChecker>* checker,
                  json* model_doc) {
  if (std::string why = llama::Unavailable(); !why.empty()) return UnavailableError(why);
  std::string path = o.model;
  if (path.empty()) {
    llama::MakeModelOptions m = o.make;
    m.context = std::max(m.context, (pool_blocks * kLlamaBlockTokens + 1023) / 1024 * 1024);
    path = logs + "/made-l" + std::to_string(m.layers) + "-e" + std::to_string(m.embd) + "-h" +
           std::to_string(m.heads) + "-k" + std::to_string(m.kv_heads) + "-v" +
           std::to_string(m.vocab) + "-c" + std::to_string(m.context) + "-s" +
           std::to_string(m.seed) + ".gguf";
    std::error_code ec;
    std::filesystem::create_directories(logs, ec);
    if (!std::filesystem::exists(path, ec)) {
      m.out_path = path;
      if (Status s = llama::MakeModel(m); !s.ok()) return s;
      std::printf("made a model: %s\n", path.c_str());
    }
  }
  llama::LlamaModelOptions lo;
  lo.model_path = path;
  lo.threads = o.threads;
  lo.context_tokens = 512;   // one batch: enough to measure its KV per token
  lo.max_sequences = 1;
  Result<std::unique_ptr<llama::LlamaModel>> model = llama::LlamaModel::Open(lo);
  if (!model.ok()) return model.status();
  const llama::ModelInfo& info = (*model)->info();
  *model_doc = {{"path", path}, {"made", o.model.empty()}, {"name", info.name},
                {"layers", info.layers}, {"embd", info.embd}, {"heads", info.heads},
                {"kv_heads", info.kv_heads}, {"vocab", info.vocab},
                {"kv_bytes_per_token", info.kv_bytes_per_token}, {"threads", o.threads}};
  co->shape.clear();
  co->given_shape =
      llama::ShapeFor((*model)->info(), kLlamaBlockTokens, pool_blocks * kLlamaBlockTokens);
  co->engine_args = {"--engine", "llama", "--model", path, "--threads", std::to_string(o.threads)};
  Result<std::shared_ptr<LlamaChecker>> c =
      LlamaChecker::Open({{1, path}}, o.threads, pool_blocks * kLlamaBlockTokens);
  if (!c.ok()) return c.status();
  *checker = *c;
  return Status::Ok();
}

Status RunTtftBench(const TtftBenchOptions& o) {
  const bool llama = o.engine == "llama";
  if (!llama && o.engine != "emulated") {
    return InvalidArgumentError("--engine must be emulated or llama, not '" + o.engine + "'");
  }
  if (!llama && !o.model.empty()) return InvalidArgumentError("--model needs --engine llama");
  if (llama && o.stream_chunks) {
    return InvalidArgumentError("--stream-chunks: llama.cpp engines hand their KV off whole");
  }
  if (o.prompt_tokens.empty()) return InvalidArgumentError("--prompt-tokens is empty");
  engine::ModelShape shape;
  if (!llama && !engine::ModelShapeByName(o.shape, &shape)) {
    return InvalidArgumentError("unknown --model-shape '" + o.shape + "' (tiny, small or 8b)");
  }
  const uint32_t block_tokens = llama ? kLlamaBlockTokens : shape.block_tokens;
  const uint32_t largest = *std::max_element(o.prompt_tokens.begin(), o.prompt_tokens.end());
  const uint32_t smallest = *std::min_element(o.prompt_tokens.begin(), o.prompt_tokens.end());
  const uint32_t largest_blocks = (largest + block_tokens - 1) / block_tokens;
  BenchClusterOptions co;
  co.logs = o.logs + "/" + o.transport + "-" + (llama ? std::string("llama") : o.shape);
  co.transport = o.transport;
  co.shape = o.shape;
  // Room for the largest prompt, and for the decoding requests beside it.
  const uint32_t decoder_blocks =
      o.decode_under_prefill_s > 0
          ? o.decoders * ((kDecodePromptTokens + o.decode_tokens + block_tokens - 1) / block_tokens)
          : 0;
  co.pool_blocks = o.pool_blocks != 0 ? o.pool_blocks : largest_blocks + 16 + decoder_blocks;
  std::shared_ptr<LlamaChecker> checker;
  json model_doc;   // --engine llama: the model
  if (llama) {
    if (Status s = SetUpLlama(o, o.logs, co.pool_blocks, &co, &checker, &model_doc); !s.ok()) {
      return s;
    }
    shape = co.given_shape;
  }
  if (Status s = Validate(o, shape); !s.ok()) return s;
  const uint64_t block_bytes = shape.BlockBytesPerRank(1);
  co.max_batch_tokens = llama ? 0 : o.max_batch_tokens;   // llama: serve's own
  co.step_base_us = o.step_base_us;
  co.step_per_token_us = o.step_per_token_us;
  co.prefix_caching = false;
  co.tcp_streams = o.tcp_streams;
  co.kv_read_threads = o.kv_read_threads;
  co.compute_first_token = o.compute_first_token;
  if (o.stream_chunks) co.twin_p_args = {"--stream-chunks"};   // a second P, its own router
  co.ucx_tls = o.ucx_tls;
  co.plain = true;

  std::printf("kvrelay bench ttft: transport %s, model %s (%s per block), prompts", o.transport.c_str(),
              shape.name.c_str(), HumanBytes(block_bytes).c_str());
  for (uint32_t t : o.prompt_tokens) std::printf(" %u", t);
  if (llama) {
    std::printf(" tokens, %u samples each, llama.cpp engines (%u thread(s) each), seed %" PRIu64
                "\n", o.samples, o.threads, o.seed);
  } else {
    std::printf(" tokens, %u samples each, steps %.0f µs + %.1f µs/token, token budget %u, "
                "%s, seed %" PRIu64 "\n",
                o.samples, o.step_base_us, o.step_per_token_us, o.max_batch_tokens,
                o.stream_chunks ? "P hands off whole, a second P streams finished chunks"
                                : "P hands off whole",
                o.seed);
  }
  std::printf("starting a plain engine, P, D and the router%s (pools of %u blocks, %s each; "
              "logs in %s) ...\n",
              o.stream_chunks ? ", and a streaming P behind a router of its own over that D" : "",
              co.pool_blocks, HumanBytes(co.pool_blocks * block_bytes).c_str(), co.logs.c_str());
  std::fflush(stdout);
  BenchCluster cluster;
  if (Status s = cluster.Start(co); !s.ok()) {
    const std::string stopped = cluster.Stop();
    return Status(s.code(), s.message() + " (" + stopped + ")");
  }
  std::vector<LengthRun> runs;
  std::vector<std::pair<std::string, DecodeUnderPrefill>> stalls;  // by path
  Status status = Status::Ok();
  {
    TtftRun run(o, cluster, checker);
    std::printf("warming up: 1 prompt of %u and %u of %u tokens on each path ...\n", smallest,
                o.warmup, largest);
    std::fflush(stdout);
    const Clock::time_point w0 = Clock::now();
    status = run.WarmUp(smallest, largest);
    if (status.ok()) {
      std::printf("  warm in %.1f s\n", SecondsSince(w0));
      std::fflush(stdout);
    }
    for (uint32_t tokens : o.prompt_tokens) {
      if (!status.ok()) break;
      LengthRun r;
      r.tokens = tokens;
      r.blocks = (tokens + shape.block_tokens - 1) / shape.block_tokens;
      r.samples.prompt_tokens = tokens;
      r.samples.kv_bytes = uint64_t{r.blocks} * block_bytes;
      if (o.stream_chunks) r.samples.chunk_tokens = o.max_batch_tokens;
      std::printf("%u tokens (%u blocks, %s of KV): %u samples ...\n", tokens, r.blocks,
                  HumanBytes(r.samples.kv_bytes).c_str(), o.samples);
      std::fflush(stdout);
      status = run.Measure(&r);
      runs.push_back(std::move(r));
    }
  }
  if (status.ok() && o.decode_under_prefill_s > 0) {
    DecodeUnderPrefillOptions d;
    d.seconds = o.decode_under_prefill_s;
    d.decoders = o.decoders;
    d.decode_prompt_tokens = kDecodePromptTokens;
    d.decode_tokens = o.decode_tokens;
    d.prefill_tokens = largest;
    d.vocab = shape.vocab;
    d.seed = o.seed;
    d.request_timeout_s = o.request_timeout_s;
    d.ignore_eos = llama;
    if (llama) {   // first tokens exact (later ones are batched with others')
      d.check = [checker](std::span<const engine::Token> prompt,
                          std::span<const engine::TokenOut> out) -> std::string {
        if (out.empty()) return "no token";
        const engine::Token first[] = {out[0].token};
        const uint64_t version[] = {1};
        bool whole = false;
        return checker->Check(prompt, first, version, &whole);
      };
    } else {
      d.check = [shape](std::span<const engine::Token> prompt,
                        std::span<const engine::TokenOut> out) {
        return engine::CheckOutput(prompt, out, shape);
      };
    }
    for (const auto& [path, url] : {std::pair<std::string, std::string>{"plain", cluster.plain_url()},
                                    {"P/D", cluster.router_url()}}) {
      if (!status.ok()) break;
      status = cluster.WaitIdle();
      if (!status.ok()) break;
      std::printf("decode under prefill, %s: %u requests of %u+%u tokens while prompts of %u "
                  "tokens prefill, %.0f s ...\n",
                  path.c_str(), o.decoders, kDecodePromptTokens, o.decode_tokens, largest,
                  d.seconds);
      std::fflush(stdout);
      Result<DecodeUnderPrefill> r = MeasureDecodeUnderPrefill(url, d);
      if (!r.ok()) {
        status = Status(r.status().code(), "decode under prefill, " + path + ": " +
                                               r.status().message());
        break;
      }
      stalls.emplace_back(path, *r);
    }
    if (status.ok()) status = cluster.WaitIdle();
  }
  const std::string stopped = cluster.Stop();
  if (!status.ok()) {
    return Status(status.code(), "[" + o.transport + "] " + status.message() + " (logs in " +
                                     co.logs + "; " + stopped + ")");
  }

  std::vector<TtftComparison> figures;
  for (const LengthRun& r : runs) {
    Result<TtftComparison> c = CompareTtft(r.samples, o.target_ratio, o.stream_goal);
    if (!c.ok()) return c.status();
    figures.push_back(*c);
  }
  std::printf("\n%s, %s: TTFT p50 (p90) in ms; difference = P/D p50 − plain p50; predicted = KV "
              "bytes / measured bandwidth\n",
              o.transport.c_str(), shape.name.c_str());
  std::printf("  %7s %10s %17s %17s %10s %10s %10s %10s %7s\n", "tokens", "KV", "plain",
              "P/D", "diff", "bandwidth", "predicted", "ans→tok", "ratio");
  for (const TtftComparison& f : figures) {
    char plain[32], pd[32], bw[32];
    std::snprintf(plain, sizeof plain, "%.1f (%.1f)", f.plain_p50_s * 1e3, f.plain_p90_s * 1e3);
    std::snprintf(pd, sizeof pd, "%.1f (%.1f)", f.pd_p50_s * 1e3, f.pd_p90_s * 1e3);
    std::snprintf(bw, sizeof bw, "%.2f GB/s", f.bandwidth_gbps);
    std::printf("  %7u %10s %17s %17s %10.1f %10s %10.1f %10.1f %7.2f\n", f.prompt_tokens,
                HumanBytes(f.kv_bytes).c_str(), plain, pd, f.difference_s * 1e3, bw,
                f.predicted_s * 1e3, f.answer_to_token_p50_s * 1e3, f.ratio);
  }
  std::printf("  ans→tok: D's answer arrived → the client's first token, p50 (D's step, the "
              "relay back)\n");
  if (o.stream_chunks) {
    std::printf("\nstreamed: the same prompts through a P that streams chunks of %u tokens "
                "(ms; s.diff = streamed P/D p50 − plain p50; last chunk = predicted × its share "
                "of the prompt; ×whole = s.diff / diff)\n",
                o.max_batch_tokens);
    std::printf("  %7s %7s %9s %17s %10s %10s %10s %7s\n", "tokens", "chunks", "streamed",
                "P/D streamed", "s.diff", "diff", "last chunk", "×whole");
    for (size_t i = 0; i < figures.size(); ++i) {
      const TtftComparison& f = figures[i];
      char pd[32];
      std::snprintf(pd, sizeof pd, "%.1f (%.1f)", f.streamed_p50_s * 1e3, f.streamed_p90_s * 1e3);
      std::printf("  %7u %7u %9.0f %17s %10.1f %10.1f %10.1f %7.2f\n", f.prompt_tokens, f.chunks,
                  runs[i].chunks_streamed, pd, f.streamed_difference_s * 1e3,
                  f.difference_s * 1e3, f.last_chunk_predicted_s * 1e3, f.over_whole);
    }
    std::printf("  streamed: chunks P handed over while it prefilled, in these samples (the "
                "last of each prompt goes at its end); ×whole −1: the whole hand-off added "
                "nothing to share\n");
  }
  for (const LengthRun& r : runs) {
    if (r.producer_tokens < 0) continue;
    std::printf("  %u tokens: D emitted P's first token in %.0f of %zu hand-offs (the P/D "
                "requests and the transfers; the rest it computed from the loaded KV)\n",
                r.tokens, r.producer_tokens, r.samples.pd_s.size() + r.samples.transfer_s.size());
  }
  for (const TtftComparison& f : figures) {
    std::printf("  %u tokens: until D has the KV (P/D TTFT − ans→tok, per request), p50 − plain "
                "p50 = %.1f ms; P/D requests' own pull→answer p50 %.1f ms (from D's pull, "
                "while P prefilled)\n",
                f.prompt_tokens, f.until_answer_difference_s * 1e3, f.pd_pull_p50_s * 1e3);
  }
  for (const LengthRun& r : runs) {
    auto ms = [](const std::vector<double>& v) { return Percentile(v, 0.5) * 1e3; };
    std::printf("  %u tokens: engine steps per request, p50 work (modelled) ms: plain %.1f "
                "(%.1f), P %.1f (%.1f)",
                r.tokens, ms(r.plain_steps.work_s), ms(r.plain_steps.modelled_s),
                ms(r.p_steps.work_s), ms(r.p_steps.modelled_s));
    if (o.stream_chunks) {
      std::printf(", streaming P %.1f (%.1f)", ms(r.streamed_p_steps.work_s),
                  ms(r.streamed_p_steps.modelled_s));
    }
    std::printf("\n");
  }
  for (const LengthRun& r : runs) {
    if (!llama) break;
    const KvCopies& k = r.copies;
    std::printf("  %u tokens: llama.cpp's copies: export on P %.2f µs/token (%.1f ms per "
                "prompt), import on D %.2f µs/token (%.1f ms per prompt); all %zu P/D outputs "
                "equal the plain engine's, and %u plain one(s) llama.cpp alone's\n",
                r.tokens, k.ExportUsPerToken(), k.ExportUsPerToken() * r.tokens / 1e3,
                k.ImportUsPerToken(), k.ImportUsPerToken() * r.tokens / 1e3,
                r.samples.pd_s.size(), r.reference_checked);
  }
  if (stalls.size() == 2) {
    std::printf("\ndecode under prefill: %u requests of %u+%u tokens decoding while prompts of "
                "%u tokens prefill, %.0f s per path\n",
                o.decoders, kDecodePromptTokens, o.decode_tokens, largest,
                o.decode_under_prefill_s);
    std::printf("  %6s %16s %12s %12s %16s %14s\n", "path", "decode tokens/s", "gap p50 ms",
                "gap p99 ms", "short requests", "long prompts");
    for (const auto& [path, s] : stalls) {
      std::printf("  %6s %16.1f %12.2f %12.2f %16llu %14llu\n", path.c_str(),
                  s.decode_tokens_per_s, s.gap_p50_s * 1e3, s.gap_p99_s * 1e3,
                  static_cast<unsigned long long>(s.decode_requests),
                  static_cast<unsigned long long>(s.long_prompts));
    }
    const double plain = stalls[0].second.decode_tokens_per_s;
    std::printf("  P/D ÷ plain decode tokens/s: %.2f; gap p99 plain ÷ P/D: %.2f\n",
                plain > 0 ? stalls[1].second.decode_tokens_per_s / plain : 0,
                stalls[1].second.gap_p99_s > 0
                    ? stalls[0].second.gap_p99_s / stalls[1].second.gap_p99_s
                    : 0);
  }
  std::printf("targets:\n");
  bool all_met = true;
  for (const TtftComparison& f : figures) {
    all_met = all_met && f.met;
    std::printf("  [%s] %s %u tokens: P/D − plain = %.1f ms = %.2f× the predicted transfer "
                "time %.1f ms (target ≤ %.2f×)\n",
                f.met ? "MET" : "MISSED", o.transport.c_str(), f.prompt_tokens,
                f.difference_s * 1e3, f.ratio, f.predicted_s * 1e3, f.target_ratio);
  }
  for (const TtftComparison& f : figures) {
    if (!o.stream_chunks) break;
    if (f.chunks < 2) {
      std::printf("  [n/a] %s %u tokens streamed: one chunk of %u tokens, nothing to stream\n",
                  o.transport.c_str(), f.prompt_tokens, o.max_batch_tokens);
      continue;
    }
    std::printf("  [%s] %s %u tokens streamed: P/D − plain = %.1f ms = %.2f× the whole "
                "hand-off's %.1f ms (goal ≤ %.2f×; the last chunk's transfer predicts %.1f ms)\n",
                f.stream_goal_met ? "MET" : "MISSED", o.transport.c_str(), f.prompt_tokens,
                f.streamed_difference_s * 1e3, f.over_whole, f.difference_s * 1e3, f.stream_goal,
                f.last_chunk_predicted_s * 1e3);
  }
  std::printf("%s\n", all_met ? "all targets met" : "some targets MISSED");
  std::fflush(stdout);

  if (!o.json_path.empty()) {
    json doc{{"transport", o.transport}, {"shape", shape.name}, {"engine", o.engine},
             {"seed", o.seed},
             {"samples", o.samples}, {"step_base_us", o.step_base_us},
             {"step_per_token_us", o.step_per_token_us},
             {"max_batch_tokens", o.max_batch_tokens}, {"pool_blocks", co.pool_blocks},
             {"stream_chunks", o.stream_chunks}, {"stream_goal", o.stream_goal},
             {"target_ratio", o.target_ratio}, {"targets_met", all_met},
             {"definition",
              "difference = P/D TTFT p50 - plain TTFT p50; predicted = kv_bytes / bandwidth, "
              "bandwidth = kv_bytes / p50 of D's pull->answer for transfers of this KV pulled "
              "after P finished; ratio = difference / predicted"}};
    json rows = json::array();
    for (size_t i = 0; i < figures.size(); ++i) {
      const TtftComparison& f = figures[i];
      const TtftSamples& s = runs[i].samples;
      rows.push_back({{"prompt_tokens", f.prompt_tokens}, {"kv_bytes", f.kv_bytes},
                      {"plain_p50_s", f.plain_p50_s}, {"plain_p90_s", f.plain_p90_s},
                      {"pd_p50_s", f.pd_p50_s}, {"pd_p90_s", f.pd_p90_s},
                      {"difference_s", f.difference_s}, {"transfer_p50_s", f.transfer_p50_s},
                      {"bandwidth_gbps", f.bandwidth_gbps}, {"predicted_s", f.predicted_s},
                      {"ratio", f.ratio}, {"met", f.met},
                      {"pd_pull_p50_s", f.pd_pull_p50_s},
                      {"answer_to_token_p50_s", f.answer_to_token_p50_s},
                      {"until_answer_difference_s", f.until_answer_difference_s},
                      {"producer_first_tokens", runs[i].producer_tokens},
                      {"export_us_per_token", runs[i].copies.ExportUsPerToken()},
                      {"import_us_per_token", runs[i].copies.ImportUsPerToken()},
                      {"reference_checked", runs[i].reference_checked},
                      {"chunks", f.chunks}, {"chunks_streamed", runs[i].chunks_streamed},
                      {"streamed_p50_s", f.streamed_p50_s}, {"streamed_p90_s", f.streamed_p90_s},
                      {"streamed_difference_s", f.streamed_difference_s},
                      {"streamed_ratio", f.streamed_ratio}, {"over_whole", f.over_whole},
                      {"last_chunk_predicted_s", f.last_chunk_predicted_s},
                      {"stream_goal_met", f.stream_goal_met}, {"streamed_s", s.streamed_s},
                      {"plain_s", s.plain_s}, {"pd_s", s.pd_s}, {"transfer_s", s.transfer_s},
                      {"pd_pull_s", s.pd_pull_s}, {"answer_to_token_s", s.answer_to_token_s},
                      {"engine_steps",
                       {{"plain", runs[i].plain_steps.Json()}, {"p", runs[i].p_steps.Json()},
                        {"streaming_p", runs[i].streamed_p_steps.Json()}}}});
    }
    doc["lengths"] = rows;
    if (llama) doc["model"] = model_doc;
    if (stalls.size() == 2) {
      json paths = json::object();
      for (const auto& [path, s] : stalls) {
        paths[path == "plain" ? "plain" : "pd"] = {
            {"decode_tokens_per_s", s.decode_tokens_per_s}, {"gap_p50_s", s.gap_p50_s},
            {"gap_p99_s", s.gap_p99_s}, {"decode_requests", s.decode_requests},
            {"long_prompts", s.long_prompts}};
      }
      doc["decode_under_prefill"] = {{"seconds", o.decode_under_prefill_s},
                                     {"decoders", o.decoders},
                                     {"decode_prompt_tokens", kDecodePromptTokens},
                                     {"decode_tokens", o.decode_tokens},
                                     {"prefill_tokens", largest},
                                     {"paths", paths}};
    }
    if (o.json_path == "-") {
      std::printf("%s\n", doc.dump(2).c_str());
    } else {
      std::ofstream f(o.json_path);
      f << doc.dump(2) << "\n";
      if (!f) return UnavailableError("cannot write " + o.json_path);
    }
  }
  return Status::Ok();
}

}  // namespace kvrelay::cli
