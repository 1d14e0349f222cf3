#include "server/json_body.h"

#include <cstdint>
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

std::string JsonTypeName(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a non-integer number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::binary:
    case json::value_t::discarded: break;
  }
  return "an unsupported value";
}

const nlohmann::json* Field(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Status TypeError(const std::string& field, std::string_view expected, const nlohmann::json& got) {
  return InvalidArgumentError(field + " must be " + std::string(expected) + " (got " +
                              JsonTypeName(got) + ")");
}

std::string QuoteForError(std::string_view s) {
  constexpr size_t kMax = 64;
  if (s.size() <= kMax) return "\"" + std::string(s) + "\"";
  size_t n = kMax;
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;
  return "\"" + std::string(s.substr(0, n)) + "...\"";
}

}  // namespace kvrelay::server
