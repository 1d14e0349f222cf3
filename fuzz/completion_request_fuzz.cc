// completion_request_fuzz.cc — libFuzzer target for the engine server's
// POST /v1/completions and /v1/chat/completions bodies:
// ParseCompletionRequest (server/completion_request.h), ParseChatRequest
// (server/chat_request.h; a chat becomes the same request) and the lenient
// read of a refused hand-off (server/refused_handoff.h), all called by
// EngineServer on the raw body.
//
// Beyond "never crashes": an accepted request keeps every rule the header
// promises (prompt non-empty, ids in the vocabulary, prompt + max_tokens
// within the context, a request_id in bounds, kv params consistent), and an
// error maps to 400 or 413 with a message. Seeds: fuzz/corpus/
// completion_request; dictionary: completion_request.dict.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/check.h"
#include "engine/model.h"
#include "server/chat_request.h"
#include "server/completion_request.h"
#include "server/refused_handoff.h"

namespace {

using kvrelay::Result;
using kvrelay::StatusCode;
using kvrelay::server::CompletionRequest;
using kvrelay::server::ParseLimits;

void CheckParsed(std::string_view body, const ParseLimits& limits,
                 const Result<CompletionRequest>& r) {
  if (!r.ok()) {
    KV_CHECK(!r.status().message().empty());
    const int http = kvrelay::server::HttpStatusForParseError(r.status());
    KV_CHECK(http == 400 || http == 413);
    const std::string_view limit = kvrelay::server::ParseErrorLimit(r.status());
    KV_CHECK((http == 413) == (limit == "body_bytes"));
    return;
  }
  const CompletionRequest& c = *r;
  KV_CHECK(body.size() <= limits.max_body_bytes);
  KV_CHECK(!c.prompt.empty());
  KV_CHECK(c.prompt.size() <= limits.max_prompt_tokens);
  for (kvrelay::engine::Token t : c.prompt) KV_CHECK(t < limits.vocab);
  KV_CHECK(c.max_tokens >= 1);
  KV_CHECK(c.prompt.size() + c.max_tokens <= limits.max_context);
  KV_CHECK(c.request_id.size() <= kvrelay::server::kMaxRequestIdChars);
  KV_CHECK(c.remote_host.size() <= kvrelay::server::kMaxRemoteHostChars);
  if (c.has_kv) {
    KV_CHECK(c.kv.do_remote_decode || c.kv.do_remote_prefill);
    KV_CHECK(!c.kv.transfer.IsZero());
    KV_CHECK(c.kv.prompt_hash == 0);
  }
}

void Check(std::string_view body, const ParseLimits& limits) {
  CheckParsed(body, limits, kvrelay::server::ParseCompletionRequest(body, limits));
  CheckParsed(body, limits, kvrelay::server::ParseChatRequest(body, limits));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  kvrelay::engine::ModelShape shape;
  KV_CHECK(kvrelay::engine::ModelShapeByName("tiny", &shape));
  ParseLimits serving = kvrelay::server::ParseLimitsFor(shape, 1 << 20);
  serving.model_name = "kvrelay-tiny";
  Check(body, serving);
  // Small limits, so that every limit is reachable by short inputs.
  ParseLimits tight;
  tight.model_name = "m";
  tight.vocab = 50;
  tight.max_context = 12;
  tight.max_body_bytes = 256;
  tight.max_prompt_tokens = 6;
  Check(body, tight);

  if (const auto h = kvrelay::server::ParseRefusedHandoff(body)) {
    KV_CHECK(h->kv.do_remote_prefill && !h->kv.transfer.IsZero());
    KV_CHECK(!h->host.empty() && h->port != 0);
    KV_CHECK(h->kv.remote_tp >= 1 && kvrelay::engine::kHeadGroups % h->kv.remote_tp == 0);
  }
  return 0;
}
