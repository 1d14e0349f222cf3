// relay_logic.h — RelayLogic: the decisions for one client request relayed
// through a P leg and a D leg, as a pure state machine.
//
// Why: which leg's failure wins, when the other leg is cancelled, what the
// client sees and when the response status is committed are the router's
// whole failure semantics; as a pure class a test can drive every ordering
// of events without sockets or threads. Relay (relay.h) feeds it the legs'
// events and performs what it asks for.
//
// Rules (first decisive event wins; later ones are ignored):
//   - a leg answering 4xx: the client gets that status and body as is
//     (outcome bad_request); the other leg is cancelled.
//   - P failing (transport error, a status other than 200 or 4xx, a body
//     that is not a completion, finish_reason "error"): outcome
//     prefill_failed, D is cancelled, the client gets "prefill failed: ...".
//   - D failing likewise (or an {"error": ...} event in its stream): outcome
//     decode_failed, P is cancelled.
//   - an engine aborting the request (finish_reason "abort": abort_requests,
//     a pause or sleep in abort mode): outcome aborted; the client gets what
//     a plain engine sends, a completion with finish_reason "abort" (200) —
//     D's answer as is, or P's (without its kv_transfer_params) with D
//     cancelled.
//   - P succeeding decides nothing: D pulls the KV and answers. Nor does
//     any end of P's leg once D's stream relayed its final event.
//   - D finishing well (its whole JSON body with a good finish_reason, or
//     its stream's "data: [DONE]" after a good final event): outcome ok.
//   - the client going away: outcome client_disconnect, both cancelled.
//   - shutdown: outcome shutdown, both cancelled.
// Release: once the outcome is anything but ok (or shutdown, whose D leg,
// cancelled, makes D release over the wire itself) and P's leg is over,
// P's KV will never be pulled through this request: release_prefill() asks
// Relay to tell P so (POST /kv_release), once — unless P answered the leg
// with a status other than 200: it refused or failed the request and holds
// nothing of it, and the transfer id may be another request's (a 409 for a
// duplicate id), whose hand-off a release would end. A D that crashed before it
// pulled can no longer release; without this P would hold the blocks until
// its --abort-timeout-s. When D did release (it aborted, refused or saw its
// client leave), P finds the send already ended and does nothing.
// Commit: a non-streamed response is never committed before the outcome
// is known (ReadyToCommit() is decided()); a failure is then a whole reply:
// 502 with {"error": {"message", "type": "upstream_error", "code": 502}}
// (503 "server_error" for shutdown and queue_wait_expired). A stream is
// committed (200 and the event-stream head) at its first event; a failure
// after that is a last SSE event with that error object, then
// "data: [DONE]".
//
// Streams are relayed whole event by event (SseSplitter); D's keep-alive
// comments are dropped (Relay writes its own). D's final event with
// finish_reason "error"/"abort" is relayed, then the error event.
//
// Thread safety: none; Relay serializes calls under its mutex.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/release_rule.h"
#include "router/sse_splitter.h"

namespace kvrelay::router {

enum class Outcome : uint8_t {
  kPending,
  kOk,
  kClientDisconnect,
  kPrefillFailed,
  kDecodeFailed,
  kBadRequest,
  kRejected,   // refused before any leg started (at capacity, no engine up)
  kShutdown,
  kQueueWaitExpired,  // no token within --max-queue-wait-s: both legs cancelled
  kAborted,  // an engine aborted it (abort_requests, a pause): finish_reason "abort", 200
};
inline constexpr size_t kOutcomeCount = static_cast<size_t>(Outcome::kAborted) + 1;
// "pending", "ok", "client_disconnect", "prefill_failed", "decode_failed",
// "bad_request", "rejected", "shutdown", "queue_wait_expired", "aborted".
std::string_view OutcomeName(Outcome outcome);

// How one leg's HTTP call ended.
struct LegEnd {
  enum class Kind : uint8_t {
    kResponse,         // a whole HTTP response arrived
    kTransportError,   // connecting, sending or reading failed
    kCancelled,        // the router stopped it
  };
  Kind kind = Kind::kResponse;
  int status = 0;       // kResponse: the HTTP status
  std::string body;     // kResponse: the body (D with status 200: empty, it
                        // came through DecodeData)
  std::string error;    // kTransportError: what failed, for the message
  // kTransportError: the connection failed or broke (the engine may be down
  // or restarted), as opposed to an answer the router refused.
  bool connection_failed = false;
};

// A whole reply for a client whose response is not committed yet.
struct ClientReply {
  int status = 0;
  std::string content_type;
  std::string body;
};

class RelayLogic {
 public:
  explicit RelayLogic(bool stream) : stream_(stream) {}

