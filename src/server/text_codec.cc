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

}  // namespace kvrelay::server
