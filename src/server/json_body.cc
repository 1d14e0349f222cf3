#include "server/json_body.h"

#include <string>

namespace kvrelay::server {

using nlohmann::json;

namespace {

// "at line 1, column 7: syntax error while parsing ..." from nlohmann's
// "[json.exception.parse_error.101] parse error at line 1, ...", or
// "number overflow parsing '1e400'" from its out_of_range.406.
std::string Where(const json::exception& e) {
  std::string what = e.what();
  if (const size_t close = what.find("] "); what.starts_with("[json.exception.") &&
                                             close != std::string::npos) {
    what = what.substr(close + 2);
  }
  if (what.starts_with("parse error ")) what = what.substr(12);
  constexpr size_t kMax = 200;
  if (what.size() > kMax) {
    size_t n = kMax;
    while (n > 0 && (static_cast<uint8_t>(what[n]) & 0xC0) == 0x80) --n;
    what = what.substr(0, n) + "...";
  }
  return what;
}

}  // namespace

Result<json> ParseJsonBody(std::string_view body) {
  if (const size_t nul = body.find('\0'); nul != std::string_view::npos) {
    return InvalidArgumentError("body is not valid JSON: a NUL byte at offset " +
                                std::to_string(nul));
  }
  try {
    return json::parse(body);
  } catch (const json::exception& e) {   // parse_error, or out_of_range for 1e400
    return InvalidArgumentError("body is not valid JSON: " + Where(e));
  }
}

}  // namespace kvrelay::server
