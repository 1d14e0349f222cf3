// local_lane.h — LocalLane: a same-host control channel between a D rank
// and a P rank, a Unix stream socket in the abstract namespace carrying the
// same wire frames as the ZeroMQ channel, each behind a 4-byte length.
//
// Why: a one-block pull over ZeroMQ crosses six threads (D's rank → D's
// ZeroMQ I/O thread → P's I/O thread → P's rank → P's I/O → D's I/O → D's
// rank), and on a 2-vCPU host each wake-up of a thread that slept costs
// 50–200 µs. Over a Unix socket polled by the rank threads themselves the
// pull crosses two (docs/performance.md, "A local lane"). It is used only
// where D knows P shares its host (shm: P writes D's memory; tcp, ucx: P's
// control host is a local address, runtime/local_host.h); handshakes,
// heartbeats and incarnations are unchanged, they travel on the lane like
// every other frame once it is open.
//
// Protocol (docs/wire.md, "The local lane"): D connects to
// LaneAddress(P engine, P rank, P's control port) and sends one attach
// frame, "KVLANE1:" + its ZeroMQ routing id; P then treats the lane as
// that routing id's route (frames in are as if from its DEALER, frames to
// that id go out on the lane). Every later frame either way is one
// EncodeWire() message. A frame over the size limit, or a first frame that
// is not an attach, breaks the lane; the D side then falls back to
// ZeroMQ.
//
// Ownership: a RankActor owns its lanes and listener. Threading: the
// owning actor's thread only. Invariants: frames go out in Send() order,
// whole or not at all; the outgoing queue holds at most `max_frames`
// frames and `max_bytes` bytes (Send refuses beyond, counted by the
// caller); once broken() a lane sends and reads nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/time.h"

namespace kvrelay::runtime {

// The abstract socket name of P engine `engine`'s rank `rank` whose
// control ROUTER listens on `port` (ctrl_port + rank).
std::string LaneAddress(uint32_t engine, uint32_t rank, uint32_t port);

// The first frame D sends on a lane, and its parse (nullopt: not one).
std::vector<uint8_t> LaneAttachFrame(const std::string& routing_id);
std::optional<std::string> ParseLaneAttach(const uint8_t* data, size_t size);

struct LaneLimits {
  uint32_t max_frame_bytes = 16u << 20;  // a longer frame breaks the lane
  size_t max_frames = 100000;            // outgoing queue, frames
  size_t max_bytes = 64u << 20;          // outgoing queue, bytes
};

// True only if the kernel says process `pid` is gone: no such pid, or a
// zombie (a SIGKILLed process stays one until reaped). A process that is
// still exiting — its sockets already closed — is not gone yet: ask again.
bool ProcessGone(int pid);

class LocalLane {
 public:
  enum class SendResult : uint8_t { kSent, kQueueFull, kBroken };

  // Connects (non-blocking socket; a Unix connect completes at once).
  static Result<std::unique_ptr<LocalLane>> Connect(const std::string& address,
                                                    const LaneLimits& limits);
  // Takes an accepted socket.
  LocalLane(int fd, const LaneLimits& limits);
  ~LocalLane();
  LocalLane(const LocalLane&) = delete;
  LocalLane& operator=(const LocalLane&) = delete;

  int fd() const { return fd_; }
  bool broken() const { return broken_; }
  const std::string& why_broken() const { return why_; }
  // Broken because the peer closed its end (EOF), not for a fault.
  bool peer_closed() const { return peer_closed_; }
  // The peer's process, from the kernel at connect/accept (SO_PEERCRED; 0
  // if unknown, e.g. in another pid namespace).
  int peer_pid() const { return peer_pid_; }
  // True only if the kernel says the peer's process is gone (see
  // ProcessGone): proof of death, where an EOF alone may be a peer that
  // closed the lane and lives on.
  bool PeerProcessGone() const { return ProcessGone(peer_pid_); }
  // True while frames wait for the socket to take them (poll for POLLOUT).
  bool wants_write() const { return !out_.empty(); }
  size_t queued_frames() const { return out_.size(); }

  // Queues one frame and writes what the socket takes now.
  SendResult Send(const std::vector<uint8_t>& frame);
  // Writes queued frames (on POLLOUT).
  void Flush();
  // Reads what the socket has (on POLLIN) and calls `on_frame` for each
  // whole frame, up to `max_frames` of them; EOF or a bad length breaks
  // the lane. Returns how many frames it delivered.
  size_t Read(const std::function<void(const uint8_t*, size_t)>& on_frame,
              size_t max_frames = 4096);
  // True if Read stopped at `max_frames` with a whole frame buffered:
  // nothing on the socket will wake a poller for it, so read again.
  bool has_buffered_frame() const;
  // Breaks the lane now (closes the socket).
  void Break(std::string why);

  // P side: the routing id the attach frame named ("" until it came), and
  // when a lane still without one is closed (so idle connections cannot
  // hold the listener's slots).
  const std::string& identity() const { return identity_; }
  void set_identity(std::string id) { identity_ = std::move(id); }
  Instant attach_deadline() const { return attach_deadline_; }
  void set_attach_deadline(Instant t) { attach_deadline_ = t; }

 private:
  // Leaves at least kMinRoom bytes free after in_end_ (moves the unread
  // bytes to the front first, grows in_ only if that is not enough).
  void MakeRoomToRead();

  int fd_ = -1;
  const LaneLimits limits_;
  bool broken_ = false;
  bool peer_closed_ = false;
  int peer_pid_ = 0;
  std::string why_;
  std::string identity_;
  Instant attach_deadline_;
  std::deque<std::vector<uint8_t>> out_;  // each with its 4-byte length
  size_t out_bytes_ = 0;
  size_t out_offset_ = 0;                 // bytes of out_.front() written
  // Bytes read: [in_start_, in_end_) not yet delivered. in_'s size is its
  // capacity (grown, never zero-filled on the hot path).
  std::vector<uint8_t> in_;
  size_t in_start_ = 0, in_end_ = 0;
};

// P side: the listening socket.
class LaneListener {
 public:
  static Result<std::unique_ptr<LaneListener>> Bind(const std::string& address);
  ~LaneListener();
  LaneListener(const LaneListener&) = delete;
  LaneListener& operator=(const LaneListener&) = delete;
  int fd() const { return fd_; }
  // An accepted connection's socket, or -1 when none is waiting.
  int Accept();

 private:
  explicit LaneListener(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace kvrelay::runtime
