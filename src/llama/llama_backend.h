// llama_backend.h — EnsureBackends: the once-per-process llama.cpp setup
// every caller of llama.cpp in src/llama/ runs before loading a model.
//
// Why: the pinned llama.cpp build (cmake/kvrelay_llama.cmake) ships its CPU
// backend as dlopen'ed variants (libggml-cpu-<isa>.so) beside libggml; ggml
// finds them only when told the folder (KVRELAY_LLAMA_BACKEND_DIR, a compile
// definition) — otherwise llama_backend_init looks next to the executable
// and in the working directory, and a model then loads with no device.
// llama.cpp also logs every tensor and key at INFO to stderr; kvrelay keeps
// its warnings and errors and drops the rest.
//
// Ownership and threading: process-global state owned by llama.cpp and
// ggml. EnsureBackends is safe to call from any thread, any number of times
// (std::call_once); the first call does the work. The log callback is
// process-wide: it replaces whatever callback was set before.
#pragma once

namespace kvrelay::llama {

// Loads ggml's backends (the best CPU variant) from the pinned build's lib
// folder, runs llama_backend_init and installs the log filter (WARN and
// ERROR to stderr; DEBUG and INFO dropped). Idempotent.
void EnsureBackends();

}  // namespace kvrelay::llama
