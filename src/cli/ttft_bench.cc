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
#include "bench/ttft_compare.h"
#include "cli/bench_cluster.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "router/sse_splitter.h"
#include "router/transfer_id_source.h"

namespace kvrelay::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

int64_t MonoNs() {  // steady_clock is CLOCK_MONOTONIC, as D's pull log
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One streamed completion: when its first token arrived, and its tokens.
struct Streamed {
  double ttft_s = -1;
  int64_t first_token_mono_ns = 0;
  std::vector<engine::TokenOut> tokens;
};

// Sends `body` (which must say "stream": true) and reads the SSE stream to
// its end. Errors: no answer, an HTTP error, an error event, no token, a
// stream cut off before [DONE].
Result<Streamed> StreamOne(const http::Client& cli, const json& body, double timeout_s) {
  Streamed out;
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.body = body.dump();
  int status = 0;
  router::SseSplitter sse;  // the router's: events however the bytes were chunked
  std::string error;
  bool done = false;
  const Clock::time_point t0 = Clock::now();
  http::ClientSink sink;
  sink.on_status = [&](int s) { status = s; };
  sink.on_data = [&](std::string_view data) {
    sse.Feed(data);
    while (std::optional<std::string> ev = sse.Next()) {
      const std::optional<std::string> data_line = router::SseSplitter::DataOf(*ev);
      if (!data_line) continue;  // a keep-alive comment
      if (*data_line == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(*data_line, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error") && !j["error"].is_null()) {
        error = j["error"].is_object() ? j["error"].value("message", "error") : j["error"].dump();
        continue;
      }
      const json choices = j.value("choices", json::array());
      if (choices.empty()) continue;   // the usage chunk
      const json ids = choices[0].value("token_ids", json::array());
      const json vers = choices[0].value("weights_versions", json::array());
      if (out.ttft_s < 0 && !ids.empty()) {
        out.ttft_s = Since(t0);
        out.first_token_mono_ns = MonoNs();
      }
      for (size_t k = 0; k < ids.size() && k < vers.size(); ++k) {
        out.tokens.push_back(
            engine::TokenOut{0, ids[k].get<engine::Token>(), vers[k].get<uint64_t>()});
      }
    }
    return Since(t0) < timeout_s;
  };
  http::ClientOptions opts = cli.options();
  opts.idle_timeout = Duration::Nanoseconds(static_cast<int64_t>(timeout_s * 1e9));
  http::BlockingCall call;
  Result<http::ClientResponse> r = call.Run(cli.base_url(), std::move(req), opts, std::move(sink));
  if (!r.ok() && status == 0) return UnavailableError("no response: " + r.status().message());
  if (status != 200) {
    return UnavailableError("HTTP " + std::to_string(status) + ": " +
                            (r.ok() ? r->body.substr(0, 300) : r.status().message()));
  }
  if (!error.empty()) return UnavailableError("error event: " + error);
  if (!done) {
    return UnavailableError(Since(t0) >= timeout_s ? "timed out" : "stream cut off before [DONE]");
  }
  if (out.ttft_s < 0) return UnavailableError("no token");
  return out;
}

constexpr char kProducerTokens[] = "kvrelay_first_tokens_from_producer_total";

std::vector<engine::Token> PromptOf(const json& body) {
  return body.at("prompt").get<std::vector<engine::Token>>();
}

// The samples of one prompt length, as they come in.
struct LengthRun {
  uint32_t tokens = 0, blocks = 0;
  TtftSamples samples;
  double producer_tokens = -1;  // P/D requests whose first token D took from P
};

class TtftRun {
 public:
  TtftRun(const TtftBenchOptions& o, BenchCluster& c) : o_(o), c_(c), prng_(o.seed) {}

  // Untimed: connections, handshakes, and the first touches of every pool
  // (on this machine kind a first touch of a page costs tens of µs; see
  // docs/performance.md), as a long-running cluster has them.
  Status WarmUp(uint32_t smallest, uint32_t largest) {
    std::vector<uint32_t> lengths = {smallest};
    for (uint32_t i = 0; i < o_.warmup; ++i) lengths.push_back(largest);
    for (uint32_t tokens : lengths) {
      json body = Stream(c_.Prompt(prng_, tokens));
      if (Status s = Plain(body, nullptr); !s.ok()) return s;
      if (Status s = ThroughRouter(body, tokens, nullptr); !s.ok()) return s;
      if (Status s = Transfer(tokens, nullptr); !s.ok()) return s;
    }
    return Status::Ok();
  }

  Status Measure(LengthRun* run) {
    const Clock::time_point t0 = Clock::now();
    const double producer_tokens0 = MetricSample(c_.d_url(), kProducerTokens);
    Clock::time_point last_line = t0;
    for (uint32_t i = 0; i < o_.samples; ++i) {
      json body = Stream(c_.Prompt(prng_, run->tokens));
      // Alternate which path goes first, so neither always follows the
      // other's leftovers (caches, the kernel's page reclaim).
      if (i % 2 == 0) {
        if (Status s = Plain(body, run); !s.ok()) return s;
        if (Status s = ThroughRouter(body, run->tokens, run); !s.ok()) return s;
      } else {
        if (Status s = ThroughRouter(body, run->tokens, run); !s.ok()) return s;
        if (Status s = Plain(body, run); !s.ok()) return s;
      }
      if (Status s = Transfer(run->tokens, run); !s.ok()) return s;
      if (Since(last_line) >= 10 || i + 1 == o_.samples) {
        last_line = Clock::now();
        const TtftSamples& s = run->samples;
        std::printf("  [%u tokens] %u/%u samples, %.0f s: last plain %.1f ms, P/D %.1f ms, "
                    "transfer %.1f ms\n",
                    run->tokens, i + 1, o_.samples, Since(t0), s.plain_s.back() * 1e3,
                    s.pd_s.back() * 1e3, s.transfer_s.back() * 1e3);
        std::fflush(stdout);
      }
    }
    const double producer_tokens1 = MetricSample(c_.d_url(), kProducerTokens);
    if (producer_tokens0 >= 0 && producer_tokens1 >= 0) {
      run->producer_tokens = producer_tokens1 - producer_tokens0;
    }
    return Status::Ok();
  }

 private:
  // Two tokens, streamed: TTFT is the first; the second makes D read every
  // byte it loaded (D emits P's first token without a step on the KV,
  // docs/design.md), so the output check covers the transfer.
  static json Stream(json body) {
    body["stream"] = true;
    body["max_tokens"] = kTokens;
    return body;
  }
  static constexpr uint32_t kTokens = 2;

  // TTFT on the plain engine.
  Status Plain(const json& body, LengthRun* run) {
    if (Status s = c_.WaitIdle(); !s.ok()) return s;
    Result<Streamed> r = StreamOne(plain_, body, o_.request_timeout_s);
    if (!r.ok()) return Status(r.status().code(), "plain engine: " + r.status().message());
    if (Status s = Checked(body, *r, "plain engine"); !s.ok()) return s;
    if (run != nullptr) run->samples.plain_s.push_back(r->ttft_s);
    return Status::Ok();
  }

  // TTFT through the router; the request's own pull from D's log.
  Status ThroughRouter(const json& body, uint32_t tokens, LengthRun* run) {
    if (Status s = c_.WaitIdle(); !s.ok()) return s;
    if (Result<std::vector<BenchCluster::Pulled>> old = c_.NewPulls(); !old.ok()) {
      return old.status();
    }
    Result<Streamed> r = StreamOne(router_, body, o_.request_timeout_s);
    if (!r.ok()) return Status(r.status().code(), "through the router: " + r.status().message());
    if (Status s = Checked(body, *r, "through the router"); !s.ok()) return s;
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
    if (Status s = Served(pulls, tokens, "a P/D request through the router"); !s.ok()) return s;
    if (run != nullptr) {
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
  const http::Client plain_{c_.plain_url()};
  const http::Client router_{c_.router_url()};
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
                                  std::to_string(shape.max_context - 1) + " (" + o.shape +
                                  "'s context of " + std::to_string(shape.max_context) +
                                  " tokens, less the token to generate)");
    }
  }
  if (o.samples == 0) return InvalidArgumentError("--samples must be at least 1");
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

Status RunTtftBench(const TtftBenchOptions& o) {
  engine::ModelShape shape;
  if (!engine::ModelShapeByName(o.shape, &shape)) {
    return InvalidArgumentError("unknown --model-shape '" + o.shape + "' (tiny, small or 8b)");
  }
  if (Status s = Validate(o, shape); !s.ok()) return s;
  const uint32_t largest = *std::max_element(o.prompt_tokens.begin(), o.prompt_tokens.end());
  const uint32_t smallest = *std::min_element(o.prompt_tokens.begin(), o.prompt_tokens.end());
  const uint32_t largest_blocks = (largest + shape.block_tokens - 1) / shape.block_tokens;
  const uint64_t block_bytes = shape.BlockBytesPerRank(1);
  BenchClusterOptions co;
  co.logs = o.logs + "/" + o.transport + "-" + o.shape;
  co.transport = o.transport;
  co.shape = o.shape;
  co.pool_blocks = o.pool_blocks != 0 ? o.pool_blocks : largest_blocks + 16;
  co.max_batch_tokens = o.max_batch_tokens;
  co.step_base_us = o.step_base_us;
  co.step_per_token_us = o.step_per_token_us;
  co.prefix_caching = false;
  co.tcp_streams = o.tcp_streams;
  co.kv_read_threads = o.kv_read_threads;
  co.compute_first_token = o.compute_first_token;
  co.ucx_tls = o.ucx_tls;
  co.plain = true;

  std::printf("kvrelay bench ttft: transport %s, model %s (%s per block), prompts", o.transport.c_str(),
              o.shape.c_str(), HumanBytes(block_bytes).c_str());
  for (uint32_t t : o.prompt_tokens) std::printf(" %u", t);
  std::printf(" tokens, %u samples each, steps %.0f µs + %.1f µs/token, token budget %u, "
              "seed %" PRIu64 "\n",
              o.samples, o.step_base_us, o.step_per_token_us, o.max_batch_tokens, o.seed);
  std::printf("starting a plain engine, P, D and the router (pools of %u blocks, %s each; logs "
              "in %s) ...\n",
              co.pool_blocks, HumanBytes(co.pool_blocks * block_bytes).c_str(), co.logs.c_str());
  std::fflush(stdout);
  BenchCluster cluster;
  if (Status s = cluster.Start(co); !s.ok()) {
    const std::string stopped = cluster.Stop();
    return Status(s.code(), s.message() + " (" + stopped + ")");
  }
  std::vector<LengthRun> runs;
  Status status = Status::Ok();
  {
    TtftRun run(o, cluster);
    std::printf("warming up: 1 prompt of %u and %u of %u tokens on each path ...\n", smallest,
                o.warmup, largest);
    std::fflush(stdout);
    const Clock::time_point w0 = Clock::now();
    status = run.WarmUp(smallest, largest);
    if (status.ok()) {
      std::printf("  warm in %.1f s\n", Since(w0));
      std::fflush(stdout);
    }
    for (uint32_t tokens : o.prompt_tokens) {
      if (!status.ok()) break;
      LengthRun r;
      r.tokens = tokens;
      r.blocks = (tokens + shape.block_tokens - 1) / shape.block_tokens;
      r.samples.prompt_tokens = tokens;
      r.samples.kv_bytes = uint64_t{r.blocks} * block_bytes;
      std::printf("%u tokens (%u blocks, %s of KV): %u samples ...\n", tokens, r.blocks,
                  HumanBytes(r.samples.kv_bytes).c_str(), o.samples);
      std::fflush(stdout);
      status = run.Measure(&r);
      runs.push_back(std::move(r));
    }
  }
  const std::string stopped = cluster.Stop();
  if (!status.ok()) {
    return Status(status.code(), "[" + o.transport + "] " + status.message() + " (logs in " +
                                     co.logs + "; " + stopped + ")");
  }

  std::vector<TtftComparison> figures;
  for (const LengthRun& r : runs) {
    Result<TtftComparison> c = CompareTtft(r.samples, o.target_ratio);
    if (!c.ok()) return c.status();
    figures.push_back(*c);
  }
  std::printf("\n%s, %s: TTFT p50 (p90) in ms; difference = P/D p50 − plain p50; predicted = KV "
              "bytes / measured bandwidth\n",
              o.transport.c_str(), o.shape.c_str());
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
  for (const LengthRun& r : runs) {
    if (r.producer_tokens < 0) continue;
    std::printf("  %u tokens: D emitted P's first token in %.0f of %zu P/D requests (the rest "
                "it computed from the loaded KV)\n",
                r.tokens, r.producer_tokens, r.samples.pd_s.size());
  }
  for (const TtftComparison& f : figures) {
    std::printf("  %u tokens: until D has the KV (P/D TTFT − ans→tok, per request), p50 − plain "
                "p50 = %.1f ms; P/D requests' own pull→answer p50 %.1f ms (from D's pull, "
                "while P prefilled)\n",
                f.prompt_tokens, f.until_answer_difference_s * 1e3, f.pd_pull_p50_s * 1e3);
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
  std::printf("%s\n", all_met ? "all targets met" : "some targets MISSED");
  std::fflush(stdout);

  if (!o.json_path.empty()) {
    json doc{{"transport", o.transport}, {"shape", o.shape}, {"seed", o.seed},
             {"samples", o.samples}, {"step_base_us", o.step_base_us},
             {"step_per_token_us", o.step_per_token_us},
             {"max_batch_tokens", o.max_batch_tokens}, {"pool_blocks", co.pool_blocks},
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
                      {"plain_s", s.plain_s}, {"pd_s", s.pd_s}, {"transfer_s", s.transfer_s},
                      {"pd_pull_s", s.pd_pull_s}, {"answer_to_token_s", s.answer_to_token_s}});
    }
    doc["lengths"] = rows;
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
