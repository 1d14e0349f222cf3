#include "router/relay_logic.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kvrelay::router {
namespace {

using nlohmann::json;

const char* kPrefillOk =
    R"({"choices":[{"token_ids":[7],"finish_reason":"length"}],"kv_transfer_params":{}})";
const char* kDecodeOk = R"({"choices":[{"token_ids":[7,8,9],"finish_reason":"length"}]})";

LegEnd Response(int status, std::string body) {
  LegEnd e;
  e.kind = LegEnd::Kind::kResponse;
  e.status = status;
  e.body = std::move(body);
  return e;
}
LegEnd Transport(std::string error) {
  LegEnd e;
  e.kind = LegEnd::Kind::kTransportError;
  e.error = std::move(error);
  e.connection_failed = true;
  return e;
}
LegEnd Cancelled() {
  LegEnd e;
  e.kind = LegEnd::Kind::kCancelled;
  return e;
}

std::string Chunk(std::vector<int> ids) {
  return "data: " + json{{"choices", {{{"token_ids", ids}, {"finish_reason", nullptr}}}}}.dump() +
         "\n\n";
}
std::string Final(const char* reason) {
  return "data: " + json{{"choices", {{{"token_ids", {7, 8}}, {"finish_reason", reason}}}}}.dump() +
         "\n\n";
}

json ErrorOf(const std::string& body) {
  const json j = json::parse(body);
  return j.at("error");
}

// A non-streamed response is committed only once its outcome is known, so
// its status is the outcome's.
TEST(RelayLogicTest, NonStreamHappyPath) {
  RelayLogic l(false);
  EXPECT_FALSE(l.ReadyToCommit());
  l.DecodeStatus(200);
  EXPECT_FALSE(l.ReadyToCommit());   // P has not answered yet
  l.PrefillEnded(Response(200, std::string("   ") + kPrefillOk));
  EXPECT_FALSE(l.ReadyToCommit());   // nor has D
  EXPECT_FALSE(l.decided());
  EXPECT_FALSE(l.cancel_prefill() || l.cancel_decode());
  l.DecodeData("  ");
  l.DecodeData(std::string(kDecodeOk).substr(0, 10));
  l.DecodeData(std::string(kDecodeOk).substr(10));
  EXPECT_FALSE(l.ReadyToCommit());
  l.DecodeEnded(Response(200, ""));
  EXPECT_EQ(l.outcome(), Outcome::kOk);
  ASSERT_TRUE(l.ReadyToCommit());
  const ClientReply r = l.Reply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, kDecodeOk);   // D's leading spaces dropped
  EXPECT_FALSE(l.cancel_prefill() || l.cancel_decode());
}

// An engine's abort ends the request as a plain engine's does: 200 with
// finish_reason "abort", never a 502.
TEST(RelayLogicTest, AnAbortOnEitherEngineIsA200WithFinishReasonAbort) {
  {
    RelayLogic l(false);   // P aborted: its completion, without kv_transfer_params
    l.PrefillEnded(Response(
        200, R"({"choices":[{"text":"a","finish_reason":"abort"}],"kv_transfer_params":{"x":1}})"));
    EXPECT_EQ(l.outcome(), Outcome::kAborted);
    EXPECT_TRUE(l.cancel_decode());
    const ClientReply r = l.Reply();
    EXPECT_EQ(r.status, 200);
    const json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "abort");
    EXPECT_TRUE(j["kv_transfer_params"].is_null());
  }
  {
    RelayLogic l(true);    // P aborted, streamed: one chunk, then [DONE]
    l.PrefillEnded(Response(200, R"({"choices":[{"finish_reason":"abort"}],"usage":{}})"));
    EXPECT_EQ(l.outcome(), Outcome::kAborted);
    const ClientReply r = l.Reply();
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.content_type, "text/event-stream");
    EXPECT_EQ(r.body, "data: {\"choices\":[{\"finish_reason\":\"abort\"}]}\n\ndata: [DONE]\n\n");
  }
  {
    RelayLogic l(true);    // P aborted a streamed chat: its message as a chunk's delta
    l.PrefillEnded(Response(200, R"({"object":"chat.completion","choices":[{"index":0,)"
                                 R"("message":{"role":"assistant","content":"a"},)"
                                 R"("finish_reason":"abort"}],"usage":{}})"));
    EXPECT_EQ(l.Reply().body,
              "data: {\"choices\":[{\"delta\":{\"content\":\"a\",\"role\":\"assistant\"},"
              "\"finish_reason\":\"abort\",\"index\":0}],\"object\":\"chat.completion.chunk\"}"
              "\n\ndata: [DONE]\n\n");
  }
  {
    RelayLogic l(false);   // D aborted: its answer as is
    l.PrefillEnded(Response(200, kPrefillOk));
    l.DecodeStatus(200);
    l.DecodeData(R"({"choices":[{"finish_reason":"abort"}]})");
    l.DecodeEnded(Response(200, ""));
    EXPECT_EQ(l.outcome(), Outcome::kAborted);
    EXPECT_EQ(l.Reply().status, 200);
    EXPECT_EQ(l.Reply().body, R"({"choices":[{"finish_reason":"abort"}]})");
  }
}

