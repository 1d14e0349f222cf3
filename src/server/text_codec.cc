#include "server/text_codec.h"

#include "server/tokenizer.h"

namespace kvrelay::server {

std::vector<engine::Token> EncodeText(const TextCodec* codec, std::string_view text,
                                      uint32_t vocab) {
  return codec != nullptr ? codec->Encode(text) : Tokenize(text, vocab);
}

std::string DecodeText(const TextCodec* codec, std::span<const engine::Token> tokens) {
  return codec != nullptr ? codec->Decode(tokens) : Detokenize(tokens);
}

std::string ChatPromptText(std::span<const ChatMessage> messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  return out + "<|im_start|>assistant\n";
}

std::vector<engine::Token> TextCodec::EncodeChat(std::span<const ChatMessage> messages) const {
  return Encode(ChatPromptText(messages));
}

std::vector<engine::Token> EncodeChatText(const TextCodec* codec,
                                          std::span<const ChatMessage> messages, uint32_t vocab) {
  return codec != nullptr ? codec->EncodeChat(messages) : Tokenize(ChatPromptText(messages), vocab);
}

}  // namespace kvrelay::server
