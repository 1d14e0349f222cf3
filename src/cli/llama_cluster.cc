// llama_cluster.cc — llama.cpp engines for the cluster commands.
#include "cli/llama_cluster.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/llama_checker.h"
#include "llama/llama_model.h"
#include "llama/model_maker.h"

namespace kvrelay::cli {

void AddLlamaClusterFlags(CLI::App* cmd, LlamaClusterFlags* f) {
  cmd->add_option("--engine", f->engine,
                  "emulated (the checkable emulated model) | llama (llama.cpp engines; outputs "
                  "checked against llama.cpp alone: first token exact, whole outputs counted)")
      ->check(EngineNames())
      ->capture_default_str();
  cmd->add_option("--model", f->model,
                  "--engine llama: the GGUF the engines serve as weights version 1 (default: "
                  "one made with make-model's defaults in the logs folder; version 2 for "
                  "update_weights is always made there)");
  cmd->add_option("--threads", f->threads, "--engine llama: llama.cpp threads per engine")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
}

void AddMadeModelFlags(CLI::App* cmd, llama::MakeModelOptions* m) {
  cmd->add_option("--layers", m->layers, "made model: layers")->capture_default_str();
  cmd->add_option("--embd", m->embd, "made model: embedding width")->capture_default_str();
  cmd->add_option("--heads", m->heads, "made model: heads")->capture_default_str();
  cmd->add_option("--kv-heads", m->kv_heads, "made model: KV heads")->capture_default_str();
  cmd->add_option("--vocab", m->vocab, "made model: vocabulary")->capture_default_str();
}

Status SetUpLlamaCluster(const LlamaClusterFlags& f, const std::string& folder,
                         ClusterOptions* c, LoadOptions* o) {
  if (f.engine == "emulated") {
    if (!f.model.empty()) return InvalidArgumentError("--model needs --engine llama");
    return Status::Ok();
  }
  if (f.engine != "llama") {
    return InvalidArgumentError("--engine must be emulated or llama, not '" + f.engine + "'");
  }
  if (std::string why = llama::Unavailable(); !why.empty()) return UnavailableError(why);
  if (c->p_tp != 1 || c->d_tp != 1) {
    return InvalidArgumentError("--engine llama runs with tp 1 on P and D");
  }
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  auto make = [&](const std::string& path, uint64_t seed) -> Status {
    if (std::filesystem::exists(path, ec)) return Status::Ok();
    llama::MakeModelOptions m;
    m.out_path = path;
    m.seed = seed;
    if (Status s = llama::MakeModel(m); !s.ok()) return s;
    std::printf("  made a model: %s (make-model's defaults, seed %llu)\n", path.c_str(),
                static_cast<unsigned long long>(seed));
    return Status::Ok();
  };
  std::string v1 = f.model;
  if (v1.empty()) {
    v1 = folder + "/made-v1.gguf";
    if (Status s = make(v1, 1); !s.ok()) return s;
  }
  const std::string v2 = folder + "/made-v2.gguf";
  if (Status s = make(v2, 2); !s.ok()) return s;
  Result<std::shared_ptr<LlamaChecker>> checker = LlamaChecker::Open({{1, v1}, {2, v2}}, f.threads);
  if (!checker.ok()) return checker.status();
  o->checker = *checker;
  c->shape.clear();
  c->engine_args.insert(c->engine_args.end(),
                        {"--engine", "llama", "--model", v1, "--weights-version", "2=" + v2,
                         "--threads", std::to_string(f.threads)});
  return Status::Ok();
}

}  // namespace kvrelay::cli
