// llama_missing.cc — the llama.cpp engine when kvrelay was built without
// llama.cpp: every entry point says why, so `--engine llama` fails with a
// message instead of the build failing (CMake's KVRELAY_LLAMA_WHY).
#include "llama/llama_model.h"
#include "llama/model_maker.h"
#include "llama/reference_decoder.h"

namespace kvrelay::llama {

std::string Unavailable() {
  return std::string("the llama.cpp engine is not in this build: ") + KVRELAY_LLAMA_WHY;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::Open(const LlamaModelOptions&) {
  return UnavailableError(Unavailable());
}

Result<std::unique_ptr<LlamaTokenizer>> LlamaTokenizer::Open(const std::string&) {
  return UnavailableError(Unavailable());
}

Result<std::unique_ptr<ReferenceDecoder>> ReferenceDecoder::Open(const ReferenceOptions&) {
  return UnavailableError(Unavailable());
}

Status MakeModel(const MakeModelOptions&) { return UnavailableError(Unavailable()); }

}  // namespace kvrelay::llama
