#include "cli/http_flags.h"

#include <sys/resource.h>

#include <cstdio>

#include "cli/commands.h"

namespace kvrelay::cli {

void RaiseOpenFileLimit() {
  rlimit l{};
  if (getrlimit(RLIMIT_NOFILE, &l) != 0 || l.rlim_cur >= l.rlim_max) return;
  l.rlim_cur = l.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &l) != 0) {
    std::fprintf(stderr, "kvrelay: cannot raise the open-file limit to %llu\n",
                 static_cast<unsigned long long>(l.rlim_max));
  }
}

void AddHttpFlags(CLI::App* cmd, HttpFlags* f) {
  cmd->add_option("--max-body-bytes", f->max_body_bytes,
                  "largest request body, however framed (chunked too); more get 413 at once")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--http-io-threads", f->io_threads,
                  "threads doing HTTP I/O for every connection")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--http-workers", f->workers,
                  "threads running handlers that wait (a submit, an admin call, a scrape)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--max-connections", f->max_connections,
                  "HTTP connections open at once; more are accepted and closed at once")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--max-connections-per-client", f->max_connections_per_client,
                  "HTTP connections open at once from one address (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--idle-timeout-ms", f->idle_timeout_ms,
                  "a keep-alive connection with no request this long is closed")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--header-timeout-ms", f->header_timeout_ms,
                  "a request header not complete this long after its first byte gets 408")
      ->check(Positive())
      ->capture_default_str();
  cmd->add_option("--body-timeout-ms", f->body_timeout_ms,
                  "a request body not complete this long after its header gets 408")
      ->check(Positive())
      ->capture_default_str();
}

void HttpOptionsFrom(const HttpFlags& f, const std::string& host, uint16_t port,
                     http::ServerOptions* out) {
  out->host = host;
  out->port = port;
  out->io_threads = f.io_threads;
  out->worker_threads = f.workers;
  http::ServerLimits& limits = out->limits;
  limits.max_body_bytes = f.max_body_bytes;
  limits.max_connections = f.max_connections;
  limits.max_connections_per_client = f.max_connections_per_client;
  limits.idle_timeout = Duration::Milliseconds(f.idle_timeout_ms);
  limits.header_timeout = Duration::Milliseconds(f.header_timeout_ms);
  limits.body_timeout = Duration::Milliseconds(f.body_timeout_ms);
}

}  // namespace kvrelay::cli
