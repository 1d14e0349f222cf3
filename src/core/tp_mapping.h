// tp_mapping.h — which P ranks a D rank pulls from, and how many D ranks
// pull from a P rank, for P tp=p and D tp=d (each a power of two here).
//
// Each rank owns kv_heads/tp of the heads. A D rank needs every P rank that
// holds any of its heads: p >= d → p/d P ranks; p < d → one P rank, shared
// by d/p D ranks. (With fewer KV heads than ranks heads replicate; kvrelay
// treats that like p < d.)
#pragma once

#include <cstdint>
#include <vector>

#include "base/check.h"

namespace kvrelay {

inline std::vector<uint32_t> ProducerRanksFor(uint32_t d_rank, uint32_t d_tp,
                                              uint32_t p_tp) {
  KV_CHECK_GT(d_tp, 0u);
  KV_CHECK_GT(p_tp, 0u);
  KV_CHECK_LT(d_rank, d_tp);
  std::vector<uint32_t> ranks;
  if (p_tp >= d_tp) {
    KV_CHECK_EQ(p_tp % d_tp, 0u);
    const uint32_t per = p_tp / d_tp;
    for (uint32_t r = d_rank * per; r < (d_rank + 1) * per; ++r) ranks.push_back(r);
  } else {
    KV_CHECK_EQ(d_tp % p_tp, 0u);
    ranks.push_back(d_rank / (d_tp / p_tp));
  }
  return ranks;
}

// How many D ranks pull from each P rank (the send table's `need`).
inline uint32_t ConsumersPerProducer(uint32_t p_tp, uint32_t d_tp) {
  KV_CHECK_GT(d_tp, 0u);
  KV_CHECK_GT(p_tp, 0u);
  return d_tp > p_tp ? d_tp / p_tp : 1;
}

}  // namespace kvrelay
