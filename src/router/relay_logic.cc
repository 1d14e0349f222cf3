#include "router/relay_logic.h"

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "core/release_rule.h"
#include "router/leg_bodies.h"
#include "server/completion_response.h"

namespace kvrelay::router {

using nlohmann::json;

std::string_view OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPending: return "pending";
    case Outcome::kOk: return "ok";
    case Outcome::kClientDisconnect: return "client_disconnect";
    case Outcome::kPrefillFailed: return "prefill_failed";
    case Outcome::kDecodeFailed: return "decode_failed";
    case Outcome::kBadRequest: return "bad_request";
    case Outcome::kRejected: return "rejected";
    case Outcome::kShutdown: return "shutdown";
    case Outcome::kQueueWaitExpired: return "queue_wait_expired";
    case Outcome::kAborted: return "aborted";
  }
  return "?";
}

namespace {

bool Is4xx(int status) { return status >= 400 && status < 500; }

std::string FinishMessage(const char* leg, const CompletionVerdict& v) {
  std::string m = std::string(leg) + " failed: finish_reason " + v.finish_reason;
  if (!v.error.empty()) m += ": " + v.error;
  return m;
}

std::string StatusMessage(const char* leg, int status, std::string_view body) {
  return std::string(leg) + " failed: HTTP " + std::to_string(status) + ": " +
         UpstreamErrorMessage(body);
}

bool HasTokens(const json& j) {
  if (!j.is_object()) return false;
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty()) return false;
  const json& c = (*choices)[0];
  if (!c.is_object()) return false;
  auto ids = c.find("token_ids");
  return ids != c.end() && ids->is_array() && !ids->empty();
}

}  // namespace

void RelayLogic::Fail(Outcome outcome, std::string message) {
  if (decided()) return;
  outcome_ = outcome;
  message_ = std::move(message);
  cancel_p_ = cancel_d_ = true;
  if (committed_) AppendTail();
}

void RelayLogic::PassThrough(int status, std::string body) {
  if (decided()) return;
  outcome_ = Outcome::kBadRequest;
  reply_status_ = status;
  reply_body_ = std::move(body);
  cancel_p_ = cancel_d_ = true;
  if (committed_) AppendTail();
}

void RelayLogic::Succeed() {
  KV_CHECK(!decided());
  outcome_ = Outcome::kOk;
}

// After Commit(): what ends the response, given the outcome.
void RelayLogic::AppendTail() {
  std::string error;
  switch (outcome_) {
    case Outcome::kPending:
    case Outcome::kOk:
    case Outcome::kAborted:
    case Outcome::kClientDisconnect:
      return;
    case Outcome::kBadRequest: {
      const json j = json::parse(TrimLeadingSpace(reply_body_), nullptr, false);
      error = j.is_discarded()
                  ? server::ErrorJson(UpstreamErrorMessage(reply_body_),
                                      "invalid_request_error", reply_status_)
                  : j.dump();
      break;
    }
    case Outcome::kShutdown:
    case Outcome::kQueueWaitExpired:
      error = server::ErrorJson(message_, "server_error", 503);
      break;
    default:
      error = server::ErrorJson(message_, "upstream_error", 502);
      break;
  }
  if (stream_) {
    out_ += server::SseEvent(error);
    out_ += server::SseDone();
  } else {
    out_ += error;
  }
}

RequestVerdict RelayLogic::verdict() const {
  switch (outcome_) {
    case Outcome::kPending: return RequestVerdict::kOpen;
    case Outcome::kOk: return RequestVerdict::kSucceeded;
    case Outcome::kShutdown: return RequestVerdict::kShutdown;
    case Outcome::kRejected: return RequestVerdict::kRejected;
    case Outcome::kClientDisconnect:
    case Outcome::kPrefillFailed:
    case Outcome::kDecodeFailed:
    case Outcome::kBadRequest:
    case Outcome::kQueueWaitExpired:
    case Outcome::kAborted:
      return RequestVerdict::kFailed;
  }
  KV_CHECK_MSG(false, "an outcome without a verdict");
  return RequestVerdict::kFailed;
}

