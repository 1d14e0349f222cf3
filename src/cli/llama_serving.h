// llama_serving.h — what `serve --engine llama` adds to an engine process:
// its flags, and turning them into a llama.cpp model behind the engine.
//
// Why apart from serve_command.cc: the model (src/llama) is opened before
// the server starts, sets the engine's shape from the file (vocabulary,
// context, name), and must outlive the server; serve only holds it.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "llama/llama_model.h"
#include "server/engine_server.h"

namespace kvrelay::cli {

// Tokens per KV block of a llama engine (its shape: llama::ShapeFor).
inline constexpr uint32_t kLlamaBlockTokens = 16;

struct LlamaServeFlags {
  std::string engine = "emulated";          // emulated | llama
  std::string model;                        // GGUF file: weights version 1
  uint32_t threads = 2;                     // llama.cpp compute threads
  std::vector<std::string> weights_versions;  // "N=FILE.gguf", for update_weights
};

void AddLlamaServeFlags(CLI::App* cmd, LlamaServeFlags* flags);

// "N=FILE.gguf" specs into version → file; `flag` names them in errors
// (kInvalidArgument: not that form, version 0, a version twice).
Status ParseVersions(const std::vector<std::string>& specs, const std::string& flag,
                     std::map<uint64_t, std::string>* out);

// For --engine llama: checks the flags against the rest of `so` (tp 1),
// opens the model and its tokenizer, and points `so` at them (a shape
// whose blocks carry llama.cpp's KV, prefix caching off, no modelled step
// time, codec, model name unless one was given). The model lands in `*model`, to outlive the
// server. For --engine emulated: nothing. kInvalidArgument for flags that
// do not fit, the model's own errors otherwise.
Status SetUpLlamaEngine(const LlamaServeFlags& flags, server::ServerOptions* so,
                        std::unique_ptr<llama::LlamaModel>* model);

}  // namespace kvrelay::cli