// --max-queue-wait-s: no token yet (P's leg still open: P paused or
// asleep) fails the request and cancels both legs; once P's leg ended ok
// (its prefill made the first token) or D streamed a token, it does nothing.
TEST(RelayLogicTest, QueueWaitExpiresOnlyBeforeTheFirstToken) {
  {
    RelayLogic l(false);
    l.DecodeStatus(200);
    l.Commit();
    l.QueueWaitExpired(300);
    EXPECT_EQ(l.outcome(), Outcome::kQueueWaitExpired);
    EXPECT_TRUE(l.cancel_prefill() && l.cancel_decode());
    bool finished = false, tokens = false;
    const std::string body = l.TakeBody(&finished, &tokens);
    EXPECT_NE(body.find("max_queue_wait"), std::string::npos) << body;
    EXPECT_EQ(OutcomeName(l.outcome()), "queue_wait_expired");
  }
  {
    RelayLogic l(false);
    l.DecodeStatus(200);
    l.PrefillEnded(Response(200, kPrefillOk));
    l.QueueWaitExpired(300);
    EXPECT_FALSE(l.decided()) << "P's prefill made the first token";
  }
  {
    RelayLogic l(true);
    l.DecodeStatus(200);
    l.DecodeData(Chunk({7}));
    l.QueueWaitExpired(300);
    EXPECT_FALSE(l.decided()) << "D streamed a token";
  }
  {
    RelayLogic l(false);  // before the commit: a whole 503 reply
    l.QueueWaitExpired(300);
    ASSERT_TRUE(l.decided());
    EXPECT_EQ(l.Reply().status, 503);
  }
}

TEST(RelayLogicTest, DecodeDoneBeforeCommitIsAWholeReply) {
  RelayLogic l(false);
  l.DecodeStatus(200);
  l.DecodeData(kDecodeOk);
  l.DecodeEnded(Response(200, ""));
  ASSERT_TRUE(l.decided());
  ClientReply r = l.Reply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(r.body, kDecodeOk);
  // P answering later changes nothing and is not cancelled.
  l.PrefillEnded(Transport("late"));
  EXPECT_EQ(l.outcome(), Outcome::kOk);
}

TEST(RelayLogicTest, PrefillTransportErrorBeforeCommitIs502AndCancelsDecode) {
  RelayLogic l(true);
  l.DecodeStatus(200);
  l.PrefillEnded(Transport("cannot connect to http://p:1"));
  EXPECT_EQ(l.outcome(), Outcome::kPrefillFailed);
  EXPECT_TRUE(l.cancel_decode());
  ClientReply r = l.Reply();
  EXPECT_EQ(r.status, 502);
  const json e = ErrorOf(r.body);
  EXPECT_EQ(e["message"], "prefill failed: cannot connect to http://p:1");
  EXPECT_EQ(e["type"], "upstream_error");
  EXPECT_EQ(e["code"], 502);
  // D's leg then ends cancelled: nothing changes.
  l.DecodeEnded(Cancelled());
  EXPECT_EQ(l.outcome(), Outcome::kPrefillFailed);
}

TEST(RelayLogicTest, PrefillFailuresOfEveryKind) {
  struct Case {
    LegEnd end;
    const char* message_has;
  } cases[] = {
      {Response(503, R"({"error":{"message":"engine not serving"}})"), "HTTP 503: engine not serving"},
      {Response(200, R"({"choices":[{"finish_reason":"error"}],"error":"kv lost"})"),
       "finish_reason error: kv lost"},
      {Response(200, "garbage"), "not a completion"},
      {Response(200, ""), "not a completion"},
  };
  for (const Case& c : cases) {
    RelayLogic l(false);
    l.PrefillEnded(c.end);
    ASSERT_EQ(l.outcome(), Outcome::kPrefillFailed) << c.message_has;
    EXPECT_TRUE(l.cancel_decode());
    const std::string m = ErrorOf(l.Reply().body)["message"];
    EXPECT_EQ(m.rfind("prefill failed: ", 0), 0u) << m;
    EXPECT_NE(m.find(c.message_has), std::string::npos) << m;
  }
}