bool RelayLogic::release_prefill() const {
  return RouterReleasesPrefill(p_done_, !p_refused_, verdict());
}

void RelayLogic::PrefillEnded(const LegEnd& end) {
  p_done_ = true;
  p_refused_ = end.kind == LegEnd::Kind::kResponse && end.status != 200;
  if (decided()) return;
  // D's final event is relayed: the client has its whole completion, and
  // D's [DONE] decides (ok, or aborted as that event said). Anything P's
  // leg added now would follow the choice that carried finish_reason (both
  // engines aborting at once: proc_matrix's sleep2-abort-both, together).
  if (final_seen_) return;
  switch (end.kind) {
    case LegEnd::Kind::kCancelled:
      return Fail(Outcome::kPrefillFailed, "prefill failed: the leg was cancelled");
    case LegEnd::Kind::kTransportError:
      return Fail(Outcome::kPrefillFailed, "prefill failed: " + end.error);
    case LegEnd::Kind::kResponse:
      break;
  }
  if (Is4xx(end.status)) return PassThrough(end.status, end.body);
  if (end.status != 200) {
    return Fail(Outcome::kPrefillFailed, StatusMessage("prefill", end.status, end.body));
  }
  const CompletionVerdict v = JudgeCompletion(end.body);
  if (!v.parsed) {
    return Fail(Outcome::kPrefillFailed, "prefill failed: the answer is not a completion: " +
                                             UpstreamErrorMessage(end.body));
  }
  if (v.failed()) return Fail(Outcome::kPrefillFailed, FinishMessage("prefill", v));
  if (v.aborted()) {
    json j = json::parse(TrimLeadingSpace(end.body), nullptr, false);
    j["kv_transfer_params"] = nullptr;
    return Aborted(j);
  }
  p_ok_ = true;
}

void RelayLogic::Aborted(const json& completion) {
  if (decided()) return;
  outcome_ = Outcome::kAborted;
  cancel_p_ = cancel_d_ = true;
  if (!stream_) {
    out_ = completion.dump(-1, ' ', false, json::error_handler_t::replace);
    return;
  }
  // As the stream a plain engine sends: the choice (with finish_reason) as
  // a chunk, then the end.
  const json chunk = AsStreamChunk(completion, /*first=*/!streamed_tokens_);
  out_ += server::SseEvent(chunk.dump(-1, ' ', false, json::error_handler_t::replace));
  out_ += server::SseDone();
}

void RelayLogic::DecodeStatus(int status) { d_status_ = status; }

void RelayLogic::DecodeData(std::string_view bytes) {
  if (decided()) return;
  if (!stream_) {
    d_body_.append(bytes);
    return;
  }
  sse_.Feed(bytes);
  while (!decided()) {
    std::optional<std::string> event = sse_.Next();
    if (!event) break;
    OnEvent(*event);
  }
}

void RelayLogic::OnEvent(const std::string& event) {
  const std::optional<std::string> data = SseSplitter::DataOf(event);
  if (!data) return;   // a comment (keep-alive): Relay writes its own
  if (*data == "[DONE]") {
    if (final_seen_ && !final_failed_) {
      out_ += server::SseDone();
      if (final_aborted_) {
        outcome_ = Outcome::kAborted;
        cancel_p_ = cancel_d_ = true;
      } else {
        Succeed();
      }
    } else {
      Fail(Outcome::kDecodeFailed, "decode failed: the stream ended without a final event");
    }
    return;
  }
  const json j = json::parse(*data, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    // D failed mid-stream; the tail says so in the router's words.
    return Fail(Outcome::kDecodeFailed, "decode failed: " + UpstreamErrorMessage(*data));
  }
  out_ += server::SseEvent(*data);
  if (j.is_discarded()) return;   // not ours to judge: relayed as is
  if (HasTokens(j)) out_has_tokens_ = streamed_tokens_ = true;
  const CompletionVerdict v = JudgeCompletionJson(j);
  if (v.finish_reason.empty()) return;
  final_seen_ = true;
  final_aborted_ = v.aborted();
  if (v.failed()) {
    final_failed_ = true;
    Fail(Outcome::kDecodeFailed, FinishMessage("decode", v));
  }
}