  // --- inputs -----------------------------------------------------------
  void PrefillEnded(const LegEnd& end);
  void DecodeStatus(int status);
  // Body bytes of D's 200 answer, in order.
  void DecodeData(std::string_view bytes);
  void DecodeEnded(const LegEnd& end);
  void ClientGone();
  void Shutdown();
  // The request produced no token within the router's --max-queue-wait-s
  // (an engine paused or asleep holds it): it fails, both legs cancelled.
  // A token is P's leg ending ok (its prefill made the first token) or a
  // token D streamed; a non-streamed D leg after that is bounded by D's
  // own --max-queue-wait-s. Does nothing once decided.
  void QueueWaitExpired(double waited_s);
  // The client was sent status 200 and headers.
  void Commit();

  // --- outputs ----------------------------------------------------------
  Outcome outcome() const { return outcome_; }
  bool decided() const { return outcome_ != Outcome::kPending; }
  bool committed() const { return committed_; }
  bool stream() const { return stream_; }
  bool prefill_done() const { return p_done_; }
  bool decode_done() const { return d_done_; }
  // The leg should be stopped now (stays true once set).
  bool cancel_prefill() const { return cancel_p_; }
  bool cancel_decode() const { return cancel_d_; }
  // P's transfer should be ended at P (see "Release" above, the rule is
  // core/release_rule.h's); stays true.
  bool release_prefill() const;
  // The outcome as the release rule sees it.
  RequestVerdict verdict() const;
  // The client's response may be committed: an outcome is known, or (a
  // stream) events wait to be written.
  bool ReadyToCommit() const;
  // REQUIRES: decided() && !committed().
  ClientReply Reply() const;
  // Committed: true if TakeBody() has something to write (or the end).
  bool HasBody() const { return !out_.empty() || (decided() && !finished_); }
  // Committed: the bytes to write now; *finished when they end the response
  // (then later calls return "" and *finished true). *has_tokens when they
  // hold a stream event with token ids.
  std::string TakeBody(bool* finished, bool* has_tokens);
  const std::string& failure_message() const { return message_; }

 private:
  void Fail(Outcome outcome, std::string message);
  void PassThrough(int status, std::string body);
  void Succeed();
  void OnEvent(const std::string& event);
  // An engine aborted the request: `body` (a completion with finish_reason
  // "abort") is what the client gets.
  void Aborted(const nlohmann::json& completion);
  void AppendTail();

  const bool stream_;
  bool committed_ = false;
  Outcome outcome_ = Outcome::kPending;
  bool cancel_p_ = false, cancel_d_ = false;
  bool p_done_ = false, p_ok_ = false;
  bool p_refused_ = false;   // P answered with a status other than 200
  bool d_done_ = false;
  int d_status_ = 0;
  // Stream: D's events parsed so far.
  SseSplitter sse_;
  bool final_seen_ = false;
  bool final_failed_ = false;
  bool final_aborted_ = false;
  // Non-stream: D's body so far.
  std::string d_body_;
  // What the client gets: stream events to relay (or the whole body).
  std::string out_;
  bool out_has_tokens_ = false;
  bool streamed_tokens_ = false;  // D streamed a token (for QueueWaitExpired)
  bool finished_ = false;      // the end of the response was taken
  // The decided reply's parts.
  int reply_status_ = 200;
  std::string reply_body_;     // bad_request: the engine's body
  std::string message_;        // a failure's message
};

}  // namespace kvrelay::router
