#include "bench/ttft_compare.h"

#include <cmath>
#include <string>

#include "bench/percentile.h"

namespace kvrelay {

namespace {
Status CheckTimes(const std::vector<double>& v, const char* name, bool may_be_empty) {
  if (v.empty() && !may_be_empty) {
    return InvalidArgumentError(std::string("no ") + name + " samples");
  }
  for (double x : v) {
    if (!std::isfinite(x) || x < 0) {
      return InvalidArgumentError(std::string("a ") + name + " sample is negative or not finite");
    }
  }
  return Status::Ok();
}
}  // namespace

Result<TtftComparison> CompareTtft(const TtftSamples& s, double target_ratio,
                                   double stream_goal) {
  if (!(target_ratio > 0)) return InvalidArgumentError("the target ratio must be > 0");
  if (s.kv_bytes == 0) return InvalidArgumentError("the prompt's KV is 0 bytes");
  if (Status st = CheckTimes(s.plain_s, "plain TTFT", false); !st.ok()) return st;
  if (Status st = CheckTimes(s.pd_s, "P/D TTFT", false); !st.ok()) return st;
  if (Status st = CheckTimes(s.transfer_s, "transfer", false); !st.ok()) return st;
  if (Status st = CheckTimes(s.pd_pull_s, "P/D pull", true); !st.ok()) return st;
  if (Status st = CheckTimes(s.answer_to_token_s, "answer→token", true); !st.ok()) return st;
  if (Status st = CheckTimes(s.streamed_s, "streamed P/D TTFT", true); !st.ok()) return st;
  if (!s.streamed_s.empty() && (s.chunk_tokens == 0 || !(stream_goal > 0))) {
    return InvalidArgumentError("streamed samples need the chunk's tokens and a goal > 0");
  }
  TtftComparison c;
  c.prompt_tokens = s.prompt_tokens;
  c.kv_bytes = s.kv_bytes;
  c.plain_n = s.plain_s.size();
  c.pd_n = s.pd_s.size();
  c.transfer_n = s.transfer_s.size();
  c.plain_p50_s = Percentile(s.plain_s, 0.5);
  c.plain_p90_s = Percentile(s.plain_s, 0.9);
  c.pd_p50_s = Percentile(s.pd_s, 0.5);
  c.pd_p90_s = Percentile(s.pd_s, 0.9);
  c.difference_s = c.pd_p50_s - c.plain_p50_s;
  c.transfer_p50_s = Percentile(s.transfer_s, 0.5);
  if (!(c.transfer_p50_s > 0)) {
    return InvalidArgumentError("the transfer time's median is 0: no bandwidth to predict with");
  }
  c.bandwidth_gbps = static_cast<double>(s.kv_bytes) / c.transfer_p50_s / 1e9;
  c.predicted_s = static_cast<double>(s.kv_bytes) / (c.bandwidth_gbps * 1e9);
  c.ratio = c.difference_s / c.predicted_s;
  c.target_ratio = target_ratio;
  c.met = c.ratio <= target_ratio;
  c.pd_pull_p50_s = Percentile(s.pd_pull_s, 0.5);
  c.answer_to_token_p50_s = Percentile(s.answer_to_token_s, 0.5);
  if (s.answer_to_token_s.size() == s.pd_s.size()) {
    std::vector<double> until_answer;
    for (size_t i = 0; i < s.pd_s.size(); ++i) {
      until_answer.push_back(s.pd_s[i] - s.answer_to_token_s[i]);
    }
    c.until_answer_difference_s = Percentile(until_answer, 0.5) - c.plain_p50_s;
  }
  if (!s.streamed_s.empty()) {
    c.streamed_n = s.streamed_s.size();
    c.chunks = (s.prompt_tokens + s.chunk_tokens - 1) / s.chunk_tokens;
    c.streamed_p50_s = Percentile(s.streamed_s, 0.5);
    c.streamed_p90_s = Percentile(s.streamed_s, 0.9);
    c.streamed_difference_s = c.streamed_p50_s - c.plain_p50_s;
    c.streamed_ratio = c.streamed_difference_s / c.predicted_s;
    c.over_whole = c.difference_s > 0 ? c.streamed_difference_s / c.difference_s : -1;
    const uint32_t last = s.prompt_tokens - (c.chunks - 1) * s.chunk_tokens;
    c.last_chunk_predicted_s = c.predicted_s * last / s.prompt_tokens;
    c.stream_goal = stream_goal;
    c.stream_goal_met = c.chunks > 1 && (c.streamed_difference_s <= 0 ||
                                         (c.over_whole >= 0 && c.over_whole <= stream_goal));
  }
  return c;
}

}  // namespace kvrelay
