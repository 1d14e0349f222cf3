// metrics.h — MetricsRegistry: a small thread-safe Prometheus registry
// (counters, gauges, histograms in seconds) rendered in the text
// exposition format (version 0.0.4) for GET /metrics.
//
// Why: the server needs a handful of metrics and no dependency for them.
// Updates are lock-free atomics, cheap enough for the request path;
// Render() takes the registry's mutex and reads them.
//
// Model: a *family* is one metric name with one type, one HELP text and one
// set of label names; each registration adds a *series* to it with a fixed
// label set, e.g. kvrelay_requests_finished_total{reason="length"} and
// {reason="abort"}. A family prints one HELP/TYPE header, then its series,
// in registration order (families too), so the text is deterministic.
//
// Names carry units, and registration enforces the conventions that can be
// checked: counters end in "_total", histograms (whose buckets are seconds)
// end in "_seconds". Breaking a rule — a malformed name or label name, a
// name reused with another type, help, label names or buckets, the same
// label set twice, an "le" label on a histogram — is a bug (KV_CHECK).
//
// Ownership and threading: the registry owns every metric; the pointers
// registration returns stay valid (and never null) for the registry's
// lifetime. Registration and Render() may be called from any thread;
// Counter/Gauge/Histogram updates from any thread, without locks.
// Callbacks (the *Fn registrations) run inside Render() under the
// registry's mutex, on the rendering thread: they must be thread-safe
// with respect to what they read, must not call back into the registry,
// and must stay callable for the registry's lifetime.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/time.h"

namespace kvrelay::server {

// Label name → value, in the order they are printed.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// A monotonically increasing count.
class Counter {
 public:
  void Inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(int64_t v) { value_.store(v, std::memory_order_relaxed); }
  void Add(int64_t d) { value_.fetch_add(d, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Durations counted into fixed buckets. The sum is kept in integer
// nanoseconds (exact; rendered as seconds). Observations below zero (or NaN)
// count as 0; above 1e9 s they count as 1e9 s.
class Histogram {
 public:
  // REQUIRES: bounds strictly increasing, finite, > 0.
  explicit Histogram(std::vector<double> bounds_s);

  void Observe(Duration d) { ObserveNanos(d.ns()); }
  void ObserveSeconds(double s);

  struct Counts {
    std::vector<uint64_t> cumulative;   // per bound, then +Inf
    uint64_t count = 0;                 // == cumulative.back()
    uint64_t sum_ns = 0;
  };
  // A consistent view of the buckets (the sum may trail by in-flight
  // observations).
  Counts Read() const;
  const std::vector<double>& bounds_s() const { return bounds_s_; }

 private:
  void ObserveNanos(int64_t ns);

  const std::vector<double> bounds_s_;
  std::vector<int64_t> bounds_ns_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;   // bounds + 1 (+Inf)
  std::atomic<uint64_t> sum_ns_{0};
};

// 0.5 ms … 600 s, roughly 1-2.5-5 per decade: for request and call latencies.
const std::vector<double>& DefaultLatencyBucketsSeconds();

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  Counter* AddCounter(std::string_view name, std::string_view help, MetricLabels labels = {});
  // A counter whose value `fn` reads at render time (e.g. kept by an actor).
  void AddCounterFn(std::string_view name, std::string_view help, MetricLabels labels,
                    std::function<uint64_t()> fn);
  // A counter of seconds (a time spent, which only grows) read at render time.
  void AddSecondsCounterFn(std::string_view name, std::string_view help, MetricLabels labels,
                           std::function<double()> fn);
  Gauge* AddGauge(std::string_view name, std::string_view help, MetricLabels labels = {});
  // A gauge whose value `fn` reads at render time.
  void AddGaugeFn(std::string_view name, std::string_view help, MetricLabels labels,
                  std::function<double()> fn);
  Histogram* AddHistogram(std::string_view name, std::string_view help,
                          std::vector<double> bounds_s, MetricLabels labels = {});

  // The whole registry in the text exposition format; "" if empty.
  std::string Render() const;

 private:
  enum class Type : uint8_t { kCounter, kGauge, kHistogram };
  struct Series;
  struct Family;
  // Finds or creates the family and adds a series to it.
  Series& AddSeries(std::string_view name, std::string_view help, Type type,
                    const MetricLabels& labels, const std::vector<double>* bounds_s)
      REQUIRES(mu_);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ GUARDED_BY(mu_);  // registration order
};

// A Prometheus sample value: shortest round-trip form, "NaN", "+Inf", "-Inf".
std::string FormatMetricValue(double v);

}  // namespace kvrelay::server
