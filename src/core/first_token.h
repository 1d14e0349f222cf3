// first_token.h — the producer's first token, carried to the consumer.
//
// Why: P computes the first output token anyway (its prefill's last step),
// and D would compute the very same token from the KV it just loaded. P
// hands it over with the KV: the Ready names it, every ok answer to a pull
// carries it, and D emits it as soon as every producer rank has answered,
// without a step on the loaded KV (SGLang hands the first token over the
// same way; vLLM's D recomputes the last prompt token instead). D's next
// step reads the whole loaded KV, so KV that arrived wrong still changes the
// output from the second token on.
//
// The token is an optimisation, never a promise: a rank that does not know
// it (an answer repeated from memory, read mode) sends kNoFirstToken, and D
// uses a token only if every ok answer of every rank named the same one.
#pragma once

#include <cstdint>

namespace kvrelay {

inline constexpr uint32_t kNoFirstToken = UINT32_MAX;

// Folds one more ok answer's token into what `tokens_seen` answers agreed
// on: the common token, or kNoFirstToken once any two differ or any is
// missing. `agreed` starts at anything; `tokens_seen` counts the answers.
inline uint32_t AgreeFirstToken(uint32_t agreed, uint32_t tokens_seen, uint32_t token) {
  if (tokens_seen == 0) return token;
  return agreed == token ? agreed : kNoFirstToken;
}

}  // namespace kvrelay
