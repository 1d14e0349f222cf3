// http_listen.h — binding a cpp-httplib server with a real listen backlog.
//
// Why: Debian's cpp-httplib 0.11 is a compiled library whose listen()
// backlog is 5. Under a burst of connections (a load generator opening 96
// at once, a router fanning out) the kernel's accept queue overflows, SYNs
// are dropped and retried a second later, and some clients see their
// connection reset: TTFT spikes of 1 s and "Read" errors that are not the
// engine's fault. Calling listen() again on the bound socket raises the
// backlog (Linux allows it); the socket-options hook gives us the fd.
//
// Thread safety: call from the thread that starts the server.
#pragma once

#include <sys/socket.h>

#include <httplib.h>

#include <memory>
#include <string>

namespace kvrelay::server {

// Binds `http` to host:port (port 0: any) with `backlog`. Returns the
// bound port, or -1.
inline int BindWithBacklog(httplib::Server& http, const std::string& host, int port,
                           int backlog = 4096) {
  auto fd = std::make_shared<int>(-1);
  http.set_socket_options([fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    *fd = sock;
  });
  int bound = port;
  if (port == 0) {
    bound = http.bind_to_any_port(host);
  } else if (!http.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound > 0 && *fd >= 0) ::listen(*fd, backlog);
  return bound;
}

}  // namespace kvrelay::server
