// decode_under_prefill.h — what decoding requests see while long prompts
// prefill beside them, on one endpoint: the figure P/D exists for.
//
// On a plain engine a long prompt's prefill chunks share every step with
// the decoding requests, so their tokens wait behind it; through the router
// the prefill runs on P and D only decodes (and takes the KV in). This
// phase of `bench ttft` runs, for `seconds` on one URL: `decoders` client
// threads each sending short streamed requests back to back, and one thread
// sending long prompts (one output token) back to back. Figures: the short
// requests' tokens after their first, per second of the window, and the gaps
// between consecutive tokens of a request (p50, p99).
//
// Threading: MeasureDecodeUnderPrefill blocks its caller; it runs its own
// client threads and joins them before it returns.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "base/result.h"
#include "engine/engine.h"

namespace kvrelay::cli {

struct DecodeUnderPrefillOptions {
  double seconds = 10;               // the window, per endpoint
  uint32_t decoders = 4;             // short requests in flight at once
  uint32_t decode_prompt_tokens = 16;
  uint32_t decode_tokens = 64;       // output tokens per short request
  uint32_t prefill_tokens = 8192;    // the long prompts' length
  uint32_t vocab = 512;              // prompts' token ids are in [1, vocab)
  uint64_t seed = 1;
  double request_timeout_s = 120;
  bool ignore_eos = false;           // a real model may draw its end token
  // The short requests' outputs: "" if right, else why. Called from the
  // client threads (must be thread-safe); null: not checked.
  std::function<std::string(std::span<const engine::Token> prompt,
                            std::span<const engine::TokenOut> out)>
      check;
};

struct DecodeUnderPrefill {
  double window_s = 0;
  double decode_tokens_per_s = 0;    // short requests' tokens after their first
  double gap_p50_s = 0, gap_p99_s = 0;
  uint64_t decode_requests = 0;      // short requests ended in the window
  uint64_t long_prompts = 0;         // long prompts answered in the window
};

// Errors: a request failed, or an output the check refused.
Result<DecodeUnderPrefill> MeasureDecodeUnderPrefill(const std::string& url,
                                                     const DecodeUnderPrefillOptions& options);

}  // namespace kvrelay::cli
