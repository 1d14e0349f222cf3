// http_request_fuzz.cc — libFuzzer target for the HTTP server's request
// reading: the bytes of one request through Beast's parser with the
// server's limits and the server's own rules (src/http/request_rules.h,
// ParseRequestBytes: the code the sockets run), headers and chunked framing
// included. Small limits (2 KiB of header, 4 KiB of body) so inputs reach
// them.
//
// Checks: an accepted request has a path starting with '/', lower-case
// header names, a body within the limit and no more bytes read than given;
// a refusal is 400, 413, 414 or 431 with a message. Seeds:
// fuzz/corpus/http_request; dictionary: http_request.dict.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/check.h"
#include "http/request_rules.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvrelay::http;
  ServerLimits limits;
  limits.max_header_bytes = 2048;
  limits.max_body_bytes = 4096;
  limits.max_target_bytes = 512;
  limits.max_header_count = 16;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const ParsedBytes p = ParseRequestBytes(in, limits);
  KV_CHECK(p.consumed <= size);
  switch (p.kind) {
    case ParsedBytes::Kind::kRequest:
      KV_CHECK(!p.request.path.empty() && p.request.path[0] == '/');
      KV_CHECK(p.request.body.size() <= limits.max_body_bytes);
      KV_CHECK(p.request.target.size() <= limits.max_target_bytes);
      for (const auto& [name, value] : p.request.headers) {
        for (char c : name) KV_CHECK(!std::isupper(static_cast<unsigned char>(c)));
      }
      break;
    case ParsedBytes::Kind::kRefused:
      KV_CHECK(p.refusal.status == 400 || p.refusal.status == 413 || p.refusal.status == 414 ||
               p.refusal.status == 431);
      KV_CHECK(!p.refusal.message.empty());
      break;
    case ParsedBytes::Kind::kNeedMore:
    case ParsedBytes::Kind::kClosed:
      break;
  }
  return 0;
}
