#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "base/check.h"

namespace kvrelay::server {
namespace {

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool ValidMetricName(std::string_view n) {
  if (n.empty() || !(IsNameStart(n[0]) || n[0] == ':')) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return IsNameChar(c) || c == ':'; });
}

// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved).
bool ValidLabelName(std::string_view n) {
  if (n.empty() || !IsNameStart(n[0]) || n.starts_with("__")) return false;
  return std::all_of(n.begin(), n.end(), IsNameChar);
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// `k1="v1",k2="v2"` (no braces).
std::string LabelPairs(const MetricLabels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    if (!out.empty()) out += ',';
    out += k;
    out += "=\"";
    out += EscapeLabelValue(v);
    out += '"';
  }
  return out;
}

// "{pairs}" or "" for none.
std::string Braced(const std::string& pairs) { return pairs.empty() ? "" : "{" + pairs + "}"; }

// Nanoseconds as exact decimal seconds: 1500000000 → "1.5", 0 → "0".
std::string NanosAsSeconds(uint64_t ns) {
  std::string out = std::to_string(ns / 1000000000);
  uint64_t frac = ns % 1000000000;
  if (frac == 0) return out;
  std::string digits = std::to_string(frac);
  digits.insert(0, 9 - digits.size(), '0');
  while (!digits.empty() && digits.back() == '0') digits.pop_back();
  return out + "." + digits;
}

constexpr int64_t kMaxObservationNs = int64_t{1000000000} * 1000000000;   // 1e9 s

}  // namespace

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Shortest round-trip form; plain decimals where readable ("0.0005",
  // not "5e-04"), exponents for the very small or large.
  const double a = std::fabs(v);
  const bool fixed = a == 0 || (a >= 1e-9 && a < 1e15);
  char buf[64];
  auto [end, ec] = fixed ? std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed)
                         : std::to_chars(buf, buf + sizeof(buf), v);
  KV_CHECK(ec == std::errc());
  return std::string(buf, end);
}

// --- Histogram ----------------------------------------------------------------

