// llama_cluster.h — a LocalCluster of llama.cpp engines and a load judged
// against llama.cpp alone: what `demo`, `matrix` and `chaos` add for
// `--engine llama`.
//
// Why one place: each of those commands starts P/D clusters and runs loads;
// with llama.cpp engines the engines need the model files (weights version
// 1, and version 2 for update_weights), and the load needs a checker that
// knows them (cli/llama_checker.h).
#pragma once

#include <string>

#include "base/status.h"
#include "bench/load_gen.h"
#include "cli/local_cluster.h"
#include "llama/model_maker.h"

namespace CLI {
class App;
}

namespace kvrelay::cli {

struct LlamaClusterFlags {
  std::string engine = "emulated";  // emulated | llama
  std::string model;                // weights version 1 (default: made in `folder`)
  uint32_t threads = 1;             // llama.cpp threads per engine
};

// Adds --engine, --model and --threads to `cmd`.
void AddLlamaClusterFlags(CLI::App* cmd, LlamaClusterFlags* flags);

// Adds the shape of a model a bench makes when --model names none:
// --layers, --embd, --heads, --kv-heads, --vocab (make-model's meanings).
void AddMadeModelFlags(CLI::App* cmd, llama::MakeModelOptions* make);

// For --engine llama: makes the models it needs in `folder` (version 1
// unless --model names it; version 2, another seed of the same shape, for
// update_weights), points every engine of `c` at them and `o`'s checker at
// llama.cpp alone on them. tp must be 1. Nothing for --engine emulated
// (--model refused). Prints what it made.
Status SetUpLlamaCluster(const LlamaClusterFlags& flags, const std::string& folder,
                         ClusterOptions* c, LoadOptions* o);

}  // namespace kvrelay::cli
