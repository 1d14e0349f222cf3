#include "server/tokenizer.h"

#include "base/check.h"

namespace kvrelay::server {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

std::vector<engine::Token> Tokenize(std::string_view text, uint32_t vocab) {
  KV_CHECK_GE(vocab, 2u);
  std::vector<engine::Token> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && IsAsciiSpace(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !IsAsciiSpace(text[i])) ++i;
    if (i > start) {
      const uint64_t h = Fnv1a64(text.substr(start, i - start));
      out.push_back(static_cast<engine::Token>(h % (vocab - 1) + 1));
    }
  }
  return out;
}

std::string Detokenize(std::span<const engine::Token> tokens) {
  std::string out;
  out.reserve(tokens.size() * 7);
  for (engine::Token t : tokens) {
    out += " t";
    out += std::to_string(t);
  }
  return out;
}

}  // namespace kvrelay::server
