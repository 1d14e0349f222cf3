// `kvrelay demo`: the main job. A P engine, a D engine and the router on
// loopback (child processes, logs in a folder), a load through the router
// with client disconnects and a lifecycle call landing mid-run, the report,
// and a clean shutdown of everything.

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/llama_checker.h"
#include "llama/llama_model.h"
#include "cli/local_cluster.h"
#include "llama/model_maker.h"

namespace kvrelay::cli {
namespace {

struct DemoOptions {
  std::string logs;
  std::string transport = "shm";
  std::string shape = "tiny";
  uint32_t p_tp = 1, d_tp = 1;
  uint32_t num_blocks = 0;
  double step_per_token_us = 20;
  int control_nice = 0;
  int control_slice_us = -1;
  std::string engine = "emulated";   // emulated | llama
  std::string model;                 // --engine llama: the GGUF (default: made in the logs)
  uint32_t threads = 1;              // --engine llama: llama.cpp threads per engine
};

// --engine llama: the engines serve `d.model` (made first, in the logs
// folder, when none is given), the load is judged against llama.cpp alone.
Status SetUpLlamaDemo(const DemoOptions& d, ClusterOptions* c, LoadOptions* o) {
  if (d.engine == "emulated") {
    if (!d.model.empty()) return InvalidArgumentError("--model needs --engine llama");
    return Status::Ok();
  }
  if (d.engine != "llama") {
    return InvalidArgumentError("--engine must be emulated or llama, not '" + d.engine + "'");
  }
  if (std::string why = llama::Unavailable(); !why.empty()) return UnavailableError(why);
  if (c->p_tp != 1 || c->d_tp != 1) {
    return InvalidArgumentError("--engine llama runs with --p-tp 1 and --d-tp 1");
  }
  std::string model = d.model;
  if (model.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c->logs, ec);
    model = c->logs + "/made.gguf";
    llama::MakeModelOptions m;
    m.out_path = model;
    if (Status s = llama::MakeModel(m); !s.ok()) return s;
    std::printf("  made a model: %s (kvrelay make-model's defaults)\n", model.c_str());
  }
  Result<std::shared_ptr<LlamaChecker>> checker = LlamaChecker::Open({{1, model}}, d.threads);
  if (!checker.ok()) return checker.status();
  o->checker = *checker;
  c->shape.clear();
  c->engine_args.insert(c->engine_args.end(), {"--engine", "llama", "--model", model,
                                               "--threads", std::to_string(d.threads)});
  return Status::Ok();
}

int RunDemo(const DemoOptions& d, const LoadOptions& load_base,
            const std::vector<std::string>& controls, const std::string& json_path) {
  ClusterOptions c;
  c.logs = d.logs.empty() ? "/tmp/kvrelay-demo-" + std::to_string(std::time(nullptr)) : d.logs;
  c.transport = d.transport;
  c.shape = d.shape;
  c.p_tp = d.p_tp;
  c.d_tp = d.d_tp;
  c.num_blocks = d.num_blocks;
  c.step_per_token_us = d.step_per_token_us;
  c.control_nice = d.control_nice;
  c.control_slice_us = d.control_slice_us;
  c.auth_token_file = load_base.auth_token_file;  // engines and router get it too
  LoadOptions o = load_base;
  std::printf("kvrelay demo: 1P1D on loopback, transport %s, %s %s, P tp %u, D tp %u, "
              "logs in %s\n",
              c.transport.c_str(), d.engine == "llama" ? "llama.cpp model" : "model shape",
              d.engine == "llama" ? (d.model.empty() ? "made" : d.model.c_str()) : c.shape.c_str(),
              c.p_tp, c.d_tp, c.logs.c_str());
  if (Status s = SetUpLlamaDemo(d, &c, &o); !s.ok()) {
    std::fprintf(stderr, "kvrelay demo: %s\n", s.message().c_str());
    return 2;
  }
  std::fflush(stdout);
  LocalCluster cluster;
  if (Status s = cluster.Start(c); !s.ok()) {
    std::fprintf(stderr, "kvrelay demo: %s\n", s.message().c_str());
    return 1;
  }
  std::printf("  prefill %s, decode %s, router %s\n", cluster.p_urls()[0].c_str(),
              cluster.d_urls()[0].c_str(), cluster.router_url().c_str());
  std::fflush(stdout);
  o.url = cluster.router_url();
  const int rc = RunLoadCommand(o, controls, json_path);
  bool clean = false;
  const std::string how = cluster.Stop(&clean);
  std::printf("  shutdown: %s%s\n  logs: %s/{prefill0,decode0,router}.log\n", how.c_str(),
              clean ? "all clean" : "NOT all clean", c.logs.c_str());
  return rc != 0 ? rc : (clean ? 0 : 1);
}

}  // namespace

void RegisterDemo(CLI::App& app) {
  auto d = std::make_shared<DemoOptions>();
  auto o = std::make_shared<LoadOptions>();
  auto controls = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"pause:mode=abort,target=p@3s"});
  auto json_path = std::make_shared<std::string>();
  o->requests = 600;
  o->concurrency = 96;
  o->disconnect_fraction = 0.1;
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "The main job: start a P engine, a D engine and the router on loopback, run a load "
      "through them with client disconnects and a lifecycle call (default: pause abort on P "
      "at 3 s, then resume), print the report, shut everything down");
  cmd->add_option("--logs", d->logs, "folder for the processes' logs (default /tmp/kvrelay-demo-<time>)");
  cmd->add_option("--transport", d->transport, "shm | tcp | ucx")->capture_default_str();
  cmd->add_option("--model-shape", d->shape, "tiny | small | 8b")->capture_default_str();
  cmd->add_option("--p-tp", d->p_tp, "prefill tp")->capture_default_str();
  cmd->add_option("--d-tp", d->d_tp, "decode tp")->capture_default_str();
  cmd->add_option("--num-blocks", d->num_blocks, "KV blocks per engine (default: serve's)");
  cmd->add_option("--control-nice", d->control_nice,
                  "the engines' --control-nice: aborts, lifecycle calls and answers preempt "
                  "bulk work, at the cost of TTFT under load (docs/performance.md; 0: not "
                  "passed; without CAP_SYS_NICE the engines log it and go on)")
      ->check(CLI::Range(-20, 0))
      ->capture_default_str();
  cmd->add_option("--control-slice-us", d->control_slice_us,
                  "the engines' --control-slice-us (0: the kernel's default slice; -1: not "
                  "passed, serve's default)")
      ->check(CLI::Range(-1, 100000));
  cmd->add_option("--step-per-token-us", d->step_per_token_us, "modelled compute per token")
      ->capture_default_str();
  cmd->add_option("--engine", d->engine,
                  "emulated (the checkable emulated model) | llama (llama.cpp engines; outputs "
                  "checked against llama.cpp alone: first token exact, whole outputs counted)")
      ->capture_default_str();
  cmd->add_option("--model", d->model,
                  "--engine llama: the GGUF both engines serve (default: one made with "
                  "make-model's defaults in the logs folder)");
  cmd->add_option("--threads", d->threads, "--engine llama: llama.cpp threads per engine")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  AddLoadFlags(cmd, o.get(), controls.get(), json_path.get());
  cmd->callback([d, o, controls, json_path] {
    SetExitCode(RunDemo(*d, *o, *controls, *json_path));
  });
}

}  // namespace kvrelay::cli
