#include <cstdio>
#include <ctime>
#include <memory>
#include <string>

#include "bench/core_bench.h"
#include "bench/load_gen.h"
#include "cli/commands.h"
#include "cli/http_bench.h"
#include "cli/transfer_bench.h"
#include "cli/llama_checker.h"
#include "cli/llama_cluster.h"
#include "cli/llama_serving.h"
#include "llama/llama_model.h"
#include "cli/ttft_bench.h"
#include "runtime/auth_token.h"

namespace kvrelay::cli {

void RegisterBench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto opt = std::make_shared<CoreBenchOptions>();
  auto core_json = std::make_shared<std::string>();
  auto* core = bench->add_subcommand(
      "core",
      "Send-table and load-table inputs per second with few and many transfers in flight, "
      "and their ratios (the O(1) claim as a number); the simulator's schedules per second");
  core->add_option("--in-flight", opt->in_flight,
                   "Transfers held in flight, one measurement each")
      ->capture_default_str();
  core->add_option("--ops", opt->ops_per_round,
                   "Table inputs timed per round (the send table first runs " +
                       std::to_string(kSendWarmupHandoffs) +
                       " hand-offs untimed, so its remembered answers are full)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{4}, uint64_t{1} << 40));
  core->add_option("--rounds", opt->rounds, "Rounds; the best is kept")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  core->add_option("--seed", opt->seed, "Seed for transfer ids")->capture_default_str();
  core->add_option("--sim-seeds", opt->sim_seeds,
                   "Simulator seeds 1..N run in-process for schedules/s (0: skip)")
      ->capture_default_str();
  core->add_option("--json", *core_json, "also write the report as JSON to this file");
  core->add_flag("!--no-send", opt->send_table, "Skip the send table");
  core->add_flag("!--no-load", opt->load_table, "Skip the load table");
  core->callback([opt, core_json] {
    std::printf("kvrelay bench core: %llu inputs per round, best of %d, seed %llu\n",
                static_cast<unsigned long long>(opt->ops_per_round), opt->rounds,
                static_cast<unsigned long long>(opt->seed));
    std::fflush(stdout);
    const CoreBenchReport report = RunCoreBench(*opt);
    std::fputs(FormatCoreBench(report).c_str(), stdout);
    if (!core_json->empty()) {
      FILE* f = std::fopen(core_json->c_str(), "w");
      if (f == nullptr) {
        std::fprintf(stderr, "kvrelay: cannot write %s\n", core_json->c_str());
        SetExitCode(1);
        return;
      }
      const std::string j = CoreBenchJson(report, *opt);
      std::fwrite(j.data(), 1, j.size(), f);
      std::fclose(f);
    }
    if (report.sim.failed > 0) SetExitCode(1);
  });
  RegisterLoadOptions(bench);
  RegisterTransferBench(bench);
  RegisterTtftBench(bench);
  RegisterHttpBench(bench);
  RegisterLlamaBench(bench);
}

void RegisterHttpBench(CLI::App* bench) {
  auto o = std::make_shared<HttpBenchOptions>();
  auto* cmd = bench->add_subcommand(
      "http",
      "What many connections cost the HTTP servers: against the router of a local 1P1D "
      "cluster, then a plain engine, --idle connections held open that send nothing plus "
      "--streams concurrent streamed completions, while GET /health is probed every "
      "--probe-ms; reports its latency (and its baseline before the load, same run), the "
      "server's RSS and threads, and checks that nothing is left afterwards");
  cmd->add_option("--idle", o->idle, "idle connections per target")->capture_default_str();
  cmd->add_option("--streams", o->streams, "concurrent streamed completions per target")
      ->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "max_tokens of each stream")->capture_default_str();
  cmd->add_option("--probe-ms", o->probe_ms, "GET /health this often under load")
      ->capture_default_str();
  cmd->add_option("--p99-target-ms", o->p99_target_ms,
                  "target for GET /health p99 under load: [MET] or [MISSED], not a failure")
      ->capture_default_str();
  cmd->add_option("--timeout-s", o->timeout_s, "bound on each target's streams")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed for the prompts")->capture_default_str();
  cmd->add_option("--logs", o->logs, "folder for the processes' logs (default /tmp/kvrelay-http-<time>)");
  cmd->add_option("--json", o->json_path, "also write the report as JSON to this file");
  cmd->callback([o] {
    HttpBenchOptions run = *o;
    if (run.logs.empty()) run.logs = "/tmp/kvrelay-http-" + std::to_string(std::time(nullptr));
    Status s = RunHttpBench(run);
    if (!s.ok()) {
      std::fprintf(stderr, "kvrelay bench http: %s\n", s.message().c_str());
      SetExitCode(1);
    }
  });
}

