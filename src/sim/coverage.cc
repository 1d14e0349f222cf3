#include "sim/coverage.h"

namespace kvrelay::sim {

std::string_view MarkName(Mark m) {
  switch (m) {
    case Mark::kPullBeforeClaim: return "pull_before_claim";
    case Mark::kAnsweredFromTombstone: return "answered_from_tombstone";
    case Mark::kWriteDoneAfterEnd: return "write_done_after_end";
    case Mark::kReleaseWhileLoading: return "release_while_loading";
    case Mark::kReleaseBeforeAlloc: return "release_before_alloc";
    case Mark::kReadyRefused: return "ready_refused";
    case Mark::kSendExpired: return "send_expired";
    case Mark::kDeadlineAtAdmission: return "deadline_at_admission";
    case Mark::kDeadlineTimer: return "deadline_timer";
    case Mark::kWriteFailed: return "write_failed";
    case Mark::kProducerGivenUp: return "producer_given_up";
    case Mark::kLateAnswerDropped: return "late_answer_dropped";
    case Mark::kLoadCutShort: return "load_cut_short";
    case Mark::kLoadFailedRecompute: return "load_failed_recompute";
    case Mark::kLoadFailedError: return "load_failed_error";
    case Mark::kMultiProducer: return "multi_producer";
    case Mark::kMultiConsumer: return "multi_consumer";
    case Mark::kConnectionDropped: return "connection_dropped";
    case Mark::kPartition: return "partition";
    case Mark::kCrash: return "crash";
    case Mark::kStaleIncarnation: return "stale_incarnation";
    case Mark::kDuplicateTransferRejected: return "duplicate_transfer_rejected";
    case Mark::kPoolPressure: return "pool_pressure";
    case Mark::kPrefixHit: return "prefix_hit";
    case Mark::kOpPause: return "op_pause";
    case Mark::kOpSleep: return "op_sleep";
    case Mark::kOpReleaseKv: return "op_release_kv";
    case Mark::kOpUpdateWeights: return "op_update_weights";
    case Mark::kPullResent: return "pull_resent";
    case Mark::kReanswered: return "reanswered";
    case Mark::kLeaseExpired: return "lease_expired";
    case Mark::kLeaseExpiredRevoking: return "lease_expired_revoking";
    case Mark::kLeaseExtended: return "lease_extended";
    case Mark::kRevokeSent: return "revoke_sent";
    case Mark::kRevokeWaitedForRead: return "revoke_waited_for_read";
    case Mark::kNoticeAfterEnd: return "notice_after_end";
    case Mark::kGrantTooLate: return "grant_too_late";
    case Mark::kReadFailed: return "read_failed";
    case Mark::kFastAbort: return "fast_abort";
    case Mark::kFastAbortBeforeClaim: return "fast_abort_before_claim";
    case Mark::kRouterRelease: return "router_release";
    case Mark::kRouterReleaseEndedSend: return "router_release_ended_send";
    case Mark::kProducerToken: return "producer_token";
    case Mark::kQueueWaitExpired: return "queue_wait_expired";
    case Mark::kPeerDown: return "peer_down";
    case Mark::kPeerGone: return "peer_gone_by_silence";
    case Mark::kPeerExited: return "peer_exited_lane_closed";
    case Mark::kStaleHandshake: return "stale_handshake_dropped";
    case Mark::kPeerCameBack: return "peer_came_back";
    case Mark::kProducersUnknown: return "producers_unknown";
    case Mark::kWriteRefusedNoGrant: return "write_refused_no_grant";
    case Mark::kLaneOpened: return "lane_opened";
    case Mark::kCrashStayedDown: return "crash_stayed_down";
    case Mark::kPullMisaddressed: return "pull_misaddressed";
    case Mark::kFreedUnderRevokedWrite: return "freed_under_revoked_write";
    case Mark::kStreamed: return "streamed";
    case Mark::kChunkWrite: return "chunk_write";
    case Mark::kStreamEnded: return "stream_ended";
    case Mark::kProgressRefused: return "progress_refused";
    case Mark::kStreamParked: return "stream_parked";
    case Mark::kCount: break;
  }
  return "?";
}

}  // namespace kvrelay::sim
