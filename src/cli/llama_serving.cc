// llama_serving.cc — `serve --engine llama`: flags to a llama.cpp model.
#include "cli/llama_serving.h"

#include <algorithm>
#include <charconv>

#include "cli/commands.h"

namespace kvrelay::cli {
namespace {

constexpr uint32_t kLlamaBatchTokens = 512;   // llama.cpp's usual n_batch

// The model's own vocabulary as the server's text codec.
class LlamaCodec final : public server::TextCodec {
 public:
  explicit LlamaCodec(std::unique_ptr<llama::LlamaTokenizer> t) : t_(std::move(t)) {}
  std::vector<engine::Token> Encode(std::string_view text) const override {
    return t_->Encode(text);
  }
  std::string Decode(std::span<const engine::Token> tokens) const override {
    return t_->Decode(tokens);
  }
  std::vector<engine::Token> EncodeChat(
      std::span<const server::ChatMessage> messages) const override {
    std::vector<std::pair<std::string, std::string>> m;
    for (const server::ChatMessage& x : messages) m.emplace_back(x.role, x.content);
    return t_->EncodeChat(m);
  }

 private:
  std::unique_ptr<llama::LlamaTokenizer> t_;
};

}  // namespace

Status ParseVersions(const std::vector<std::string>& specs, const std::string& flag,
                     std::map<uint64_t, std::string>* out) {
  for (const std::string& s : specs) {
    const size_t eq = s.find('=');
    uint64_t v = 0;
    const char* end = s.data() + (eq == std::string::npos ? 0 : eq);
    if (eq == std::string::npos || eq + 1 == s.size() ||
        std::from_chars(s.data(), end, v).ptr != end || v == 0) {
      return InvalidArgumentError(flag + " takes VERSION=FILE.gguf (VERSION >= 1), not '" + s +
                                  "'");
    }
    if (!out->emplace(v, s.substr(eq + 1)).second) {
      return InvalidArgumentError(flag + " " + std::to_string(v) + " given twice");
    }
  }
  return Status::Ok();
}

void AddLlamaServeFlags(CLI::App* cmd, LlamaServeFlags* f) {
  cmd->add_option("--engine", f->engine,
                  "emulated (the checkable emulated model) | llama (a GGUF model through "
                  "llama.cpp; needs --model)")
      ->check(EngineNames())
      ->capture_default_str();
  cmd->add_option("--model", f->model,
                  "--engine llama: the GGUF file to serve (weights version 1); "
                  "`kvrelay make-model` writes one");
  cmd->add_option("--threads", f->threads, "--engine llama: llama.cpp's compute threads")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--weights-version", f->weights_versions,
                  "--engine llama: VERSION=FILE.gguf, the file update_weights loads for "
                  "that version (repeatable; version 1 is --model)");
}

Status SetUpLlamaEngine(const LlamaServeFlags& f, server::ServerOptions* so,
                        std::unique_ptr<llama::LlamaModel>* model) {
  if (f.engine == "emulated") {
    if (!f.model.empty() || !f.weights_versions.empty()) {
      return InvalidArgumentError("--model and --weights-version need --engine llama");
    }
    return Status::Ok();
  }
  if (f.engine != "llama") {
    return InvalidArgumentError("--engine must be emulated or llama, not '" + f.engine + "'");
  }
  if (std::string why = llama::Unavailable(); !why.empty()) return UnavailableError(why);
  if (f.model.empty()) return InvalidArgumentError("--engine llama needs --model FILE.gguf");
  engine::EngineOptions& eo = so->node.engine;
  if (eo.tp != 1) {
    return InvalidArgumentError(
        "--engine llama runs with --tp 1 (llama.cpp keeps a sequence's KV in one process)");
  }
  llama::LlamaModelOptions lo;
  lo.model_path = f.model;
  if (Status s = ParseVersions(f.weights_versions, "--weights-version", &lo.versions);
      !s.ok()) {
    return s;
  }
  lo.threads = f.threads;
  lo.context_tokens = eo.num_blocks * kLlamaBlockTokens;
  lo.max_sequences = eo.max_running;
  if (eo.role == engine::Role::kConsumer || eo.role == engine::Role::kBoth) {
    // Loads that land join the running requests whatever their count: room
    // for them (a load that finds no sequence is recomputed).
    lo.max_sequences = std::min(256u, std::max(eo.max_running * 2, eo.max_running + 16));
  }
  lo.batch_tokens = std::min(eo.max_batch_tokens, kLlamaBatchTokens);
  Result<std::unique_ptr<llama::LlamaTokenizer>> tok = llama::LlamaTokenizer::Open(f.model);
  if (!tok.ok()) return tok.status();
  // Every update_weights file now, not at the call: a typo or another
  // vocabulary is found at startup (their weights load only when asked).
  for (const auto& [version, path] : lo.versions) {
    Result<std::unique_ptr<llama::LlamaTokenizer>> other = llama::LlamaTokenizer::Open(path);
    if (!other.ok()) {
      return InvalidArgumentError("--weights-version " + std::to_string(version) + ": " +
                                  other.status().message());
    }
    if ((*other)->vocab() != (*tok)->vocab()) {
      return InvalidArgumentError("--weights-version " + std::to_string(version) + ": " + path +
                                  " has a vocabulary of " + std::to_string((*other)->vocab()) +
                                  " tokens; --model has " + std::to_string((*tok)->vocab()));
    }
  }
  Result<std::unique_ptr<llama::LlamaModel>> m = llama::LlamaModel::Open(lo);
  if (!m.ok()) return m.status();
  const llama::ModelInfo& info = (*m)->info();
  eo.shape = llama::ShapeFor(info, kLlamaBlockTokens, lo.context_tokens);
  eo.prefix_caching = false;   // llama.cpp's sequences share no KV
  eo.step_base = Duration::Zero();   // the compute is real: llama_decode
  eo.step_per_token = Duration::Zero();
  if (so->model_name.empty()) so->model_name = info.name;
  so->codec = std::make_shared<LlamaCodec>(std::move(*tok));
  *model = std::move(*m);
  so->node.model = model->get();
  return Status::Ok();
}

}  // namespace kvrelay::cli
