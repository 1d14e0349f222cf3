// sampling.cc — greedy and seeded temperature sampling.
#include "engine/sampling.h"

#include <cmath>

#include "base/check.h"
#include "base/prng.h"

namespace kvrelay::engine {
namespace {

// The softmax's weights relative to the best logit (no overflow), in
// double, summed in a fixed order (ascending ids), and the draw's point in
// [0, total) from a generator seeded by (seed, position) alone.
struct Draw {
  size_t best = 0;
  double top = 0, inv_t = 0, total = 0, u = 0;
  double Weight(float logit) const { return std::exp((static_cast<double>(logit) - top) * inv_t); }
};

size_t Best(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

Draw DrawFor(std::span<const float> logits, const Sampling& sampling, uint32_t position) {
  Draw d;
  d.best = Best(logits);
  d.inv_t = 1.0 / static_cast<double>(sampling.temperature);
  d.top = logits[d.best];
  for (const float l : logits) d.total += d.Weight(l);
  Prng prng(Mix64(sampling.seed ^ Mix64(uint64_t{position} + 0x9e3779b97f4a7c15ULL)));
  // 53 random bits → [0, 1).
  d.u = static_cast<double>(prng.Next64() >> 11) * 0x1.0p-53 * d.total;
  return d;
}

}  // namespace

Token SampleToken(std::span<const float> logits, const Sampling& sampling, uint32_t position) {
  KV_CHECK(!logits.empty());
  if (!(sampling.temperature > 0.0f)) return static_cast<Token>(Best(logits));
  const Draw d = DrawFor(logits, sampling, position);
  double acc = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    acc += d.Weight(logits[i]);
    if (d.u < acc) return static_cast<Token>(i);
  }
  return static_cast<Token>(d.best);  // u at the very top of the sum's rounding
}

bool WithinDrawMargin(std::span<const float> logits, const Sampling& sampling, uint32_t position,
                      Token other, double margin) {
  KV_CHECK(!logits.empty());
  if (other >= logits.size()) return false;
  if (!(sampling.temperature > 0.0f)) {
    return static_cast<double>(logits[other]) >=
           static_cast<double>(logits[Best(logits)]) - margin;
  }
  const Draw d = DrawFor(logits, sampling, position);
  double before = 0;
  for (size_t i = 0; i < other; ++i) before += d.Weight(logits[i]);
  const double after = before + d.Weight(logits[other]);
  const double slack = margin * d.total;
  return d.u >= before - slack && d.u < after + slack;
}

}  // namespace kvrelay::engine
