// percentile.h — Percentile: the q-quantile of a sample, as the benches
// report it (`bench transfer`, `bench ttft`).
//
// Thread safety: a pure function; any thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvrelay {

// The q-quantile (0..1) of `v`, interpolated linearly between the two
// neighbouring order statistics; 0 for an empty sample.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  const double frac = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - frac) + v[i + 1] * frac : v[i];
}

}  // namespace kvrelay
