// decode_under_prefill.cc — see decode_under_prefill.h. Every thread stops
// sending once the window closed; a request still running then is finished
// (so the engines end idle) but counts only the tokens that arrived inside
// the window.
#include "cli/decode_under_prefill.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "base/prng.h"
#include "bench/percentile.h"
#include "cli/stream_completion.h"

namespace kvrelay::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

json Body(Prng& prng, uint32_t tokens, uint32_t max_tokens, const DecodeUnderPrefillOptions& o) {
  json ids = json::array();
  for (uint32_t i = 0; i < tokens; ++i) ids.push_back(1 + prng.Uniform(o.vocab - 1));
  json body{{"prompt", ids}, {"max_tokens", max_tokens}, {"stream", true}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  return body;
}

}  // namespace

Result<DecodeUnderPrefill> MeasureDecodeUnderPrefill(const std::string& url,
                                                     const DecodeUnderPrefillOptions& o) {
  if (o.vocab < 2 || o.decoders == 0 || !(o.seconds > 0)) {
    return InvalidArgumentError("decode under prefill: needs a vocabulary, decoders and a window");
  }
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point end = t0 + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(o.seconds));
  auto at = [&](Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  std::mutex mu;
  Status failed = Status::Ok();
  std::vector<double> gaps;
  uint64_t tokens = 0, requests = 0, long_prompts = 0;
  std::atomic<bool> stop{false};
  auto fail = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed.ok()) failed = s;
    stop = true;
  };
  std::vector<std::thread> threads;
  for (uint32_t d = 0; d < o.decoders; ++d) {
    threads.emplace_back([&, d] {
      Prng prng(o.seed * 1000 + d);
      const http::Client cli(url);
      while (!stop && Clock::now() < end) {
        const json body = Body(prng, o.decode_prompt_tokens, o.decode_tokens, o);
        const Clock::time_point sent = Clock::now();
        Result<Streamed> r = StreamCompletion(cli, body, o.request_timeout_s);
        if (!r.ok()) return fail(Status(r.status().code(), "a decoding request: " +
                                                               r.status().message()));
        if (o.check) {
          const auto prompt = body.at("prompt").get<std::vector<engine::Token>>();
          if (std::string bad = o.check(prompt, r->tokens); !bad.empty()) {
            return fail(InternalError("a decoding request's output: " + bad));
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        const double start_s = at(sent);
        for (size_t k = 1; k < r->token_s.size(); ++k) {
          if (start_s + r->token_s[k] > o.seconds) break;
          ++tokens;
          gaps.push_back(r->token_s[k] - r->token_s[k - 1]);
        }
        if (start_s + r->token_s.back() <= o.seconds) ++requests;
      }
    });
  }
  threads.emplace_back([&] {
    Prng prng(o.seed * 1000 + 999);
    const http::Client cli(url);
    while (!stop && Clock::now() < end) {
      const json body = Body(prng, o.prefill_tokens, 1, o);
      Result<Streamed> r = StreamCompletion(cli, body, o.request_timeout_s);
      if (!r.ok()) return fail(Status(r.status().code(), "a long prompt: " +
                                                             r.status().message()));
      std::lock_guard<std::mutex> lock(mu);
      if (at(Clock::now()) <= o.seconds) ++long_prompts;
    }
  });
  for (std::thread& t : threads) t.join();
  if (!failed.ok()) return failed;
  DecodeUnderPrefill out;
  out.window_s = o.seconds;
  out.decode_tokens_per_s = static_cast<double>(tokens) / o.seconds;
  out.gap_p50_s = Percentile(gaps, 0.5);
  out.gap_p99_s = Percentile(gaps, 0.99);
  out.decode_requests = requests;
  out.long_prompts = long_prompts;
  return out;
}

}  // namespace kvrelay::cli
