// coverage.h — Coverage: marks for rare paths, counted per run.
//
// Why: a simulator that never reaches "a write completed after its
// transfer was aborted" proves nothing about it. Each mark names such a
// path; a run reports which it hit, and CI fails when a required mark was
// never hit across its seeds.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace kvrelay::sim {

enum class Mark : uint8_t {
  kPullBeforeClaim,          // a pull created a placeholder
  kAnsweredFromTombstone,    // a late pull failed fast
  kWriteDoneAfterEnd,        // a write completed after its send ended
  kReleaseWhileLoading,      // D released a load in flight
  kReleaseBeforeAlloc,       // D released before allocating
  kReadyRefused,             // P's prefill finished after the send ended
  kSendExpired,              // a READY send expired unpulled
  kDeadlineAtAdmission,      // the re-check after taking a sender fired
  kDeadlineTimer,            // a pull's deadline fired while it waited
  kWriteFailed,
  kProducerGivenUp,          // D gave up on a producer
  kLateAnswerDropped,        // D dropped an answer for an ended load
  kLoadCutShort,             // abort_transfers cut a load short
  kLoadFailedRecompute,      // a failed load recomputed
  kLoadFailedError,          // a failed load ended the request with an error
  kMultiProducer,            // a load fanned out to >1 P rank
  kMultiConsumer,            // a send needed >1 D rank
  kConnectionDropped,
  kPartition,
  kCrash,
  kStaleIncarnation,         // a message from a dead incarnation was dropped
  kDuplicateTransferRejected,
  kPoolPressure,             // a running request was preempted for blocks
  kPrefixHit,                // a prefix-cache hit
  kOpPause,                  // lifecycle operations issued
  kOpSleep,
  kOpReleaseKv,
  kOpUpdateWeights,
  kPullResent,               // D resent an unanswered pull after a reconnect
  kReanswered,               // P repeated an answer for a resent pull
  kLeaseExpired,             // read mode: a lease ran out and P freed
  kLeaseExpiredRevoking,     //   ... while a revoke went unanswered
  kLeaseExtended,            // a heartbeat moved a lease's end
  kRevokeSent,               // P ended a lease early by revoking it
  kRevokeWaitedForRead,      // D answered a revoke only after its read landed
  kNoticeAfterEnd,           // a done/failed/release came after the lease ended
  kGrantTooLate,             // D did not read: too little lease left
  kReadFailed,
  kFastAbort,                // P's server ended a send straight at its ranks
  kFastAbortBeforeClaim,     //   ... before the engine's claim reached the rank
  kRouterRelease,            // the router released a transfer at P (a request that failed)
  kRouterReleaseEndedSend,   //   ... and that ended a send P still held
  kProducerToken,            // D emitted the first token P handed over
  kQueueWaitExpired,         // a request with no token ended at max_queue_wait
  // The control channel (core/rank_session.h):
  kPeerDown,                 // a silent P was marked down
  kPeerGone,                 // ... and gone, by silence
  kPeerExited,               // a P was gone at once: its lane closed, its process exited
  kStaleHandshake,           // a reply of an older incarnation was dropped
  kPeerCameBack,             // a down or gone P answered again (pulls resent)
  kProducersUnknown,         // a D leg gave up waiting for its producers' handshake
  kWriteRefusedNoGrant,      // a write (read) outside the grants was refused
  kLaneOpened,
  kCrashStayedDown,          // a crashed engine stayed away before restarting
  kPullMisaddressed,         // a restarted P dropped a pull meant for its previous life
  kFreedUnderRevokedWrite,   // D freed blocks a write was still headed for, its grant revoked
  // chunk-wise hand-off (stream_chunks)
  kStreamed,                 // P handed a prompt chunk over while its prefill ran
  kChunkWrite,               // a pull was written in more than one chunk
  kStreamEnded,              // a send ended while its request still streamed
  kProgressRefused,          // a chunk came after its send had ended
  kStreamParked,             // a streaming request was preempted, its blocks parked
  kCount
};

std::string_view MarkName(Mark m);

struct Coverage {
  std::array<uint64_t, static_cast<size_t>(Mark::kCount)> hits{};
  void Hit(Mark m, uint64_t n = 1) { hits[static_cast<size_t>(m)] += n; }
  uint64_t Of(Mark m) const { return hits[static_cast<size_t>(m)]; }
  void Add(const Coverage& o) {
    for (size_t i = 0; i < hits.size(); ++i) hits[i] += o.hits[i];
  }
};

}  // namespace kvrelay::sim
