#include "http/request_rules.h"

#include <algorithm>
#include <cctype>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>

namespace kvrelay::http {

namespace bhttp = boost::beast::http;
using boost::system::error_code;

namespace {

Refusal Refuse(int status, std::string message, Refusal::Reason reason) {
  return Refusal{status, std::move(message), reason};
}

}  // namespace

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

void ApplyLimits(const ServerLimits& limits, RequestParser* parser) {
  parser->header_limit(
      static_cast<uint32_t>(std::min<size_t>(limits.max_header_bytes, UINT32_MAX)));
  parser->body_limit(limits.max_body_bytes);
}

std::optional<Refusal> RefusalFor(const error_code& ec, const ServerLimits& limits) {
  if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
      ec.category() != bhttp::make_error_code(bhttp::error::bad_method).category()) {
    return std::nullopt;   // closed, reset, or a socket error: nothing to answer
  }
  if (ec == bhttp::error::header_limit) {
    return Refuse(431, "the request header is longer than the limit of " +
                           std::to_string(limits.max_header_bytes) + " bytes",
                  Refusal::Reason::kHeaderBytes);
  }
  if (ec == bhttp::error::body_limit) {
    return Refuse(413, "request body is longer than the limit of " +
                           std::to_string(limits.max_body_bytes) + " bytes (--max-body-bytes)",
                  Refusal::Reason::kBodyBytes);
  }
  return Refuse(400, "malformed request: " + ec.message(), Refusal::Reason::kMalformed);
}

std::optional<Refusal> CheckHead(const RequestMessage& head, const ServerLimits& limits) {
  const size_t fields = static_cast<size_t>(std::distance(head.begin(), head.end()));
  if (fields > limits.max_header_count) {
    return Refuse(431, "the request has " + std::to_string(fields) +
                           " header fields; the limit is " +
                           std::to_string(limits.max_header_count),
                  Refusal::Reason::kHeaderBytes);
  }
  if (head.target().size() > limits.max_target_bytes) {
    return Refuse(414, "the request target is longer than the limit of " +
                           std::to_string(limits.max_target_bytes) + " bytes",
                  Refusal::Reason::kHeaderBytes);
  }
  return std::nullopt;
}

std::optional<Refusal> BuildRequest(RequestMessage&& msg, const std::string& remote_addr,
                                    uint64_t connection, Request* out) {
  Request req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  if (!SplitTarget(req.target, &req.path, &req.query)) {
    return Refuse(400, "malformed request target: " + req.target.substr(0, 200),
                  Refusal::Reason::kMalformed);
  }
  for (const auto& f : msg) {
    req.headers.emplace_back(AsciiLower(f.name_string()), std::string(f.value()));
  }
  req.body = std::move(msg.body());
  req.remote_addr = remote_addr;
  req.connection = connection;
  *out = std::move(req);
  return std::nullopt;
}

ParsedBytes ParseRequestBytes(std::string_view bytes, const ServerLimits& limits) {
  ParsedBytes out;
  RequestParser parser;
  ApplyLimits(limits, &parser);
  parser.eager(true);
  bool head_checked = false;
  while (!parser.is_done()) {
    error_code ec;
    const size_t n = parser.put(boost::asio::buffer(bytes.data() + out.consumed,
                                                    bytes.size() - out.consumed),
                                ec);
    out.consumed += n;
    if (ec == bhttp::error::need_more) {
      if (n == 0 || out.consumed == bytes.size()) return out;   // kNeedMore
      continue;
    }
    if (ec) {
      std::optional<Refusal> r = RefusalFor(ec, limits);
      out.kind = r ? ParsedBytes::Kind::kRefused : ParsedBytes::Kind::kClosed;
      if (r) out.refusal = std::move(*r);
      return out;
    }
    if (parser.is_header_done() && !head_checked) {
      head_checked = true;
      if (std::optional<Refusal> r = CheckHead(parser.get(), limits)) {
        out.kind = ParsedBytes::Kind::kRefused;
        out.refusal = std::move(*r);
        return out;
      }
    }
    if (n == 0 && !parser.is_done()) return out;   // no progress: needs more
  }
  if (std::optional<Refusal> r = BuildRequest(parser.release(), "fuzz", 0, &out.request)) {
    out.kind = ParsedBytes::Kind::kRefused;
    out.refusal = std::move(*r);
    return out;
  }
  out.kind = ParsedBytes::Kind::kRequest;
  return out;
}

}  // namespace kvrelay::http
