// engine_deltas.h — what `bench ttft` reads from its engines' /metrics
// around its requests, as differences: the model's hand-off copies
// (KvCopies: P's exports, D's imports; llama.cpp engines) and an engine's
// step time (StepTime, StepTimes: the real work inside its steps against
// the compute its model asked for).
//
// Thread safety: value types; each read is an HTTP scrape on the calling
// thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/percentile.h"
#include "cli/bench_cluster.h"
#include "cli/local_cluster.h"

namespace kvrelay::cli {

// The model's hand-off copies (llama.cpp engines), from P's and D's
// /metrics: P's exports, D's imports (times in µs). -1: not read.
struct KvCopies {
  double exported_tokens = -1, export_us = -1, imported_tokens = -1, import_us = -1;
  static KvCopies Read(const BenchCluster& c) {
    auto us = [](double s) { return s < 0 ? s : s * 1e6; };
    return KvCopies{MetricSample(c.p_url(), "kvrelay_kv_exported_tokens_total"),
                    us(MetricSample(c.p_url(), "kvrelay_kv_export_seconds_total")),
                    MetricSample(c.d_url(), "kvrelay_kv_imported_tokens_total"),
                    us(MetricSample(c.d_url(), "kvrelay_kv_import_seconds_total"))};
  }
  bool read() const {
    return exported_tokens >= 0 && export_us >= 0 && imported_tokens >= 0 && import_us >= 0;
  }
  KvCopies Minus(const KvCopies& before) const {
    if (!read() || !before.read()) return {};
    return KvCopies{exported_tokens - before.exported_tokens, export_us - before.export_us,
                    imported_tokens - before.imported_tokens, import_us - before.import_us};
  }
  // µs per token; -1 without copies.
  double ExportUsPerToken() const { return exported_tokens > 0 ? export_us / exported_tokens : -1; }
  double ImportUsPerToken() const { return imported_tokens > 0 ? import_us / imported_tokens : -1; }
};

// An engine's step time so far, from its /metrics (s; -1: not read): the
// real work inside its steps and the compute its model asked for.
struct StepTime {
  double work_s = -1, modelled_s = -1;
  static StepTime Read(const std::string& url) {
    return StepTime{MetricSample(url, "kvrelay_engine_step_work_seconds_total"),
                    MetricSample(url, "kvrelay_engine_step_modelled_seconds_total")};
  }
};

// One path's engine step time per request (P's on the P/D paths).
struct StepTimes {
  std::vector<double> work_s, modelled_s;
  void Add(const StepTime& before, const StepTime& after) {
    if (before.work_s < 0 || after.work_s < 0 || before.modelled_s < 0 || after.modelled_s < 0) {
      return;
    }
    work_s.push_back(after.work_s - before.work_s);
    modelled_s.push_back(after.modelled_s - before.modelled_s);
  }
  nlohmann::json Json() const {
    return {{"work_p50_s", Percentile(work_s, 0.5)},
            {"modelled_p50_s", Percentile(modelled_s, 0.5)}, {"work_s", work_s},
            {"modelled_s", modelled_s}};
  }
};

}  // namespace kvrelay::cli