void RegisterTransferBench(CLI::App* bench) {
  auto o = std::make_shared<TransferBenchOptions>();
  auto* cmd = bench->add_subcommand(
      "transfer",
      "KV hand-off bandwidth and latency through real P and D processes, each size beside the "
      "raw mechanism (memcpy into a shared mapping, a socket stream, a UCX put) measured in the "
      "same run (for one block also, as context, the raw mechanism from idle, as kvrelay's "
      "transfers start), plus one-block latency against a bare ZeroMQ round trip");
  cmd->add_option("--transports", o->transports, "shm, tcp, ucx")
      ->check(TransportNames())
      ->capture_default_str();
  cmd->add_option("--kv-mode", o->kv_mode,
                  "push (P writes into D; pull → answer) or read (D reads from P under a lease; "
                  "lease request → reads landed)")
      ->check(KvModeNames())
      ->capture_default_str();
  cmd->add_option("--model-shape", o->shape, "model shape of the KV (tiny | small | 8b)")
      ->check(ModelShapeNames())
      ->capture_default_str();
  cmd->add_option("--sizes", o->sizes_blocks, "transfer sizes, in blocks")->capture_default_str();
  cmd->add_option("--pool-blocks", o->pool_blocks,
                  "blocks in each engine's pool and in the baselines' (0: 4 x the largest size, "
                  "at least 256)")
      ->capture_default_str();
  cmd->add_option("--bytes-per-size", o->bytes_per_size,
                  "transfers per size: enough to move this many bytes")
      ->capture_default_str();
  cmd->add_option("--min-transfers", o->min_transfers, "fewest transfers per size")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  cmd->add_option("--rounds", o->rounds,
                  "per size, kvrelay's transfers and the baseline's alternate in this many "
                  "rounds, so drift on a shared machine moves both sides of a ratio alike")
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  cmd->add_option("--min-round-mib", o->min_round_mib,
                  "fewer rounds where a baseline round would move less than this (its timed "
                  "pass repeats its first, which must not fit in a cache)")
      ->capture_default_str();
  cmd->add_option("--max-transfers", o->max_transfers, "most transfers per size")
      ->capture_default_str()
      ->check(CLI::Range(1u, 100000u));
  cmd->add_option("--latency-samples", o->latency_samples,
                  "one-block pulls per transport for the latency figures (0: skip)")
      ->capture_default_str();
  cmd->add_option("--latency-shape", o->latency_shape, "model shape for the one-block latency")
      ->check(ModelShapeNames())
      ->capture_default_str();
  cmd->add_option("--abort-probes", o->abort_probes,
                  "per transport: abort a P leg under the demo's load and time D's answer "
                  "(0: skip)")
      ->capture_default_str();
  cmd->add_option("--inline-write-kib", o->inline_write_kib,
                  "the engines' --inline-write-kib (shm and tcp writes, and reads in read "
                  "mode, this small skip the worker hand-off; -1: their default)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 20));
  cmd->add_flag("--no-local-lane", [o](int64_t) { o->local_lane = false; },
                "the engines' --no-local-lane: control frames over ZeroMQ only (for an "
                "A/B against the local lane)");
  cmd->add_option("--control-nice", o->control_nice,
                  "the engines' --control-nice: the control path's threads preempt bulk work "
                  "(0: not passed)")
      ->check(CLI::Range(-20, 0))
      ->capture_default_str();
  cmd->add_option("--control-slice-us", o->control_slice_us,
                  "the engines' --control-slice-us (0: the kernel's default slice; -1: not "
                  "passed, serve's default)")
      ->check(CLI::Range(-1, 100000));
  cmd->add_flag("--busy-steps", o->busy_steps,
                "the engines' --busy-steps: inputs that arrive during a step wait for its "
                "end, as in vLLM");
  cmd->add_flag_callback("--no-fast-abort", [o] { o->fast_abort = false; },
                "the engines' --no-fast-abort: an abort on P reaches the ranks only through "
                "the engine loop (to measure what the fast abort buys)");
  cmd->add_option("--tcp-streams", o->tcp_streams, "tcp transport: connections per peer rank")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--ucx-tls", o->ucx_tls, "UCX_TLS for kvrelay and the UCX baseline");
  cmd->add_option("--logs", o->logs, "folder for the engines' logs")->capture_default_str();
  cmd->add_option("--json", o->json_path, "write the results as JSON to this file (- for stdout)");
  cmd->add_option("--plot", o->plot_path, "draw bandwidth against size into this PNG (gnuplot)");
  cmd->add_option("--seed", o->seed, "seed for the prompts")->capture_default_str();
  cmd->callback([o] {
    if (Status s = RunTransferBench(*o); !s.ok()) {
      std::fprintf(stderr, "bench transfer: %s\n", s.ToString().c_str());
      SetExitCode(1);
    }
  });
}

void RegisterTtftBench(CLI::App* bench) {
  auto o = std::make_shared<TtftBenchOptions>();
  auto* cmd = bench->add_subcommand(
      "ttft",
      "What the P/D hand-off adds to time to first token: the same prompts on a plain engine "
      "and through the router to P and D, one at a time, against the transfer time the "
      "bandwidth measured in the same run predicts (issue 8's end-to-end target)");
  cmd->footer(
      "Definitions. TTFT: request sent -> first streamed token, at the client, p50 over "
      "--samples fresh random prompts per length, each asking for 2 tokens (the second makes "
      "D read every byte it loaded, so the output check covers the transfer); each prompt "
      "goes to the plain engine and through the router (alternating which first), with every "
      "engine idle before each request. difference = P/D p50 - plain p50: P's prefill runs on "
      "P as the plain engine's runs on it, so the difference is the hand-off: the router and "
      "its two legs, D's admission and pull, the wait for P's Ready, the transfer, D's first "
      "token (P's, handed over with the KV, or computed from the loaded KV) and the relay "
      "back. bandwidth = the prompt's KV bytes / p50 of D's pull->answer time "
      "for transfers of that very KV size pulled once P had finished (as bench transfer "
      "measures it), on the same engines in the same run. predicted transfer time = KV bytes "
      "/ bandwidth. ratio = difference / predicted; [MET] when ratio <= --target. Every P/D "
      "request must be served by a transfer (D's pull answered ok with the prompt's blocks) "
      "and every output is checked against the model; else the run fails. A missed target "
      "is not a failure (exit 0).");
  cmd->add_option("--transport", o->transport, "data plane: shm | tcp | ucx")
      ->check(TransportNames())
      ->capture_default_str();
  cmd->add_option("--model-shape", o->shape, "model shape of the KV (tiny | small | 8b)")
      ->check(ModelShapeNames())
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "prompt lengths, in tokens")
      ->capture_default_str();
  cmd->add_option("--samples,-n", o->samples, "prompts per length (each on both paths)")
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup,
                  "untimed prompts of the largest length per path first (first touches of "
                  "every pool, connections)")
      ->capture_default_str();
  cmd->add_option("--step-base-us", o->step_base_us,
                  "modelled step time of every engine: fixed part (serve's default)")
      ->capture_default_str();
  cmd->add_option("--step-per-token-us", o->step_per_token_us,
                  "modelled step time of every engine: per token computed (serve's default)")
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", o->max_batch_tokens,
                  "token budget per step of every engine (a longer prompt prefills in chunks)")
      ->capture_default_str();
  cmd->add_option("--pool-blocks", o->pool_blocks,
                  "KV blocks in every engine's pool (0: the largest prompt's blocks + 16)")
      ->capture_default_str();
  cmd->add_option("--target", o->target_ratio,
                  "the target: difference / predicted transfer time at most this")
      ->capture_default_str();
  cmd->add_option("--tcp-streams", o->tcp_streams, "tcp transport: connections per peer rank")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--kv-read-threads", o->kv_read_threads,
                  "every engine's --kv-read-threads (the plain engine's too)")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  cmd->add_option("--ucx-tls", o->ucx_tls, "ucx transport: UCX_TLS");
  cmd->add_flag("--compute-first-token", o->compute_first_token,
                "the engines' --compute-first-token: D computes the first token from the "
                "loaded KV instead of emitting P's (the A/B of that hand-off)");
  cmd->add_flag("--stream-chunks", o->stream_chunks,
                "also a second P with serve's --stream-chunks (each finished prefill chunk, "
                "--max-batch-tokens long, goes to D while the prefill goes on), behind a "
                "router of its own over the same D; every prompt goes through it too, so "
                "streamed and whole hand-offs are compared in one run");
  cmd->add_option("--stream-goal", o->stream_goal,
                  "with --stream-chunks: the goal, streamed P/D - plain at most this times "
                  "P/D - plain, for prompts of 2 chunks or more")
      ->capture_default_str();
  cmd->add_option("--request-timeout-s", o->request_timeout_s, "a request hung longer fails")
      ->capture_default_str();
  cmd->add_option("--logs", o->logs, "folder for the engines' and router's logs")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path,
                  "write the figures and every sample as JSON to this file (- for stdout)");
  cmd->add_option("--seed", o->seed, "seed for the prompts")->capture_default_str();
  cmd->add_option("--engine", o->engine,
                  "emulated (--model-shape, modelled step times) | llama (llama.cpp engines: "
                  "real compute, P/D outputs compared with the plain engine's and llama.cpp "
                  "alone's; the model's export and import copies reported per token)")
      ->check(EngineNames())
      ->capture_default_str();
  cmd->add_option("--model", o->model,
                  "--engine llama: the GGUF every engine serves (default: one made in --logs "
                  "with the shape below and a context for the largest prompt)");
  cmd->add_option("--threads", o->threads, "--engine llama: llama.cpp threads per engine")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  AddMadeModelFlags(cmd, &o->make);
  cmd->add_option("--decode-under-prefill-s", o->decode_under_prefill_s,
                  "after the TTFT samples, this many seconds on the plain engine and as many "
                  "through the router: --decoders short requests decoding while prompts of the "
                  "largest length prefill beside them; decode tokens/s and token gaps per path "
                  "(0: skipped)")
      ->capture_default_str();
  cmd->add_option("--decoders", o->decoders, "decode under prefill: short requests at once")
      ->capture_default_str();
  cmd->add_option("--decode-tokens", o->decode_tokens,
                  "decode under prefill: output tokens per short request (16-token prompts)")
      ->capture_default_str();
  cmd->callback([o] {
    if (Status s = RunTtftBench(*o); !s.ok()) {
      std::fprintf(stderr, "bench ttft: %s\n", s.ToString().c_str());
      SetExitCode(s.code() == StatusCode::kInvalidArgument ? 2 : 1);
    }
  });
}

