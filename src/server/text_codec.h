// text_codec.h — TextCodec: how a server turns a prompt's text into token
// ids and output ids back into text.
//
// Why an interface: the emulated model's toy tokenizer (tokenizer.h) is not
// a real one; a llama.cpp engine serves its model's own vocabulary
// (the CLI adapts llama::LlamaTokenizer). Parsing and responses take a
// codec; none (null) means the toy tokenizer over the limits' vocabulary.
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

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<engine::Token> Encode(std::string_view text) const = 0;
  virtual std::string Decode(std::span<const engine::Token> tokens) const = 0;
};

// `codec`'s, or the toy tokenizer's (over `vocab`) when codec is null.
std::vector<engine::Token> EncodeText(const TextCodec* codec, std::string_view text,
                                      uint32_t vocab);
std::string DecodeText(const TextCodec* codec, std::span<const engine::Token> tokens);

}  // namespace kvrelay::server
