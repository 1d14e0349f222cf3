// http_flags.h — HttpFlags: the HTTP server's command-line flags, the same
// for `kvrelay serve` and `kvrelay router`.
//
// Why: an operator tunes the engines and the router with one vocabulary;
// defining the flags once keeps their names, defaults and help identical.
//
// Thread safety: main thread (CLI parsing).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "http/http_server.h"

namespace kvrelay::cli {

struct HttpFlags {
  size_t max_body_bytes = size_t{1} << 20;
  uint32_t io_threads = 2;
  uint32_t workers = 16;
  uint32_t max_connections = 20000;
  uint32_t max_connections_per_client = 0;
  int64_t idle_timeout_ms = 60000;
  int64_t header_timeout_ms = 5000;
  int64_t body_timeout_ms = 30000;
};

// --max-body-bytes and the server's threads and limits (each command has
// its own --host and --port).
void AddHttpFlags(CLI::App* cmd, HttpFlags* f);

// Raises this process's open-file limit to its hard limit (connections are
// files); logs if it cannot.
void RaiseOpenFileLimit();

// The server's options: the flags' (checked by AddHttpFlags as they were
// parsed), on host:port.
void HttpOptionsFrom(const HttpFlags& f, const std::string& host, uint16_t port,
                     http::ServerOptions* out);

}  // namespace kvrelay::cli
