#include "server/metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kvrelay::server {
namespace {

TEST(MetricsTest, EmptyRegistryRendersNothing) {
  MetricsRegistry r;
  EXPECT_EQ(r.Render(), "");
}

TEST(MetricsTest, RendersASmallRegistryExactly) {
  MetricsRegistry r;
  Counter* bytes = r.AddCounter("kvrelay_bytes_moved_total", "Bytes of KV written to D.");
  Counter* ok = r.AddCounter("kvrelay_requests_finished_total", "Finished requests by reason.",
                             {{"reason", "length"}});
  Counter* aborted = r.AddCounter("kvrelay_requests_finished_total",
                                  "Finished requests by reason.", {{"reason", "abort"}});
  Gauge* running = r.AddGauge("kvrelay_requests_running", "Requests running now.");
  r.AddGaugeFn("kvrelay_blocks_free", "Free KV blocks.", {{"pool", "d"}}, [] { return 12.0; });
  r.AddCounterFn("kvrelay_preemptions_total", "Preemptions.", {}, [] { return uint64_t{3}; });
  Histogram* lat = r.AddHistogram("kvrelay_pull_answer_latency_seconds",
                                  "Pull to answer.", {0.001, 0.01, 0.1}, {{"outcome", "ok"}});
  Histogram* lat_failed = r.AddHistogram("kvrelay_pull_answer_latency_seconds",
                                         "Pull to answer.", {0.001, 0.01, 0.1},
                                         {{"outcome", "failed"}});
  bytes->Inc(4096);
  bytes->Inc();
  ok->Inc(2);
  aborted->Inc();
  running->Set(5);
  running->Add(-2);
  lat->Observe(Duration::Microseconds(500));    // <= 0.001
  lat->Observe(Duration::Milliseconds(1));      // exactly on a bound: that bucket
  lat->Observe(Duration::Milliseconds(20));     // <= 0.1
  lat->ObserveSeconds(2.5);                     // +Inf
  (void)lat_failed;

  EXPECT_EQ(r.Render(),
            "# HELP kvrelay_bytes_moved_total Bytes of KV written to D.\n"
            "# TYPE kvrelay_bytes_moved_total counter\n"
            "kvrelay_bytes_moved_total 4097\n"
            "# HELP kvrelay_requests_finished_total Finished requests by reason.\n"
            "# TYPE kvrelay_requests_finished_total counter\n"
            "kvrelay_requests_finished_total{reason=\"length\"} 2\n"
            "kvrelay_requests_finished_total{reason=\"abort\"} 1\n"
            "# HELP kvrelay_requests_running Requests running now.\n"
            "# TYPE kvrelay_requests_running gauge\n"
            "kvrelay_requests_running 3\n"
            "# HELP kvrelay_blocks_free Free KV blocks.\n"
            "# TYPE kvrelay_blocks_free gauge\n"
            "kvrelay_blocks_free{pool=\"d\"} 12\n"
            "# HELP kvrelay_preemptions_total Preemptions.\n"
            "# TYPE kvrelay_preemptions_total counter\n"
            "kvrelay_preemptions_total 3\n"
            "# HELP kvrelay_pull_answer_latency_seconds Pull to answer.\n"
            "# TYPE kvrelay_pull_answer_latency_seconds histogram\n"
            "kvrelay_pull_answer_latency_seconds_bucket{outcome=\"ok\",le=\"0.001\"} 2\n"
            "kvrelay_pull_answer_latency_seconds_bucket{outcome=\"ok\",le=\"0.01\"} 2\n"
            "kvrelay_pull_answer_latency_seconds_bucket{outcome=\"ok\",le=\"0.1\"} 3\n"
            "kvrelay_pull_answer_latency_seconds_bucket{outcome=\"ok\",le=\"+Inf\"} 4\n"
            "kvrelay_pull_answer_latency_seconds_sum{outcome=\"ok\"} 2.5215\n"
            "kvrelay_pull_answer_latency_seconds_count{outcome=\"ok\"} 4\n"
            "kvrelay_pull_answer_latency_seconds_bucket{outcome=\"failed\",le=\"0.001\"} 0\n"
            "kvrelay_pull_answer_latency_seconds_bucket{outcome=\"failed\",le=\"0.01\"} 0\n"
            "kvrelay_pull_answer_latency_seconds_bucket{outcome=\"failed\",le=\"0.1\"} 0\n"
            "kvrelay_pull_answer_latency_seconds_bucket{outcome=\"failed\",le=\"+Inf\"} 0\n"
            "kvrelay_pull_answer_latency_seconds_sum{outcome=\"failed\"} 0\n"
            "kvrelay_pull_answer_latency_seconds_count{outcome=\"failed\"} 0\n");
}

TEST(MetricsTest, UnlabelledHistogramAndSeveralLabels) {
  MetricsRegistry r;
  Histogram* h = r.AddHistogram("kvrelay_step_seconds", "Step.", {0.5, 1});
  h->Observe(Duration::Seconds(1));
  h->ObserveSeconds(-3);                       // counts as 0
  h->ObserveSeconds(std::nan(""));             // counts as 0
  Counter* c = r.AddCounter("kvrelay_admin_calls_total", "Admin calls.",
                            {{"call", "pause"}, {"ok", "true"}});
  c->Inc();
  EXPECT_EQ(r.Render(),
            "# HELP kvrelay_step_seconds Step.\n"
            "# TYPE kvrelay_step_seconds histogram\n"
            "kvrelay_step_seconds_bucket{le=\"0.5\"} 2\n"
            "kvrelay_step_seconds_bucket{le=\"1\"} 3\n"
            "kvrelay_step_seconds_bucket{le=\"+Inf\"} 3\n"
            "kvrelay_step_seconds_sum 1\n"
            "kvrelay_step_seconds_count 3\n"
            "# HELP kvrelay_admin_calls_total Admin calls.\n"
            "# TYPE kvrelay_admin_calls_total counter\n"
            "kvrelay_admin_calls_total{call=\"pause\",ok=\"true\"} 1\n");
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry r;
  r.AddCounter("x_total", "line one\nback\\slash \"quoted\"", {{"v", "a\"b\\c\nd"}})->Inc();
  EXPECT_EQ(r.Render(),
            "# HELP x_total line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE x_total counter\n"
            "x_total{v=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(MetricsTest, ValueFormatting) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(12), "12");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(0.0005), "0.0005");
  EXPECT_EQ(FormatMetricValue(-2.5), "-2.5");
  EXPECT_EQ(FormatMetricValue(1e-9), "0.000000001");
  EXPECT_EQ(FormatMetricValue(1e-10), "1e-10");
  EXPECT_EQ(FormatMetricValue(123456.789), "123456.789");
  EXPECT_EQ(FormatMetricValue(1e15), "1e+15");
  EXPECT_EQ(FormatMetricValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(MetricsTest, ASecondsCounterRendersItsFractionAsACounter) {
  MetricsRegistry r;
  double spent_s = 0.25;
  r.AddSecondsCounterFn("x_seconds_total", "time spent", {}, [&] { return spent_s; });
  EXPECT_EQ(r.Render(),
            "# HELP x_seconds_total time spent\n# TYPE x_seconds_total counter\n"
            "x_seconds_total 0.25\n");
  spent_s = 1.5e-6;
  EXPECT_NE(r.Render().find("x_seconds_total 0.0000015\n"), std::string::npos) << r.Render();
}

TEST(MetricsTest, HistogramSumIsExactSeconds) {
  Histogram h({1});
  h.Observe(Duration::Nanoseconds(1));
  h.Observe(Duration::Nanoseconds(-5));   // counts as 0
  Histogram::Counts c = h.Read();
  EXPECT_EQ(c.sum_ns, 1u);
  EXPECT_EQ(c.count, 2u);
  EXPECT_EQ(c.cumulative, (std::vector<uint64_t>{2, 2}));
  MetricsRegistry r;
  Histogram* rh = r.AddHistogram("a_seconds", "A.", {1});
  rh->Observe(Duration::Nanoseconds(1));
  rh->Observe(Duration::Seconds(3) + Duration::Nanoseconds(20));
  EXPECT_NE(r.Render().find("a_seconds_sum 3.000000021\n"), std::string::npos) << r.Render();
  // Huge observations saturate instead of overflowing.
  Histogram big({1});
  big.ObserveSeconds(1e300);
  big.ObserveSeconds(std::numeric_limits<double>::infinity());
  EXPECT_EQ(big.Read().sum_ns, uint64_t{2000000000000000000});
  EXPECT_EQ(big.Read().cumulative, (std::vector<uint64_t>{0, 2}));
}

TEST(MetricsTest, DefaultBucketsAreValid) {
  const std::vector<double>& b = DefaultLatencyBucketsSeconds();
  ASSERT_FALSE(b.empty());
  Histogram h(b);   // checks increasing, finite, > 0
  EXPECT_EQ(h.bounds_s().size(), b.size());
}

// Every line is a comment or `name{labels} value` (text format 0.0.4).
void ExpectWellFormed(const std::string& text) {
  static const std::regex kComment(R"(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*)");
  static const std::regex kSample(
      R"([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*")"
      R"((,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*")*\})? [-+0-9.eE]+|.* (NaN|[+-]Inf))");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    EXPECT_TRUE(std::regex_match(line, kComment) || std::regex_match(line, kSample)) << line;
  }
  EXPECT_TRUE(text.empty() || text.back() == '\n');
}

