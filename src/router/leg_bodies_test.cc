#include "router/leg_bodies.h"

#include <gtest/gtest.h>

namespace kvrelay::router {
namespace {

using nlohmann::json;

TransferId Tid() { return TransferId{0x0123456789abcdefull, 0xfedcba9876543210ull}; }

EngineInfo PInfo() {
  EngineInfo p;
  p.engine_id = 4242;
  p.incarnation = 7;
  p.role = "prefill";
  p.tp = 2;
  p.kv_host = "10.1.2.3";
  p.kv_port = 9100;
  return p;
}

TEST(ParseClientBodyTest, RejectsWhatIsNotAJsonObject) {
  for (const char* body : {"", "{", "nope", "[1,2]", "\"prompt\"", "3", "null"}) {
    Result<ClientRequest> r = ParseClientBody(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_NE(ParseClientBody("{").status().message().find("body is not valid JSON: "),
            std::string::npos);
  EXPECT_EQ(ParseClientBody("[1]").status().message(), "body must be a JSON object");
  // A NUL ends nlohmann's reading: the body is refused, not cut short.
  EXPECT_FALSE(ParseClientBody(std::string(R"({"prompt":"a"})") + '\0' + "x").ok());
  // The router sets kv_transfer_params itself: one that is not an object is
  // refused, not dropped unseen.
  const Result<ClientRequest> kv = ParseClientBody(R"({"prompt":"a","kv_transfer_params":5})");
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().message(),
            "kv_transfer_params must be an object (got number); the router sets it for both legs");
  EXPECT_TRUE(ParseClientBody(R"({"prompt":"a","kv_transfer_params":null})").ok());
}

TEST(ParseClientBodyTest, ReadsStreamAndKeepsTheRest) {
  Result<ClientRequest> r = ParseClientBody(R"({"prompt":[1,2],"stream":true,"x":{"y":1}})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->stream);
  EXPECT_EQ(r->body["x"]["y"], 1);
  // Anything but the boolean true is not a stream (the engine judges a bad type).
  for (const char* body : {R"({"stream":false})", R"({"stream":null})", R"({"stream":"true"})",
                           R"({"stream":1})", R"({})"}) {
    Result<ClientRequest> s = ParseClientBody(body);
    ASSERT_TRUE(s.ok()) << body;
    EXPECT_FALSE(s->stream) << body;
  }
}

TEST(LegBodiesTest, PrefillLegAsksForOneTokenAndARemoteDecode) {
  const json client = {{"prompt", {1, 2, 3}},          {"max_tokens", 50},
                       {"stream", true},               {"temperature", 0.5},
                       {"request_id", "abc"},          {"unknown_field", "kept"},
                       {"kv_transfer_params", {{"do_remote_prefill", true}}}};
  const json p = json::parse(PrefillLegBody(client, Tid(), 4));
  EXPECT_EQ(p["max_tokens"], 1);
  EXPECT_EQ(p["stream"], false);
  EXPECT_EQ(p["prompt"], client["prompt"]);
  EXPECT_EQ(p["temperature"], 0.5);
  EXPECT_EQ(p["request_id"], "abc");
  EXPECT_EQ(p["unknown_field"], "kept");
  EXPECT_EQ(p["kv_transfer_params"], (json{{"do_remote_decode", true},
                                           {"transfer_id", "0123456789abcdeffedcba9876543210"},
                                           {"consumer_tp_size", 4}}));
  // A chat's max_completion_tokens would win over max_tokens: it goes.
  json chat = client;
  chat["max_completion_tokens"] = 50;
  EXPECT_FALSE(json::parse(PrefillLegBody(chat, Tid(), 4)).contains("max_completion_tokens"));
  EXPECT_EQ(json::parse(DecodeLegBody(chat, Tid(), EngineInfo{}))["max_completion_tokens"], 50);
  const json named = json::parse(PrefillLegBody(client, Tid(), 2, 17));
  EXPECT_EQ(named["kv_transfer_params"]["consumer_engine_id"], 17);
  EXPECT_EQ(named["kv_transfer_params"]["consumer_tp_size"], 2);
}

TEST(LegBodiesTest, DecodeLegKeepsTheClientsLengthAndStreamAndNamesP) {
  const json client = {{"prompt", "hello world"}, {"max_tokens", 50}, {"stream", true},
                       {"kv_transfer_params", {{"do_remote_decode", true}}}};
  const json d = json::parse(DecodeLegBody(client, Tid(), PInfo()));
  EXPECT_EQ(d["max_tokens"], 50);
  EXPECT_EQ(d["stream"], true);
  EXPECT_EQ(d["prompt"], "hello world");
  EXPECT_EQ(d["kv_transfer_params"], (json{{"do_remote_prefill", true},
                                           {"transfer_id", "0123456789abcdeffedcba9876543210"},
                                           {"remote_engine_id", 4242},
                                           {"remote_host", "10.1.2.3"},
                                           {"remote_port", 9100},
                                           {"remote_tp_size", 2}}));
  // No max_tokens/stream from the client: none added (the engine's defaults).
  const json d2 = json::parse(DecodeLegBody(json{{"prompt", {5}}}, Tid(), PInfo()));
  EXPECT_FALSE(d2.contains("max_tokens"));
  EXPECT_FALSE(d2.contains("stream"));
}

TEST(JudgeCompletionTest, ReadsFinishReasonPastLeadingWhitespace) {
  CompletionVerdict v = JudgeCompletion(
      "   \n {\"choices\":[{\"finish_reason\":\"length\",\"token_ids\":[1]}]}");
  EXPECT_TRUE(v.parsed);
  EXPECT_EQ(v.finish_reason, "length");
  EXPECT_FALSE(v.failed());
  v = JudgeCompletion(R"({"choices":[{"finish_reason":"error"}],"error":"load failed"})");
  EXPECT_TRUE(v.failed());
  EXPECT_EQ(v.error, "load failed");
  // An abort is not a failure: the client gets it as a plain engine sends it.
  v = JudgeCompletion(R"({"choices":[{"finish_reason":"abort"}]})");
  EXPECT_FALSE(v.failed());
  EXPECT_TRUE(v.aborted());
  v = JudgeCompletion(R"({"choices":[{"finish_reason":null}]})");
  EXPECT_TRUE(v.parsed);
  EXPECT_EQ(v.finish_reason, "");
  for (const char* bad : {"", "  ", "{", "{}", R"({"choices":[]})", R"({"choices":[3]})"}) {
    EXPECT_FALSE(JudgeCompletion(bad).parsed) << bad;
  }
}

TEST(UpstreamErrorMessageTest, TakesTheMessageOrTheBody) {
  EXPECT_EQ(UpstreamErrorMessage(R"({"error":{"message":"queue full","code":429}})"),
            "queue full");
  EXPECT_EQ(UpstreamErrorMessage("oops"), "oops");
  EXPECT_EQ(UpstreamErrorMessage(""), "(empty body)");
  EXPECT_EQ(UpstreamErrorMessage(std::string(500, 'x')).size(), 203u);
}

// P's whole answer as a stream chunk: a completion's shape is a chunk's
// already; a chat's message becomes the delta, its role only first.
TEST(LegBodiesTest, AWholeAnswerAsAStreamChunk) {
  const json text = {{"object", "text_completion"},
                     {"choices", {{{"text", "a"}, {"finish_reason", "abort"}}}},
                     {"usage", {{"total_tokens", 3}}},
                     {"kv_transfer_params", nullptr}};
  EXPECT_EQ(AsStreamChunk(text, true),
            (json{{"object", "text_completion"},
                  {"choices", {{{"text", "a"}, {"finish_reason", "abort"}}}}}));
  const json chat = {
      {"object", "chat.completion"},
      {"choices", {{{"message", {{"role", "assistant"}, {"content", "a"}}},
                    {"finish_reason", "abort"}}}},
      {"usage", {{"total_tokens", 3}}}};
  const json first = AsStreamChunk(chat, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", "a"}}));
  EXPECT_FALSE(first["choices"][0].contains("message"));
  EXPECT_FALSE(first.contains("usage"));
  EXPECT_EQ(AsStreamChunk(chat, false)["choices"][0]["delta"], (json{{"content", "a"}}));
}

// Found by scripts/fuzz (router_bodies): a number too large for a double
// made nlohmann throw out_of_range, which escaped the parser.
TEST(LegBodiesTest, NumberOverflowIsACleanError) {
  Result<ClientRequest> r = ParseClientBody(R"({"model": 1111111111111111e1111111111111})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace kvrelay::router