void AddLoadFlags(CLI::App* cmd, LoadOptions* o, std::vector<std::string>* controls,
                  std::string* json_path) {
  cmd->add_option("--requests,-n", o->requests, "requests to send")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--concurrency,-c", o->concurrency, "requests in flight at once")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--prompt-tokens-min", o->prompt_min, "shortest prompt")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--prompt-tokens-max", o->prompt_max, "longest prompt")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--output-tokens-min", o->output_min, "shortest output")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--output-tokens-max", o->output_max, "longest output")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--disconnect-fraction", o->disconnect_fraction,
                  "fraction of clients that disconnect at a random moment (0..1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--chat-fraction", o->chat_fraction,
                  "fraction of requests sent to /v1/chat/completions as a chat (0..1); the rest "
                  "go to /v1/completions")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--control", *controls,
                  "lifecycle call during the load, e.g. \"pause:mode=abort,target=p@3s\" "
                  "(target p|d|all; pause/sleep are followed by resume/wake_up after "
                  "resume_after_ms=200)")
      ->check(CLI::Validator(
          [](std::string& call) {
            const Result<ControlCall> parsed = ParseControlCall(call);
            return parsed.ok() ? std::string() : parsed.status().message();
          },
          "CALL"));
  cmd->add_option("--seed", o->seed, "seed for prompts, lengths and disconnects")
      ->capture_default_str();
  cmd->add_option("--probes", o->probes, "probe requests checked against Reference afterwards")
      ->capture_default_str();
  cmd->add_option("--request-timeout-s", o->request_timeout_s, "a request hung longer failed")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--idle-timeout-s", o->idle_timeout_s,
                  "how long engines may take to go idle after the load")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--json", *json_path, "also write the report as JSON to this file");
  cmd->add_option("--auth-token-file", o->auth_token_file,
                  "shared secret (chmod 600) the engines were started with: signs lifecycle "
                  "calls and /debug/state reads");
}

