// json_body.h — ParseJsonBody: a request body read as one JSON value, with
// the errors a client can act on.
//
// Why one function: the engine's completions and admin calls and the
// router's completions all parse client bodies, and each must refuse the
// same things the same way. nlohmann's parser stops at a NUL byte and takes
// what came before it as the whole text, so a body with a NUL is refused
// here rather than half-read; its exception texts carry an internal tag
// ("[json.exception.parse_error.101]") that is cut.
//
// JsonTypeName and QuoteForError word the other half of such errors: what a
// client sent, as the engine's and the router's messages name it.
//
// Thread safety: pure functions; any thread.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace kvrelay::server {

// kInvalidArgument: "body is not valid JSON: at line 1, column 7: ..." (at
// most 200 bytes of nlohmann's text, without its tag), or "body is not valid
// JSON: a NUL byte at offset N".
Result<nlohmann::json> ParseJsonBody(std::string_view body);

// What a value is, for "must be ... (got an array)": "null", "a boolean",
// "an integer", "a non-integer number", "a string", "an array", "an object".
std::string JsonTypeName(const nlohmann::json& j);

// The member `key` of `obj`, or nullptr when absent or null (clients send
// null for "not set").
const nlohmann::json* Field(const nlohmann::json& obj, const char* key);

// kInvalidArgument "FIELD must be EXPECTED (got <JsonTypeName(got)>)".
Status TypeError(const std::string& field, std::string_view expected, const nlohmann::json& got);

// `s` quoted for an error message, cut to 64 bytes at a UTF-8 boundary
// ("\"abc...\"" when cut).
std::string QuoteForError(std::string_view s);

}  // namespace kvrelay::server
