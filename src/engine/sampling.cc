// sampling.cc — greedy and seeded temperature sampling.
#include "engine/sampling.h"

#include <cmath>

#include "base/check.h"
#include "base/prng.h"

namespace kvrelay::engine {

Token SampleToken(std::span<const float> logits, const Sampling& sampling, uint32_t position) {
  KV_CHECK(!logits.empty());
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (!(sampling.temperature > 0.0f)) return static_cast<Token>(best);
  // Weights relative to the best logit (no overflow), in double: the draw
  // depends on the sum's order, which is fixed (ascending ids).
  const double inv_t = 1.0 / static_cast<double>(sampling.temperature);
  const double top = logits[best];
  double total = 0;
  for (const float l : logits) total += std::exp((static_cast<double>(l) - top) * inv_t);
  Prng prng(Mix64(sampling.seed ^ Mix64(uint64_t{position} + 0x9e3779b97f4a7c15ULL)));
  // 53 random bits → [0, 1).
  const double u = static_cast<double>(prng.Next64() >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    acc += std::exp((static_cast<double>(logits[i]) - top) * inv_t);
    if (u < acc) return static_cast<Token>(i);
  }
  return static_cast<Token>(best);  // u at the very top of the sum's rounding
}

}  // namespace kvrelay::engine