Result<LoadOptions> PrepareLoad(const LoadOptions& base,
                                const std::vector<std::string>& controls) {
  LoadOptions o = base;
  // Each count and length is at least 1 (AddLoadFlags); here, each min is
  // at most its max.
  if (o.prompt_min > o.prompt_max) {
    return InvalidArgumentError("--prompt-tokens-min (" + std::to_string(o.prompt_min) +
                                ") must be from 1 to --prompt-tokens-max (" +
                                std::to_string(o.prompt_max) + ")");
  }
  if (o.output_min > o.output_max) {
    return InvalidArgumentError("--output-tokens-min (" + std::to_string(o.output_min) +
                                ") must be from 1 to --output-tokens-max (" +
                                std::to_string(o.output_max) + ")");
  }
  if (!o.auth_token_file.empty()) {
    Result<std::string> token = runtime::LoadAuthToken(o.auth_token_file);
    if (!token.ok()) return token.status();
    o.auth_token = *token;
  }
  for (const std::string& c : controls) {
    Result<ControlCall> call = ParseControlCall(c);
    if (!call.ok()) return call.status();
    o.controls.push_back(*call);
  }
  return o;
}

int RunPreparedLoad(const LoadOptions& o, const std::string& json_path) {
  LoadReport r = RunLoad(o);
  std::fputs(FormatLoadReport(r).c_str(), stdout);
  std::fflush(stdout);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "kvrelay: cannot write %s\n", json_path.c_str());
      return 1;
    }
    const std::string j = LoadReportJson(r);
    std::fwrite(j.data(), 1, j.size(), f);
    std::fclose(f);
  }
  return r.passed() ? 0 : 1;
}

