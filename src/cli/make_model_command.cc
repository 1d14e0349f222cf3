// `kvrelay make-model`: write a random-weight llama-architecture GGUF with a
// small working tokenizer, through llama.cpp's own gguf API (nothing here
// can download weights). Tests, the demo and the benches serve it; any GGUF
// a user brings is served the same way.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "llama/llama_model.h"
#include "llama/model_maker.h"
#include "os/clock.h"

namespace kvrelay::cli {

void RegisterMakeModel(CLI::App& app) {
  auto o = std::make_shared<llama::MakeModelOptions>();
  CLI::App* cmd = app.add_subcommand(
      "make-model",
      "Write a random-weight llama-architecture GGUF model (for --engine llama) with a small "
      "working tokenizer");
  cmd->add_option("--out", o->out_path, "the GGUF file to write")->required();
  cmd->add_option("--layers", o->layers, "transformer blocks")->capture_default_str();
  cmd->add_option("--embd", o->embd, "embedding width")->capture_default_str();
  cmd->add_option("--heads", o->heads, "attention heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "KV heads (divides --heads)")->capture_default_str();
  cmd->add_option("--vocab", o->vocab, "vocabulary (>= 300: bytes, specials, word pieces)")
      ->capture_default_str();
  cmd->add_option("--context", o->context, "trained context length it declares")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "weights seed: the same seed writes the same bytes")
      ->capture_default_str();
  cmd->add_option("--name", o->name, "general.name (what /v1/models calls it)")
      ->capture_default_str();
  cmd->callback([o] {
    if (std::string why = llama::Unavailable(); !why.empty()) {
      std::fprintf(stderr, "kvrelay make-model: %s\n", why.c_str());
      SetExitCode(2);
      return;
    }
    const Instant t0 = MonoNow();
    if (Status s = llama::MakeModel(*o); !s.ok()) {
      std::fprintf(stderr, "kvrelay make-model: %s\n", s.message().c_str());
      SetExitCode(s.code() == StatusCode::kInvalidArgument ? 2 : 1);
      return;
    }
    std::error_code ec;
    const uintmax_t bytes = std::filesystem::file_size(o->out_path, ec);
    std::printf("{\"out\": \"%s\", \"bytes\": %ju, \"layers\": %u, \"embd\": %u, \"heads\": %u, "
                "\"kv_heads\": %u, \"vocab\": %u, \"seed\": %ju, \"seconds\": %.3f}\n",
                o->out_path.c_str(), ec ? uintmax_t{0} : bytes, o->layers, o->embd, o->heads,
                o->kv_heads, o->vocab, static_cast<uintmax_t>(o->seed),
                (MonoNow() - t0).seconds());
  });
}

}  // namespace kvrelay::cli