TEST(RelayLogicTest, FourXxFromEitherLegPassesThroughAndCancelsTheOther) {
  const std::string body = R"({"error":{"message":"max_tokens too big","code":400}})";
  {
    RelayLogic l(false);
    l.PrefillEnded(Response(400, body));
    EXPECT_EQ(l.outcome(), Outcome::kBadRequest);
    EXPECT_TRUE(l.cancel_decode());
    ClientReply r = l.Reply();
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(r.body, body);
  }
  {
    RelayLogic l(true);
    l.DecodeStatus(429);
    l.DecodeEnded(Response(429, body));
    EXPECT_EQ(l.outcome(), Outcome::kBadRequest);
    EXPECT_TRUE(l.cancel_prefill());
    EXPECT_EQ(l.Reply().status, 429);
    EXPECT_EQ(l.Reply().body, body);
  }
}

TEST(RelayLogicTest, DecodeFailuresCancelPrefill) {
  {
    RelayLogic l(false);
    l.DecodeEnded(Transport("the connection to http://d:1 was lost (read failed)"));
    EXPECT_EQ(l.outcome(), Outcome::kDecodeFailed);
    EXPECT_TRUE(l.cancel_prefill());
    EXPECT_EQ(ErrorOf(l.Reply().body)["message"],
              "decode failed: the connection to http://d:1 was lost (read failed)");
  }
  {
    RelayLogic l(false);
    l.DecodeStatus(503);
    l.DecodeEnded(Response(503, R"({"error":{"message":"producer unreachable"}})"));
    EXPECT_EQ(l.outcome(), Outcome::kDecodeFailed);
    EXPECT_EQ(l.Reply().status, 502);
  }
  {
    RelayLogic l(false);
    l.DecodeStatus(200);
    l.DecodeData(R"({"choices":[{"finish_reason":"error"}],"error":"kv lost"})");
    l.DecodeEnded(Response(200, ""));
    EXPECT_EQ(l.outcome(), Outcome::kDecodeFailed);
    EXPECT_TRUE(l.cancel_prefill());
  }
}

TEST(RelayLogicTest, FailureAfterCommitGoesInTheJsonBody) {
  RelayLogic l(false);
  l.DecodeStatus(200);
  l.PrefillEnded(Response(200, kPrefillOk));
  l.Commit();
  l.DecodeData("   ");
  l.DecodeEnded(Transport("the connection to http://d:1 was lost (read failed)"));
  ASSERT_TRUE(l.HasBody());
  bool finished = false, tokens = false;
  const std::string body = l.TakeBody(&finished, &tokens);
  EXPECT_TRUE(finished);
  EXPECT_EQ(ErrorOf(body)["code"], 502);
}

TEST(RelayLogicTest, StreamRelaysEventsAndEndsWithDone) {
  RelayLogic l(true);
  l.DecodeStatus(200);
  l.DecodeData(": keep-alive\n\n");
  EXPECT_FALSE(l.ReadyToCommit());   // comments are not relayed
  const std::string c1 = Chunk({7});
  l.DecodeData(c1.substr(0, 5));
  EXPECT_FALSE(l.ReadyToCommit());
  l.DecodeData(c1.substr(5));
  EXPECT_TRUE(l.ReadyToCommit());    // bytes to write, even before P answered
  l.Commit();
  bool finished = false, tokens = false;
  EXPECT_EQ(l.TakeBody(&finished, &tokens), c1);
  EXPECT_TRUE(tokens);
  EXPECT_FALSE(finished);
  l.PrefillEnded(Response(200, kPrefillOk));
  const std::string fin = Final("length");
  l.DecodeData(fin + "data: [DONE]\n\n");
  EXPECT_EQ(l.outcome(), Outcome::kOk);
  EXPECT_EQ(l.TakeBody(&finished, &tokens), fin + "data: [DONE]\n\n");
  EXPECT_TRUE(finished);
  EXPECT_TRUE(tokens);
  l.DecodeEnded(Response(200, ""));
  EXPECT_EQ(l.outcome(), Outcome::kOk);
  EXPECT_FALSE(l.cancel_prefill() || l.cancel_decode());
}

