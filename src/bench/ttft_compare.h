// ttft_compare.h — CompareTtft: the figures `kvrelay bench ttft` prints for
// one prompt length, from its raw samples, and the verdict against issue
// 8's end-to-end target:
//
//   TTFT of a P/D request − TTFT of the same prompt on a plain engine
//     ≤ 1.25 × the transfer time the measured bandwidth predicts.
//
// Definitions (the same in --help and docs/performance.md):
//   - plain TTFT, P/D TTFT: client-side, request sent → first streamed
//     token, p50 over the samples (the same prompts on both paths);
//   - difference = P/D p50 − plain p50. P's prefill ran on P, so what is
//     left is the hand-off: the router and its two legs, D's admission
//     and pull, the wait for P's Ready, the transfer, D's step that takes
//     the loaded KV and emits the token, and the relay back;
//   - bandwidth = KV bytes / p50 of D's pull→answer time for transfers of
//     exactly this prompt's KV, each pulled once P had finished (so the
//     time is the pull protocol plus the bytes on the wire), measured in
//     the same run on the same engines — `bench transfer`'s definition;
//   - predicted transfer time = KV bytes / bandwidth (so it equals that
//     p50 pull→answer time);
//   - ratio = difference / predicted; met when ratio ≤ target.
//
// With a streaming P beside the whole one (`bench ttft --stream-chunks`,
// issue 32), the same prompts also go through its router:
//   - streamed difference = streamed P/D p50 − plain p50;
//   - over whole = streamed difference / difference: the share of the
//     whole hand-off's overhead that streaming leaves (the goal: ≤ 0.25 at
//     8K tokens); −1 when the difference is ≤ 0 (nothing to share);
//   - last chunk predicted = predicted × the last chunk's tokens / the
//     prompt's: the part of the transfer no overlap can hide.
//
// Thread safety: pure functions and value types; any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "base/result.h"

namespace kvrelay {

struct TtftSamples {
  uint32_t prompt_tokens = 0;
  uint64_t kv_bytes = 0;                   // the prompt's KV, as D pulled it
  std::vector<double> plain_s;             // TTFT on the plain engine
  std::vector<double> pd_s;                // TTFT through the router (P/D)
  std::vector<double> transfer_s;          // pull→answer, P done first
  // Breakdown of the P/D requests themselves (optional; 0 if empty):
  std::vector<double> pd_pull_s;           // D's pull→answer (includes the wait for P)
  std::vector<double> answer_to_token_s;   // D's answer → the client's first token
  // The streaming P's path (optional; the fields below stay 0 if empty):
  uint32_t chunk_tokens = 0;               // its prefill chunk (the token budget)
  std::vector<double> streamed_s;          // TTFT through the streaming P's router
};

struct TtftComparison {
  uint32_t prompt_tokens = 0;
  uint64_t kv_bytes = 0;
  size_t plain_n = 0, pd_n = 0, transfer_n = 0;
  double plain_p50_s = 0, plain_p90_s = 0;
  double pd_p50_s = 0, pd_p90_s = 0;
  double difference_s = 0;                 // pd_p50_s − plain_p50_s
  double transfer_p50_s = 0;
  double bandwidth_gbps = 0;               // kv_bytes / transfer_p50_s / 1e9
  double predicted_s = 0;                  // kv_bytes / bandwidth
  double ratio = 0;                        // difference_s / predicted_s
  double target_ratio = 0;
  bool met = false;                        // ratio ≤ target_ratio
  double pd_pull_p50_s = 0, answer_to_token_p50_s = 0;
  // A breakdown, not the target: p50 of (P/D TTFT − D's answer → token),
  // i.e. request sent → D has the KV, less plain_p50_s. 0 unless
  // answer_to_token_s pairs with pd_s.
  double until_answer_difference_s = 0;
  // The streaming P's path (see the top); 0 without streamed samples.
  size_t streamed_n = 0;
  uint32_t chunks = 0;                     // the prompt's prefill chunks
  double streamed_p50_s = 0, streamed_p90_s = 0;
  double streamed_difference_s = 0;        // streamed_p50_s − plain_p50_s
  double streamed_ratio = 0;               // streamed_difference_s / predicted_s
  double over_whole = 0;                   // streamed_difference_s / difference_s, or −1
  double last_chunk_predicted_s = 0;
  double stream_goal = 0;
  // over_whole in [0 or below, stream_goal] — or the streamed difference
  // ≤ 0 (nothing left to hide); false with one chunk (nothing to stream).
  bool stream_goal_met = false;
};

// kInvalidArgument if a sample set is empty, kv_bytes is 0, a time is
// negative or not finite, target_ratio ≤ 0, or streamed samples come
// without chunk_tokens or stream_goal ≤ 0.
Result<TtftComparison> CompareTtft(const TtftSamples& samples, double target_ratio,
                                   double stream_goal = 0.25);

}  // namespace kvrelay
