#include "server/http_metrics.h"

namespace kvrelay::server {

void RegisterHttpMetrics(MetricsRegistry& r, const std::function<http::ServerStats()>* stats) {
  auto read = [stats] { return *stats ? (*stats)() : http::ServerStats{}; };
  auto counter = [&](const char* name, const char* help, MetricLabels labels,
                     uint64_t http::ServerStats::*field) {
    r.AddCounterFn(name, help, std::move(labels), [read, field] { return read().*field; });
  };
  r.AddGaugeFn("kvrelay_http_connections", "HTTP connections open", {},
               [read] { return static_cast<double>(read().connections_open); });
  counter("kvrelay_http_connections_accepted_total", "HTTP connections accepted and served", {},
          &http::ServerStats::connections_accepted);
  const char* kCap = "HTTP connections accepted and closed at once for a cap";
  counter("kvrelay_http_connections_refused_total", kCap, {{"cap", "total"}},
          &http::ServerStats::connections_refused_total_cap);
  counter("kvrelay_http_connections_refused_total", kCap, {{"cap", "per_client"}},
          &http::ServerStats::connections_refused_client_cap);
  const char* kRef = "HTTP requests the server refused itself, by reason";
  counter("kvrelay_http_requests_refused_total", kRef, {{"reason", "body_bytes"}},
          &http::ServerStats::refused_body_bytes);
  counter("kvrelay_http_requests_refused_total", kRef, {{"reason", "header_bytes"}},
          &http::ServerStats::refused_header_bytes);
  counter("kvrelay_http_requests_refused_total", kRef, {{"reason", "malformed"}},
          &http::ServerStats::refused_malformed);
  counter("kvrelay_http_requests_refused_total", kRef, {{"reason", "timeout"}},
          &http::ServerStats::refused_timeout);
  counter("kvrelay_http_requests_refused_total", kRef, {{"reason", "busy"}},
          &http::ServerStats::refused_busy);
  counter("kvrelay_http_clients_gone_total",
          "requests whose client closed its connection before the response ended", {},
          &http::ServerStats::clients_gone);
  counter("kvrelay_http_idle_closed_total", "keep-alive connections closed for idling", {},
          &http::ServerStats::idle_closed);
}

}  // namespace kvrelay::server