// bench load's judge for llama.cpp clusters: --check-model and its versions.
struct LoadCheckFlags {
  std::string model;                    // weights version 1
  std::vector<std::string> versions;    // N=FILE.gguf
  uint32_t threads = 1;
};

void RegisterLoadOptions(CLI::App* bench) {
  auto o = std::make_shared<LoadOptions>();
  auto controls = std::make_shared<std::vector<std::string>>();
  auto json_path = std::make_shared<std::string>();
  auto check = std::make_shared<LoadCheckFlags>();
  auto* load = bench->add_subcommand(
      "load",
      "Load an OpenAI-compatible endpoint (the router or an engine) and check that nothing "
      "was lost: outputs, idle engines, empty pools, probes");
  load->add_option("--url", o->url, "endpoint to load")->capture_default_str();
  load->add_option("--engine", o->engines,
                   "engine URLs to check for idle (default: the endpoint's /engines)");
  AddLoadFlags(load, o.get(), controls.get(), json_path.get());
  load->add_option("--check-model", check->model,
                   "the endpoint serves llama.cpp engines on this GGUF (their --model): judge "
                   "outputs against llama.cpp alone on it (first token exact or within 1e-3 of "
                   "its draw flipping; whole outputs counted) instead of the emulated model's "
                   "rule; prompts are token ids below its vocabulary, asking ignore_eos");
  load->add_option("--check-weights-version", check->versions,
                   "with --check-model: VERSION=FILE.gguf for outputs made after an "
                   "update_weights to VERSION (the engines' --weights-version)");
  load->add_option("--check-threads", check->threads,
                   "with --check-model: llama.cpp threads of the judge")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  load->callback([o, controls, json_path, check] {
    LoadOptions run = *o;
    if (!check->model.empty() || !check->versions.empty()) {
      std::map<uint64_t, std::string> files;
      if (Status s = ParseVersions(check->versions, "--check-weights-version", &files);
          !s.ok() || check->model.empty() || !files.emplace(1, check->model).second) {
        std::fprintf(stderr, "kvrelay bench load: %s\n",
                     !s.ok()             ? s.message().c_str()
                     : check->model.empty() ? "--check-weights-version needs --check-model"
                                          : "--check-model is version 1; "
                                            "--check-weights-version 1 given too");
        SetExitCode(2);
        return;
      }
      if (std::string why = llama::Unavailable(); !why.empty()) {
        std::fprintf(stderr, "kvrelay bench load: --check-model: %s\n", why.c_str());
        SetExitCode(2);
        return;
      }
      Result<std::shared_ptr<LlamaChecker>> c = LlamaChecker::Open(files, check->threads);
      if (!c.ok()) {
        std::fprintf(stderr, "kvrelay bench load: --check-model: %s\n",
                     c.status().message().c_str());
        SetExitCode(2);
        return;
      }
      run.checker = *c;
    }
    Result<LoadOptions> ready = PrepareLoad(run, *controls);
    if (!ready.ok()) {
      std::fprintf(stderr, "kvrelay bench load: %s\n", ready.status().message().c_str());
      SetExitCode(2);
      return;
    }
    SetExitCode(RunPreparedLoad(*ready, *json_path));
  });
}

}  // namespace kvrelay::cli