TEST(RelayLogicTest, PrefillFailureMidStreamEndsWithAnErrorEventThenDone) {
  RelayLogic l(true);
  l.DecodeStatus(200);
  l.DecodeData(Chunk({7}));
  l.Commit();
  bool finished = false, tokens = false;
  (void)l.TakeBody(&finished, &tokens);
  l.PrefillEnded(Transport("the connection to http://p:1 was lost (read failed)"));
  EXPECT_TRUE(l.cancel_decode());
  l.DecodeData(Chunk({8}));   // after the decision: dropped
  const std::string tail = l.TakeBody(&finished, &tokens);
  EXPECT_TRUE(finished);
  const std::string prefix = "data: ";
  ASSERT_EQ(tail.rfind(prefix, 0), 0u) << tail;
  const size_t end = tail.find("\n\n");
  const json e = ErrorOf(tail.substr(prefix.size(), end - prefix.size()));
  EXPECT_EQ(e["message"],
            "prefill failed: the connection to http://p:1 was lost (read failed)");
  EXPECT_EQ(e["type"], "upstream_error");
  EXPECT_EQ(tail.substr(end + 2), "data: [DONE]\n\n");
}

// A stream committed at D's first event, which was taken.
void CommitAtFirstEvent(RelayLogic& l) {
  l.DecodeStatus(200);
  l.DecodeData(Chunk({7}));
  ASSERT_TRUE(l.ReadyToCommit());   // a stream commits at its first event
  l.Commit();
  bool finished = false, tokens = false;
  (void)l.TakeBody(&finished, &tokens);
}

TEST(RelayLogicTest, StreamFinalAbortIsRelayedAsIs) {
  RelayLogic l(true);
  ASSERT_NO_FATAL_FAILURE(CommitAtFirstEvent(l));
  bool finished = false, tokens = false;
  l.DecodeData(Final("abort") + "data: [DONE]\n\n");
  EXPECT_EQ(l.outcome(), Outcome::kAborted);
  EXPECT_TRUE(l.cancel_prefill());
  const std::string tail = l.TakeBody(&finished, &tokens);
  EXPECT_TRUE(finished);
  EXPECT_EQ(tail, Final("abort") + "data: [DONE]\n\n");
}

// D's final event relayed before P's leg ends (both engines aborted the
// request at once): whatever P's leg then says adds nothing after that
// event, and D's [DONE] ends the stream as the event said.
TEST(RelayLogicTest, PrefillEndingAfterDecodesFinalEventAddsNothing) {
  const std::vector<LegEnd> p_ends = {
      Response(200, R"({"choices":[{"text":"a","finish_reason":"abort"}]})"),
      Response(200, R"({"choices":[{"finish_reason":"error"}]})"), Response(503, "busy"),
      Transport("connection reset"), Cancelled()};
  for (const char* d_final : {"abort", "length"}) {
    for (const LegEnd& p_end : p_ends) {
      SCOPED_TRACE(std::string(d_final) + " / " + std::to_string(p_end.status) + " " +
                   p_end.body + p_end.error);
      RelayLogic l(true);
      ASSERT_NO_FATAL_FAILURE(CommitAtFirstEvent(l));
      l.DecodeData(Final(d_final));
      l.PrefillEnded(p_end);
      EXPECT_EQ(l.outcome(), Outcome::kPending);
      l.DecodeData("data: [DONE]\n\n");
      EXPECT_EQ(l.outcome(), std::string(d_final) == "abort" ? Outcome::kAborted : Outcome::kOk);
      bool finished = false, tokens = false;
      EXPECT_EQ(l.TakeBody(&finished, &tokens), Final(d_final) + "data: [DONE]\n\n");
      EXPECT_TRUE(finished);
    }
  }
}

// D's error event (its request failed mid-stream) is a decode failure in
// the router's words, then the end.
TEST(RelayLogicTest, StreamErrorEventIsADecodeFailure) {
  RelayLogic l(true);
  ASSERT_NO_FATAL_FAILURE(CommitAtFirstEvent(l));
  bool finished = false, tokens = false;
  l.DecodeData("data: {\"error\":{\"message\":\"kv lost\",\"code\":503}}\n\ndata: [DONE]\n\n");
  EXPECT_EQ(l.outcome(), Outcome::kDecodeFailed);
  const std::string tail = l.TakeBody(&finished, &tokens);
  EXPECT_TRUE(finished);
  EXPECT_NE(tail.find("decode failed: kv lost"), std::string::npos) << tail;
  EXPECT_EQ(tail.substr(tail.size() - 14), "data: [DONE]\n\n");
}