void RelayLogic::DecodeEnded(const LegEnd& end) {
  d_done_ = true;
  if (decided()) return;
  switch (end.kind) {
    case LegEnd::Kind::kCancelled:
      return Fail(Outcome::kDecodeFailed, "decode failed: the leg was cancelled");
    case LegEnd::Kind::kTransportError:
      return Fail(Outcome::kDecodeFailed, "decode failed: " + end.error);
    case LegEnd::Kind::kResponse:
      break;
  }
  if (Is4xx(end.status)) return PassThrough(end.status, end.body);
  if (end.status != 200) {
    return Fail(Outcome::kDecodeFailed, StatusMessage("decode", end.status, end.body));
  }
  if (stream_) {
    return Fail(Outcome::kDecodeFailed, "decode failed: the stream ended before data: [DONE]");
  }
  const CompletionVerdict v = JudgeCompletion(d_body_);
  if (!v.parsed) {
    return Fail(Outcome::kDecodeFailed, "decode failed: the answer is not a completion: " +
                                            UpstreamErrorMessage(d_body_));
  }
  if (v.failed()) return Fail(Outcome::kDecodeFailed, FinishMessage("decode", v));
  out_ = std::string(TrimLeadingSpace(d_body_));
  d_body_.clear();
  if (v.aborted()) {
    outcome_ = Outcome::kAborted;
    cancel_p_ = cancel_d_ = true;
    return;
  }
  Succeed();
}

void RelayLogic::ClientGone() {
  if (decided()) return;
  outcome_ = Outcome::kClientDisconnect;
  cancel_p_ = cancel_d_ = true;
}

void RelayLogic::Shutdown() { Fail(Outcome::kShutdown, "the router is shutting down"); }

void RelayLogic::QueueWaitExpired(double waited_s) {
  if (decided() || p_ok_ || streamed_tokens_) return;
  char m[160];
  std::snprintf(m, sizeof m,
                "no token within max_queue_wait (%.0f s): an engine is paused, asleep or "
                "overloaded", waited_s);
  Fail(Outcome::kQueueWaitExpired, m);
}

void RelayLogic::Commit() {
  KV_CHECK(!committed_);
  committed_ = true;
  if (decided()) AppendTail();
}

bool RelayLogic::ReadyToCommit() const { return decided() || (stream_ && !out_.empty()); }

ClientReply RelayLogic::Reply() const {
  KV_CHECK(decided() && !committed_);
  ClientReply r;
  r.content_type = "application/json";
  switch (outcome_) {
    case Outcome::kOk:
    case Outcome::kAborted:
      r.status = 200;
      if (stream_) r.content_type = "text/event-stream";
      r.body = out_;
      break;
    case Outcome::kBadRequest:
      r.status = reply_status_;
      r.body = reply_body_;
      break;
    case Outcome::kShutdown:
    case Outcome::kRejected:
    case Outcome::kQueueWaitExpired:
      r.status = 503;
      r.body = server::ErrorJson(message_, "server_error", 503);
      break;
    case Outcome::kClientDisconnect:
      r.status = 499;
      r.body = server::ErrorJson("the client went away", "client_error", 499);
      break;
    default:
      r.status = 502;
      r.body = server::ErrorJson(message_, "upstream_error", 502);
      break;
  }
  return r;
}

std::string RelayLogic::TakeBody(bool* finished, bool* has_tokens) {
  KV_CHECK(committed_);
  std::string out = std::move(out_);
  out_.clear();
  *has_tokens = out_has_tokens_;
  out_has_tokens_ = false;
  *finished = decided();
  if (*finished) finished_ = true;
  return out;
}

}  // namespace kvrelay::router
