// http_metrics.h — HttpMetrics: the HTTP server's own counters (connections,
// caps, requests refused for a limit, clients gone) on /metrics, the same
// for an engine and the router.
//
// Why: an operator who sees clients refused or connections piling up must
// find it in the same place on every process; one function registers them.
//
// Ownership: the registry keeps the functions; `stats` must outlive it.
// Thread safety: Register before serving; rendering from any thread.
#pragma once

#include <functional>

#include "http/http_server.h"
#include "server/metrics.h"

namespace kvrelay::server {

// Registers kvrelay_http_* on `r`, each read from `*stats` at render time
// (an empty function reads zeros).
void RegisterHttpMetrics(MetricsRegistry& r, const std::function<http::ServerStats()>* stats);

}  // namespace kvrelay::server
