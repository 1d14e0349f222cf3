// sampling.h — SampleToken: the next token from a model's logits, greedy or
// seeded temperature sampling.
//
// Why here, pure: a request's tokens must not depend on what else shares
// its batches, and a test's reference loop must draw exactly what the
// engine draws. So a draw uses nothing but the logits, the request's
// Sampling (compute_model.h) and the token's position: the generator is
// seeded from (seed, position), never carried between steps.
//
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <span>

#include "engine/compute_model.h"

namespace kvrelay::engine {

// temperature <= 0: the highest logit (ties to the lower id). Otherwise one
// draw from softmax(logits / temperature). REQUIRES: logits non-empty.
Token SampleToken(std::span<const float> logits, const Sampling& sampling, uint32_t position);

// True if `other` is what SampleToken draws when `logits` move a little:
// greedy, its logit is within `margin` of the top one; sampled, its slice
// of the cumulative sum lies within `margin` (a fraction of the total) of
// the draw's point. What a near tie is when two computations of the same
// logits differ in their last bits (the sums' order): a checker may accept
// such a token and must refuse any other.
bool WithinDrawMargin(std::span<const float> logits, const Sampling& sampling, uint32_t position,
                      Token other, double margin);

}  // namespace kvrelay::engine