Histogram::Histogram(std::vector<double> bounds_s)
    : bounds_s_(std::move(bounds_s)),
      counts_(new std::atomic<uint64_t>[bounds_s_.size() + 1]) {
  for (size_t i = 0; i < bounds_s_.size(); ++i) {
    const double b = bounds_s_[i];
    KV_CHECK_MSG(std::isfinite(b) && b > 0 && b <= 1e9, "histogram bound out of range");
    KV_CHECK_MSG(i == 0 || b > bounds_s_[i - 1], "histogram bounds must increase");
    bounds_ns_.push_back(std::llround(b * 1e9));
  }
  for (size_t i = 0; i <= bounds_s_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::ObserveSeconds(double s) {
  if (!(s > 0)) {   // negative or NaN
    ObserveNanos(0);
  } else if (s >= 1e9) {
    ObserveNanos(kMaxObservationNs);
  } else {
    ObserveNanos(std::llround(s * 1e9));
  }
}

void Histogram::ObserveNanos(int64_t ns) {
  ns = std::clamp<int64_t>(ns, 0, kMaxObservationNs);
  // First bucket whose bound is >= ns (le is inclusive); past the end: +Inf.
  const size_t i = static_cast<size_t>(
      std::lower_bound(bounds_ns_.begin(), bounds_ns_.end(), ns) - bounds_ns_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
}

Histogram::Counts Histogram::Read() const {
  Counts c;
  c.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  c.cumulative.resize(bounds_s_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_s_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    c.cumulative[i] = running;
  }
  c.count = running;
  return c;
}

const std::vector<double>& DefaultLatencyBucketsSeconds() {
  static const std::vector<double> kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                               0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                               5,      10,    30,     60,    120,  300,
                                               600};
  return kBuckets;
}

// --- MetricsRegistry ------------------------------------------------------------

struct MetricsRegistry::Series {
  std::string pairs;   // rendered label pairs, no braces
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
  std::function<uint64_t()> counter_fn;
  std::function<double()> counter_seconds_fn;   // a counter of seconds
  std::function<double()> gauge_fn;
};

struct MetricsRegistry::Family {
  std::string name;
  std::string help;
  Type type = Type::kCounter;
  std::vector<std::string> label_names;
  std::vector<double> bounds_s;   // histograms
  std::vector<std::unique_ptr<Series>> series;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Series& MetricsRegistry::AddSeries(std::string_view name, std::string_view help,
                                                    Type type, const MetricLabels& labels,
                                                    const std::vector<double>* bounds_s) {
  KV_CHECK_MSG(ValidMetricName(name), "metric name must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  if (type == Type::kCounter) KV_CHECK_MSG(name.ends_with("_total"), "counter names end in _total");
  if (type == Type::kHistogram) {
    KV_CHECK_MSG(name.ends_with("_seconds"), "histogram names end in _seconds");
  }
  std::vector<std::string> label_names;
  for (const auto& [k, v] : labels) {
    KV_CHECK_MSG(ValidLabelName(k), "label name must match [a-zA-Z_][a-zA-Z0-9_]*, no __");
    KV_CHECK_MSG(type != Type::kHistogram || k != "le", "le is reserved on histograms");
    KV_CHECK_MSG(std::find(label_names.begin(), label_names.end(), k) == label_names.end(),
                 "label name repeated");
    label_names.push_back(k);
  }

  auto it = std::find_if(families_.begin(), families_.end(),
                         [&](const auto& f) { return f->name == name; });
  Family* family;
  if (it == families_.end()) {
    auto f = std::make_unique<Family>();
    f->name = std::string(name);
    f->help = std::string(help);
    f->type = type;
    f->label_names = label_names;
    if (bounds_s != nullptr) f->bounds_s = *bounds_s;
    family = f.get();
    families_.push_back(std::move(f));
  } else {
    family = it->get();
    KV_CHECK_MSG(family->type == type, "metric name reused with another type");
    KV_CHECK_MSG(family->help == help, "metric name reused with another help text");
    KV_CHECK_MSG(family->label_names == label_names, "metric name reused with other label names");
    KV_CHECK_MSG(bounds_s == nullptr || family->bounds_s == *bounds_s,
                 "histogram name reused with other buckets");
  }
  const std::string pairs = LabelPairs(labels);
  for (const auto& s : family->series) KV_CHECK_MSG(s->pairs != pairs, "series registered twice");
  family->series.push_back(std::make_unique<Series>());
  family->series.back()->pairs = pairs;
  return *family->series.back();
}

Counter* MetricsRegistry::AddCounter(std::string_view name, std::string_view help,
                                     MetricLabels labels) {
  MutexLock lock(&mu_);
  Series& s = AddSeries(name, help, Type::kCounter, labels, nullptr);
  s.counter = std::make_unique<Counter>();
  return s.counter.get();
}

void MetricsRegistry::AddCounterFn(std::string_view name, std::string_view help,
                                   MetricLabels labels, std::function<uint64_t()> fn) {
  KV_CHECK(fn != nullptr);
  MutexLock lock(&mu_);
  AddSeries(name, help, Type::kCounter, labels, nullptr).counter_fn = std::move(fn);
}

void MetricsRegistry::AddSecondsCounterFn(std::string_view name, std::string_view help,
                                          MetricLabels labels, std::function<double()> fn) {
  KV_CHECK(fn != nullptr);
  MutexLock lock(&mu_);
  AddSeries(name, help, Type::kCounter, labels, nullptr).counter_seconds_fn = std::move(fn);
}

Gauge* MetricsRegistry::AddGauge(std::string_view name, std::string_view help,
                                 MetricLabels labels) {
  MutexLock lock(&mu_);
  Series& s = AddSeries(name, help, Type::kGauge, labels, nullptr);
  s.gauge = std::make_unique<Gauge>();
  return s.gauge.get();
}

void MetricsRegistry::AddGaugeFn(std::string_view name, std::string_view help,
                                 MetricLabels labels, std::function<double()> fn) {
  KV_CHECK(fn != nullptr);
  MutexLock lock(&mu_);
  AddSeries(name, help, Type::kGauge, labels, nullptr).gauge_fn = std::move(fn);
}

Histogram* MetricsRegistry::AddHistogram(std::string_view name, std::string_view help,
                                         std::vector<double> bounds_s, MetricLabels labels) {
  auto h = std::make_unique<Histogram>(bounds_s);   // checks the bounds
  MutexLock lock(&mu_);
  Series& s = AddSeries(name, help, Type::kHistogram, labels, &bounds_s);
  s.histogram = std::move(h);
  return s.histogram.get();
}

std::string MetricsRegistry::Render() const {
  MutexLock lock(&mu_);
  std::string out;
  for (const auto& f : families_) {
    const char* type = f->type == Type::kCounter ? "counter"
                       : f->type == Type::kGauge ? "gauge"
                                                 : "histogram";
    out += "# HELP " + f->name + " " + EscapeHelp(f->help) + "\n";
    out += "# TYPE " + f->name + " " + type + "\n";
    for (const auto& s : f->series) {
      const std::string braced = Braced(s->pairs);
      switch (f->type) {
        case Type::kCounter: {
          if (s->counter_seconds_fn) {
            out += f->name + braced + " " + FormatMetricValue(s->counter_seconds_fn()) + "\n";
            break;
          }
          const uint64_t v = s->counter ? s->counter->value() : s->counter_fn();
          out += f->name + braced + " " + std::to_string(v) + "\n";
          break;
        }
        case Type::kGauge: {
          const std::string v = s->gauge ? std::to_string(s->gauge->value())
                                         : FormatMetricValue(s->gauge_fn());
          out += f->name + braced + " " + v + "\n";
          break;
        }
        case Type::kHistogram: {
          const Histogram::Counts c = s->histogram->Read();
          const std::string prefix = s->pairs.empty() ? "" : s->pairs + ",";
          for (size_t i = 0; i < c.cumulative.size(); ++i) {
            const std::string le = i < f->bounds_s.size() ? FormatMetricValue(f->bounds_s[i])
                                                           : std::string("+Inf");
            out += f->name + "_bucket{" + prefix + "le=\"" + le + "\"} " +
                   std::to_string(c.cumulative[i]) + "\n";
          }
          out += f->name + "_sum" + braced + " " + NanosAsSeconds(c.sum_ns) + "\n";
          out += f->name + "_count" + braced + " " + std::to_string(c.count) + "\n";
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace kvrelay::server
