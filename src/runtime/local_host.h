// local_host.h — IsLocalHost: does a host name or address in a peer's
// endpoint name this machine?
//
// Why: a D rank may reach a P rank on the same host through a local lane
// (runtime/local_lane.h) whatever the data transport; a P/D pair on one
// node with a network transport (one host's GPUs split into P and D, tcp or
// ucx between them) is common. D opens a lane only to a P whose control
// endpoint names this host, so a lane never reaches another engine that
// happens to use the same id and port on a different machine.
//
// It never does a DNS lookup (it runs on a rank's event loop): a name other
// than "localhost" is not local, and such a pair keeps ZeroMQ.
//
// Thread safety: any thread.
#pragma once

#include <string>

namespace kvrelay::runtime {

// True for "localhost", a loopback address (127.0.0.0/8, ::1), and an IPv4
// or IPv6 literal bound to one of this host's interfaces right now.
bool IsLocalHost(const std::string& host);

}  // namespace kvrelay::runtime
