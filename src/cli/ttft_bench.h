// ttft_bench.h — `kvrelay bench ttft`: what the P/D hand-off adds to time to
// first token, against a plain engine, in one run (issue 8's end-to-end
// target: P/D TTFT − plain TTFT ≤ 1.25 × the transfer time the measured
// bandwidth predicts, for prompts of 1K and 8K tokens).
//
// It starts, as `kvrelay serve` children on loopback, a plain engine (no
// transfer), a P, a D and the router over P and D, all with the same model
// shape, pool, token budget and modelled step time (with --stream-chunks,
// also a streaming P behind a router of its own over the same D). For each
// prompt length it sends N fresh random prompts one at a time (every engine
// idle before each request, nothing else running), each on every path:
// streamed to the plain engine and through the router(s), in rotating
// order; TTFT is
// request sent → first streamed token, at the client. Between them, with a
// fresh prompt of the same length, it sends a P leg and, once P answered,
// the D leg (as `bench transfer` does) and reads D's pull→answer time: the
// bandwidth of this KV size on this transport, in the same run.
// CompareTtft (src/bench/ttft_compare.h) turns the samples into figures.
//
// Every P/D request must have been served by a transfer: D's pull log must
// show exactly one answer `ok` for it with the prompt's blocks, and every
// output is checked against the model; otherwise the run fails (a D that
// recomputed would measure something else).
//
// --engine llama: llama.cpp engines (serve --engine llama) on one GGUF,
// made in the logs folder unless --model names one. The P/D output of every
// sample must equal the plain engine's for the same prompt token for token
// (both are served alone), and each length's first plain output equals
// llama.cpp alone's (LlamaChecker). The model's export (P) and import (D)
// copies are read from the engines' /metrics and reported per token.
//
// Threading: the calling thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "llama/model_maker.h"

namespace kvrelay::cli {

struct TtftBenchOptions {
  std::string transport = "shm";
  std::string shape = "8b";
  std::vector<uint32_t> prompt_tokens = {1024, 8192};
  uint32_t samples = 20;                 // prompts per length
  uint32_t warmup = 2;                   // untimed largest prompts per path
  double step_base_us = 500;             // serve's defaults
  double step_per_token_us = 20;
  uint32_t max_batch_tokens = 8192;      // serve's default for 8b
  uint32_t pool_blocks = 0;              // 0: the largest prompt's blocks + 16
  double target_ratio = 1.25;
  uint32_t tcp_streams = 4;
  uint32_t kv_read_threads = 2;          // every engine's --kv-read-threads (plain too)
  bool compute_first_token = false;      // the engines' --compute-first-token
  // A second P with --stream-chunks (its prefill hands each finished
  // chunk of max_batch_tokens to D while it goes on), behind a router of
  // its own over the same D: every sample's prompt also goes through it,
  // so streamed and whole are compared in one run. The goal (issue 32):
  // streamed P/D − plain ≤ stream_goal × (whole P/D − plain).
  bool stream_chunks = false;
  double stream_goal = 0.25;
  std::string ucx_tls;
  double request_timeout_s = 120;
  std::string logs = "/tmp/kvrelay-bench-ttft";
  std::string json_path;                 // "-" for stdout
  uint64_t seed = 1;
  // --engine llama (see above). `make`: the model made without --model (its
  // context grows to hold the largest prompt). --model-shape and the step
  // times are the emulated model's and do not apply.
  // The decode-under-prefill phase (cli/decode_under_prefill.h), after the
  // TTFT samples: this many seconds on the plain engine, then as many
  // through the router, with `decoders` short requests of `decode_tokens`
  // tokens while prompts of the largest length prefill. 0: skipped.
  double decode_under_prefill_s = 0;
  uint32_t decoders = 4;
  uint32_t decode_tokens = 64;
  std::string engine = "emulated";
  std::string model;
  uint32_t threads = 1;
  llama::MakeModelOptions make;
};

// Runs the bench, prints progress and the table to stdout. Errors: bad
// options (kInvalidArgument), the cluster could not run, a request failed
// or was not served by a transfer. A target missed is not an error; it is
// printed as [MISSED].
Status RunTtftBench(const TtftBenchOptions& options);

}  // namespace kvrelay::cli
