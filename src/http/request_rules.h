// request_rules.h — what the HTTP server accepts of a request, as functions
// over Beast's parser (internal to src/http): which parse errors are
// answered and how, the checks after the header, and the Request built from
// a whole message. ParseRequestBytes runs them all over bytes in memory,
// for the fuzz target (fuzz/http_request_fuzz.cc) and tests.
//
// Why apart from Connection: the rules are the server's contract
// (docs/http.md, "What the HTTP server refuses itself"); here they are
// pure and one place, and the fuzzer drives exactly the code the sockets do.
//
// Thread safety: pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "http/http_request.h"
#include "http/http_server.h"

namespace kvrelay::http {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;
using RequestMessage = boost::beast::http::request<boost::beast::http::string_body>;

// A request the server answers itself, then closes the connection.
struct Refusal {
  enum class Reason : uint8_t { kBodyBytes, kHeaderBytes, kMalformed, kTimeout };
  int status = 400;
  std::string message;
  Reason reason = Reason::kMalformed;
};

// A parser with the limits set.
void ApplyLimits(const ServerLimits& limits, RequestParser* parser);

// The answer to a parse error `ec` (header or body phase), or nullopt when
// there is nothing to answer (the client closed or reset).
std::optional<Refusal> RefusalFor(const boost::system::error_code& ec, const ServerLimits& limits);

// The checks once the header is in (field count, target length): nullopt
// if it passes.
std::optional<Refusal> CheckHead(const RequestMessage& head, const ServerLimits& limits);

// The Request of a whole message (consumed); a Refusal if its target's
// escapes are malformed.
std::optional<Refusal> BuildRequest(RequestMessage&& msg, const std::string& remote_addr,
                                    uint64_t connection, Request* out);

// `s` with ASCII letters lowered (header names and tokens compare this way).
std::string AsciiLower(std::string_view s);

// Every rule over one request's bytes in memory.
struct ParsedBytes {
  enum class Kind : uint8_t { kNeedMore, kRequest, kRefused, kClosed };
  Kind kind = Kind::kNeedMore;
  Request request;   // kRequest
  Refusal refusal;   // kRefused
  size_t consumed = 0;
};
ParsedBytes ParseRequestBytes(std::string_view bytes, const ServerLimits& limits);

}  // namespace kvrelay::http
