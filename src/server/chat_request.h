// chat_request.h — ParseChatRequest: the body of POST /v1/chat/completions,
// checked and turned into the same CompletionRequest a completion gives.
//
// Why: most OpenAI clients (chat UIs, agents, the SDKs' chat API) send
// chats, not prompts; llama.cpp's own server speaks chat first. A chat is a
// completion whose prompt is its messages laid out by the model's chat
// template (TextCodec::EncodeChat), so after the messages are read every
// rule of completion_request.h applies unchanged — on P, on D and on a
// plain engine alike, which is what makes P and D agree on the prompt.
//
// Accepted on top of a completion's fields:
//   messages               required; 1..kMaxChatMessages objects, each with
//                          "role" (system, developer, user, assistant or
//                          tool) and "content": a string, or an array of
//                          {"type": "text", "text": ...} parts (joined);
//                          "name" may be sent and is ignored
//   max_completion_tokens  OpenAI's newer name for max_tokens; wins over it
//   logprobs               false or null (true is refused)
// Refused with a message saying so: "prompt" (a completion's field), a
// non-text content part, tools/tool_choice/functions/function_call, a
// response_format other than {"type": "text"}, top_logprobs.
//
// Errors: as ParseCompletionRequest's (kInvalidArgument → 400, kOutOfRange
// → 400, kResourceExhausted → 413).
//
// Thread safety: pure functions; any thread.
#pragma once

#include <cstddef>
#include <string_view>

#include "base/result.h"
#include "server/completion_request.h"

namespace kvrelay::server {

inline constexpr size_t kMaxChatMessages = 1024;

Result<CompletionRequest> ParseChatRequest(std::string_view body, const ParseLimits& limits);

}  // namespace kvrelay::server
