// llama_backend.cc — EnsureBackends: ggml's backends from the pinned lib
// folder, llama_backend_init, and a log filter, once per process.
#include "llama/llama_backend.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

namespace kvrelay::llama {
namespace {

// The level of the last line logged: GGML_LOG_LEVEL_CONT continues it.
std::atomic<int> g_last_level{GGML_LOG_LEVEL_INFO};

void FilterLog(ggml_log_level level, const char* text, void* /*user_data*/) {
  int effective = level;
  if (level == GGML_LOG_LEVEL_CONT) {
    effective = g_last_level.load(std::memory_order_relaxed);
  } else {
    g_last_level.store(level, std::memory_order_relaxed);
  }
  if (effective >= GGML_LOG_LEVEL_WARN && text != nullptr) {
    std::fputs(text, stderr);
  }
}

void InitOnce() {
  // Before anything logs, and before llama_backend_init: with no backend
  // registered it would load them from the default places instead.
  llama_log_set(FilterLog, nullptr);  // ggml's log too
#ifdef KVRELAY_LLAMA_BACKEND_DIR
  ggml_backend_load_all_from_path(KVRELAY_LLAMA_BACKEND_DIR);
#else
  ggml_backend_load_all();  // a system llama.cpp: its own search path
#endif
  llama_backend_init();
}

}  // namespace

void EnsureBackends() {
  static std::once_flag once;
  std::call_once(once, InitOnce);
}

}  // namespace kvrelay::llama
