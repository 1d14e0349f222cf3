// http_request.h — Request: one HTTP/1.1 request as the server hands it to a
// handler, fully read and checked against the server's limits.
//
// Why a type of our own: handlers (the engine's and the router's) must not
// see the HTTP library, so that its headers stay inside src/http/*.cc (they
// are the heaviest the project compiles) and so a handler reads the same
// fields whichever way the request was framed (Content-Length or chunked).
//
// Ownership: a value; the handler owns its copy. Thread safety: a value type.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvrelay::http {

struct Request {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: path and query ("/pause?mode=wait")
  std::string path;     // the target up to '?', percent-decoded
  // The query's parameters, percent-decoded ('+' is a space); a key may come
  // more than once.
  std::multimap<std::string, std::string> query;
  // Header fields in arrival order; names lower-cased.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;          // the whole body, de-chunked
  std::string remote_addr;   // the peer's IP address ("127.0.0.1")
  uint64_t connection = 0;   // the server's id of the connection (logs)

  // The first field named `name` (lower case), or "".
  std::string_view Header(std::string_view name) const;
  bool HasQuery(std::string_view key) const { return query.count(std::string(key)) != 0; }
  // The first value of `key`, or "".
  std::string QueryValue(std::string_view key) const;
};

// Splits a request target into its path and query parameters, both
// percent-decoded. False (and nothing written) if an escape is malformed
// ("%G1", a lone "%") or the path does not start with '/'.
bool SplitTarget(std::string_view target, std::string* path,
                 std::multimap<std::string, std::string>* query);

}  // namespace kvrelay::http
