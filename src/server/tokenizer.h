// tokenizer.h — Tokenize/Detokenize: the emulated model's toy tokenizer.
//
// Why: the emulated model (engine/model.h) works on token ids and never
// looks at text, but HTTP clients send text. This tokenizer turns text into
// ids deterministically, so that the same prompt gives the same ids on every
// engine (P and D must agree, or the pull is refused as a foreign prompt)
// and on every run. It is not a real tokenizer and does not try to be
// invertible: Detokenize renders ids, it does not recover words.
//
//   Tokenize:   split on ASCII whitespace (space, \t, \n, \v, \f, \r);
//               each word w → FNV-1a-64(w) % (vocab - 1) + 1, so 0 is never
//               produced (id 0 stays free, as a pad/BOS would be).
//   Detokenize: " t<id>" per token, e.g. {17, 4} → " t17 t4".
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/byte_codec.h"   // Fnv1a64
#include "engine/model.h"

namespace kvrelay::server {

// REQUIRES: vocab >= 2. Every id is in [1, vocab). Empty or all-whitespace
// text gives no tokens.
std::vector<engine::Token> Tokenize(std::string_view text, uint32_t vocab);

// " t<id>" per token; "" for no tokens.
std::string Detokenize(std::span<const engine::Token> tokens);

}  // namespace kvrelay::server