TEST(RelayLogicTest, StreamCutShortIsADecodeFailure) {
  RelayLogic l(true);
  l.DecodeStatus(200);
  l.PrefillEnded(Response(200, kPrefillOk));
  l.Commit();
  l.DecodeData(Chunk({7}) + "data: {\"choi");
  l.DecodeEnded(Response(200, ""));
  EXPECT_EQ(l.outcome(), Outcome::kDecodeFailed);
  bool finished = false, tokens = false;
  const std::string out = l.TakeBody(&finished, &tokens);
  EXPECT_TRUE(finished);
  EXPECT_EQ(out.rfind(Chunk({7}), 0), 0u);   // whole events only
  EXPECT_NE(out.find("before data: [DONE]"), std::string::npos);
}

TEST(RelayLogicTest, ClientGoneCancelsBothAndIsFinal) {
  RelayLogic l(true);
  l.DecodeStatus(200);
  l.Commit();
  l.ClientGone();
  EXPECT_EQ(l.outcome(), Outcome::kClientDisconnect);
  EXPECT_TRUE(l.cancel_prefill());
  EXPECT_TRUE(l.cancel_decode());
  l.PrefillEnded(Cancelled());
  l.DecodeEnded(Cancelled());
  l.Shutdown();
  EXPECT_EQ(l.outcome(), Outcome::kClientDisconnect);
}

TEST(RelayLogicTest, ShutdownBeforeCommitIs503) {
  RelayLogic l(false);
  l.Shutdown();
  EXPECT_EQ(l.outcome(), Outcome::kShutdown);
  EXPECT_TRUE(l.cancel_prefill() && l.cancel_decode());
  EXPECT_EQ(l.Reply().status, 503);
}

// P's KV is released at P once P's leg is over and the request did not end
// well: above all when D crashed after P answered (D cannot release any
// more). Not before P's leg ends, never for ok or shutdown.
TEST(RelayLogicTest, ReleasesAtPOnceItsLegIsOverUnlessTheRequestEndedWell) {
  {  // D's connection broke after P answered: release.
    RelayLogic l(false);
    l.PrefillEnded(Response(200, kPrefillOk));
    EXPECT_FALSE(l.release_prefill());
    l.DecodeEnded(Transport("the connection to http://d:1 was lost (read failed)"));
    EXPECT_EQ(l.outcome(), Outcome::kDecodeFailed);
    EXPECT_TRUE(l.release_prefill());
  }
  {  // D failed first: P's leg is cancelled; release once it is over.
    RelayLogic l(false);
    l.DecodeEnded(Transport("connection refused"));
    EXPECT_FALSE(l.release_prefill());
    l.PrefillEnded(Cancelled());
    EXPECT_TRUE(l.release_prefill());
  }
  {  // The client left mid-stream, after P answered.
    RelayLogic l(true);
    l.PrefillEnded(Response(200, kPrefillOk));
    l.DecodeStatus(200);
    l.Commit();
    l.ClientGone();
    EXPECT_TRUE(l.release_prefill());
  }
  {  // An ok request: D pulled; nothing to release.
    RelayLogic l(false);
    l.PrefillEnded(Response(200, kPrefillOk));
    l.DecodeStatus(200);
    l.DecodeData(kDecodeOk);
    l.DecodeEnded(Response(200, ""));
    EXPECT_EQ(l.outcome(), Outcome::kOk);
    EXPECT_FALSE(l.release_prefill());
  }
  {  // P refused the leg (409: another request's transfer id): not ours to end.
    RelayLogic l(false);
    l.PrefillEnded(Response(409, R"({"error":{"message":"duplicate transfer_id"}})"));
    l.DecodeEnded(Cancelled());
    EXPECT_EQ(l.outcome(), Outcome::kBadRequest);
    EXPECT_FALSE(l.release_prefill());
  }
  {  // Shutdown: D's cancelled leg makes D release itself.
    RelayLogic l(false);
    l.Shutdown();
    l.PrefillEnded(Cancelled());
    EXPECT_FALSE(l.release_prefill());
  }
}

TEST(RelayLogicTest, OutcomeNames) {
  EXPECT_EQ(OutcomeName(Outcome::kOk), "ok");
  EXPECT_EQ(OutcomeName(Outcome::kClientDisconnect), "client_disconnect");
  EXPECT_EQ(OutcomeName(Outcome::kPrefillFailed), "prefill_failed");
  EXPECT_EQ(OutcomeName(Outcome::kDecodeFailed), "decode_failed");
  EXPECT_EQ(OutcomeName(Outcome::kBadRequest), "bad_request");
}

}  // namespace
}  // namespace kvrelay::router