TEST(MetricsTest, ConcurrentUpdatesAreAllCounted) {
  MetricsRegistry r;
  Counter* c = r.AddCounter("kvrelay_events_total", "Events.");
  Gauge* g = r.AddGauge("kvrelay_in_flight", "In flight.");
  Histogram* h = r.AddHistogram("kvrelay_op_seconds", "Ops.", {0.001, 0.002});
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100000;
  std::atomic<bool> stop{false};
  std::thread renderer([&] {
    while (!stop.load()) ExpectWellFormed(r.Render());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // A thread registering while others update and render.
      r.AddCounter("kvrelay_worker_started_total", "Workers.", {{"worker", std::to_string(t)}})
          ->Inc();
      for (int i = 0; i < kPerThread; ++i) {
        c->Inc();
        g->Add(1);
        h->Observe(Duration::Microseconds(i % 3 == 0 ? 500 : 1500));
        g->Add(-1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  stop = true;
  renderer.join();
  EXPECT_EQ(c->value(), uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(g->value(), 0);
  const Histogram::Counts hc = h->Read();
  const uint64_t total = uint64_t{kThreads} * kPerThread;
  const uint64_t small = uint64_t{kThreads} * ((kPerThread + 2) / 3);
  EXPECT_EQ(hc.count, total);
  EXPECT_EQ(hc.cumulative, (std::vector<uint64_t>{small, total, total}));
  EXPECT_EQ(hc.sum_ns, small * 500000 + (total - small) * 1500000);
  const std::string text = r.Render();
  ExpectWellFormed(text);
  EXPECT_NE(text.find("kvrelay_events_total 800000\n"), std::string::npos);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_NE(text.find("kvrelay_worker_started_total{worker=\"" + std::to_string(t) + "\"} 1\n"),
              std::string::npos);
  }
  // One header per family however many series.
  size_t headers = 0;
  for (size_t at = 0; (at = text.find("# TYPE kvrelay_worker_started_total", at)) !=
                      std::string::npos;
       ++at) {
    ++headers;
  }
  EXPECT_EQ(headers, 1u);
}

TEST(MetricsTest, PointersStayValidAsTheRegistryGrows) {
  MetricsRegistry r;
  Counter* first = r.AddCounter("a_total", "A.", {{"i", "0"}});
  for (int i = 1; i < 1000; ++i) r.AddCounter("a_total", "A.", {{"i", std::to_string(i)}});
  for (int i = 0; i < 100; ++i) r.AddGauge("g" + std::to_string(i), "G.");
  first->Inc(7);
  EXPECT_NE(r.Render().find("a_total{i=\"0\"} 7\n"), std::string::npos);
}

using MetricsDeathTest = ::testing::Test;

TEST_F(MetricsDeathTest, RegistrationMistakesAreBugs) {
  EXPECT_DEATH({ MetricsRegistry r; r.AddCounter("bad-name_total", "x"); }, "metric name");
  EXPECT_DEATH({ MetricsRegistry r; r.AddCounter("9lives_total", "x"); }, "metric name");
  EXPECT_DEATH({ MetricsRegistry r; r.AddCounter("requests", "x"); }, "_total");
  EXPECT_DEATH({ MetricsRegistry r; r.AddHistogram("latency", "x", {1}); }, "_seconds");
  EXPECT_DEATH({ MetricsRegistry r; r.AddCounter("a_total", "x", {{"__x", "1"}}); }, "label name");
  EXPECT_DEATH({ MetricsRegistry r; r.AddCounter("a_total", "x", {{"a-b", "1"}}); }, "label name");
  EXPECT_DEATH(
      { MetricsRegistry r; r.AddCounter("a_total", "x", {{"k", "1"}, {"k", "2"}}); }, "repeated");
  EXPECT_DEATH({ MetricsRegistry r; r.AddHistogram("a_seconds", "x", {1}, {{"le", "1"}}); },
               "le is reserved");
  EXPECT_DEATH({ MetricsRegistry r; r.AddHistogram("a_seconds", "x", {1, 1}); }, "increase");
  EXPECT_DEATH({ MetricsRegistry r; r.AddHistogram("a_seconds", "x", {0}); }, "bound");
  EXPECT_DEATH({ MetricsRegistry r; r.AddHistogram("a_seconds", "x", {std::nan("")}); }, "bound");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddGauge("a_total", "x");
        r.AddCounter("a_total", "x");
      },
      "another type");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddCounter("a_total", "x", {{"k", "1"}});
        r.AddCounter("a_total", "y", {{"k", "2"}});
      },
      "another help");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddCounter("a_total", "x", {{"k", "1"}});
        r.AddCounter("a_total", "x", {{"j", "2"}});
      },
      "other label names");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddCounter("a_total", "x", {{"k", "1"}});
        r.AddCounter("a_total", "x", {{"k", "1"}});
      },
      "registered twice");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddHistogram("a_seconds", "x", {1}, {{"k", "1"}});
        r.AddHistogram("a_seconds", "x", {2}, {{"k", "2"}});
      },
      "other buckets");
}

}  // namespace
}  // namespace kvrelay::server
