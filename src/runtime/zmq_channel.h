// zmq_channel.h — the control channel's ZeroMQ sockets: a P rank's ROUTER,
// a D rank's DEALER to one P rank, and the loops that read and send their
// frames (docs/wire.md, "The channel").
//
// Why a file of its own: the socket options are protocol (a bounded queue
// each way, a frame size cap before we read, silent links dropped by ZMTP
// pings) and were written inline in the rank's loop; here they are one
// function per socket kind, and RankActor only calls them.
//
// Thread safety: ZeroMQ sockets are single-threaded; every function here is
// called on the thread that owns the socket (the rank's).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/time.h"

namespace kvrelay::runtime {

struct ZmqSocketLimits {
  int hwm = 100000;                  // frames queued each way
  int64_t max_frame_bytes = 16 << 20;  // ZeroMQ drops a larger message unread
};

// P: a ROUTER bound at `endpoint` (tcp://host:port), mandatory routing (an
// answer to a gone D fails and is counted) and handover (a D reconnecting
// under its identity takes its route over).
Result<void*> BindRouter(void* zmq, const std::string& endpoint, const ZmqSocketLimits& limits);

// D: a DEALER with routing id `routing_id`, connecting to `endpoint`: it
// reconnects every 100 ms, each attempt bounded by 1 s, and drops a
// connection silent for `ping_timeout` (ZMTP pings every `ping`), so a
// healed link is used within a second or so rather than after TCP's backoff.
void* ConnectDealer(void* zmq, const std::string& endpoint, const std::string& routing_id,
                    Duration ping, Duration ping_timeout, const ZmqSocketLimits& limits);

// Reads what is queued on a ROUTER (at most 4096 messages): each message's
// first body frame goes to `fn(identity, data, size)`; returns how many
// extra body frames were dropped (a message is exactly [identity, frame]).
uint64_t DrainRouter(void* router,
                     const std::function<void(const std::string&, const uint8_t*, size_t)>& fn);
// Reads what is queued on a DEALER (at most 4096 frames).
void DrainDealer(void* dealer, const std::function<void(const uint8_t*, size_t)>& fn);

// Sends one frame without waiting (to `identity` on a ROUTER); false if
// ZeroMQ would not take it (queue full, no such route).
bool SendZmqFrame(void* sock, const std::string* identity, const std::vector<uint8_t>& frame);

}  // namespace kvrelay::runtime
