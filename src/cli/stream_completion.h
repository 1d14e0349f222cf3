// stream_completion.h — one streamed OpenAI completion sent by a bench, read
// to its end, with when each token arrived at the client.
//
// Why apart: `bench ttft` times first tokens with it and its decode-under-
// prefill phase (cli/decode_under_prefill.h) times the gaps between later
// ones; both must read the stream the same way (the router's SSE splitter,
// so events are found however the bytes were chunked).
//
// Threading: any thread; a call blocks its caller until the stream ends.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/result.h"
#include "engine/engine.h"
#include "http/http_client.h"

namespace kvrelay::cli {

struct Streamed {
  double ttft_s = -1;                 // sent → first token, at the client
  int64_t first_token_mono_ns = 0;    // CLOCK_MONOTONIC when it arrived
  std::vector<engine::TokenOut> tokens;
  std::vector<double> token_s;        // per token: sent → its arrival
};

// Sends `body` (which must say "stream": true) to POST /v1/completions and
// reads the SSE stream to its end. Errors: no answer, an HTTP error, an
// error event, no token, a stream cut off before [DONE], `timeout_s` passed.
Result<Streamed> StreamCompletion(const http::Client& cli, const nlohmann::json& body,
                                  double timeout_s);

}  // namespace kvrelay::cli
