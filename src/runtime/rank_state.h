// rank_state.h — what a rank shows the rest of the process: its counters
// (read from any thread), the latency samples it hands to the metrics layer,
// and the snapshot /debug/state and /metrics render (RankActor::State()).
//
// Why a file of its own: the server's metrics and state pages read these;
// they need not see the actor's sockets and maps.
//
// Thread safety: RankCounters are atomics, written by the rank's thread (and
// its writers), read by any; RankState is a value copied out on the rank's
// thread; LatencySink's functions are called on the rank's thread or a
// writer, and must be thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/rank_connector.h"
#include "core/rank_session.h"
#include "core/wire.h"

namespace kvrelay::runtime {

// Counters, readable from any thread.
struct RankCounters {
  std::atomic<uint64_t> frames_in{0}, frames_out{0};
  std::atomic<uint64_t> malformed{0};          // undecodable frames
  // Of those, the ones refused for a WireLimits field (by WireLimit).
  std::array<std::atomic<uint64_t>, kWireLimitCount> over_limit{};
  std::atomic<uint64_t> unknown_sender{0};     // pull before handshake
  std::atomic<uint64_t> handshake_refused{0};  // layout/transport mismatch
  std::atomic<uint64_t> unroutable{0};         // answer for a gone D
  std::atomic<uint64_t> handshakes{0};
  std::atomic<uint64_t> peers_down{0}, peers_gone{0}, reconnects{0};
  std::atomic<uint64_t> writes_ok{0}, writes_failed{0}, bytes_written{0};
  std::atomic<uint64_t> writes_inline{0};  // of those, run on the rank's thread
  std::atomic<uint64_t> lane_frames_out{0};  // of frames_out, sent on a local lane
  std::atomic<uint64_t> lanes_opened{0}, lanes_broken{0};
  std::atomic<uint64_t> reads_ok{0}, reads_failed{0}, bytes_read{0};  // read mode, D
  std::atomic<uint64_t> reads_inline{0};  // of those, run on the rank's thread
  std::atomic<uint64_t> pulls_sent{0}, answers_received{0};
  // Access control. auth_failed: handshakes refused because their MAC did
  // not check, their echo redeemed no challenge, or one side has a token
  // and the other not. Pull items refused on P: from a D rank that has not
  // proved the token (`unauthenticated`), or naming blocks outside D's
  // registered region (`dst_out_of_region`).
  std::atomic<uint64_t> auth_failed{0};
  std::atomic<uint64_t> pulls_refused_unauthenticated{0};
  std::atomic<uint64_t> pulls_refused_dst{0};
  std::atomic<uint64_t> pulls_misaddressed{0};  // meant for another incarnation of this P
};

struct PeerView {
  uint32_t engine = 0, rank = 0;
  PeerId peer;
  std::string endpoint;
  std::string state;       // connecting | up | down | gone
  double silent_s = 0;
};

// A histogram sample the actor hands to the metrics layer.
struct LatencySink {
  // D: one answer to a pull of `blocks` destination blocks, `seconds` after
  // the pull was sent; `answered` is when it arrived (MonoNow).
  std::function<void(TransferId transfer, uint32_t rank, uint32_t blocks, double seconds,
                     TransferResult result, Instant answered)>
      pull_answer;
  std::function<void(double seconds, bool ok)> transfer;                   // D: load
  std::function<void(double seconds)> write;                               // P
  // P: TryPostMetadata (the server's fast abort) to applied on this rank's
  // thread: how long the input waited for the rank.
  std::function<void(double seconds)> posted_to_applied;
};

struct RankState {
  uint32_t rank = 0;
  Instant now;
  std::vector<SendView> sends;
  std::vector<LoadView> loads;
  std::vector<PeerView> peers;
  SendTableStats send_stats;
  LoadTableStats load_stats;
  // Read mode: P's leases and D's read-load counters.
  std::vector<LeaseView> leases;
  LeaseTableStats lease_stats;
  ReadLoadTableStats read_stats;
  KvMode mode = KvMode::kPush;
  RankConnectorStats connector_stats;
  uint32_t writes_in_flight = 0;
  size_t queued_for_sender = 0;
  size_t tombstones = 0;
};

// The state of `session` (rank `rank`) at `now`; `endpoint(engine, rank)`
// names a producer's control endpoint. On the session's thread.
RankState StateOf(const RankSession& session, uint32_t rank, Instant now,
                  const std::function<std::string(uint32_t, uint32_t)>& endpoint);

// Copies the session's counters into `out` (for other threads), adding the
// driver's own: frames it refused and frames no socket took.
void Publish(const RankSessionStats& s, uint64_t driver_malformed, uint64_t send_failures,
             RankCounters* out);

}  // namespace kvrelay::runtime
