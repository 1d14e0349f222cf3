// text_codec.h — TextCodec: how a server turns a prompt's text into token
// ids and output ids back into text.
//
// Why an interface: the emulated model's toy tokenizer (tokenizer.h) is not
// a real one; a llama.cpp engine serves its model's own vocabulary
// (the CLI adapts llama::LlamaTokenizer). Parsing and responses take a
// codec; none (null) means the toy tokenizer over the limits' vocabulary.
//
// A chat (POST /v1/chat/completions) becomes a prompt through EncodeChat:
// the model's chat template if it has one, else the built-in layout
// (ChatPromptText), then the prompt's ids.
//
// Thread safety: implementations are immutable and called from any HTTP
// thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model.h"

namespace kvrelay::server {

// One message of a chat: its role ("system", "user", "assistant", ...) and
// its text.
struct ChatMessage {
  std::string role;
  std::string content;
};

// The built-in chat layout (ChatML's): "<|im_start|>ROLE\nCONTENT<|im_end|>\n"
// per message, then "<|im_start|>assistant\n", where the answer starts.
std::string ChatPromptText(std::span<const ChatMessage> messages);

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<engine::Token> Encode(std::string_view text) const = 0;
  virtual std::string Decode(std::span<const engine::Token> tokens) const = 0;
  // The prompt's ids for a chat, ending where the assistant's answer starts.
  // This one: Encode(ChatPromptText(messages)).
  virtual std::vector<engine::Token> EncodeChat(std::span<const ChatMessage> messages) const;
};

// `codec`'s, or the toy tokenizer's (over `vocab`) when codec is null.
std::vector<engine::Token> EncodeText(const TextCodec* codec, std::string_view text,
                                      uint32_t vocab);
std::string DecodeText(const TextCodec* codec, std::span<const engine::Token> tokens);
// `codec`'s EncodeChat, or the toy tokenizer's ids of ChatPromptText.
std::vector<engine::Token> EncodeChatText(const TextCodec* codec,
                                          std::span<const ChatMessage> messages, uint32_t vocab);

}  // namespace kvrelay::server
