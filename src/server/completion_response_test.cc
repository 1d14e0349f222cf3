#include "server/completion_response.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/completion_request.h"
#include "server/tokenizer.h"

namespace kvrelay::server {
namespace {

using engine::FinishReason;
using engine::Token;
using nlohmann::json;

CompletionResult Sample() {
  CompletionResult r;
  r.id = "cmpl-7";
  r.model = "tiny";
  r.created_s = 1700000000;
  r.prompt_tokens = 5;
  r.tokens = {17, 4};
  r.weights_versions = {1, 2};
  r.finish_reason = FinishReason::kLength;
  return r;
}

TEST(CompletionResponseTest, FinishReasonNames) {
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kAborted), "abort");
  EXPECT_EQ(FinishReasonName(FinishReason::kError), "error");
}

TEST(CompletionResponseTest, CompletionExactText) {
  EXPECT_EQ(CompletionJson(Sample()),
            R"({"id":"cmpl-7","object":"text_completion","created":1700000000,"model":"tiny",)"
            R"("choices":[{"index":0,"text":" t17 t4","token_ids":[17,4],)"
            R"("weights_versions":[1,2],"finish_reason":"length","logprobs":null}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7},)"
            R"("kv_transfer_params":null})");
}

TEST(CompletionResponseTest, CompletionRoundTrip) {
  const json j = json::parse(CompletionJson(Sample()));
  EXPECT_EQ(j["id"], "cmpl-7");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "tiny");
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["text"], Detokenize(std::vector<Token>{17, 4}));
  EXPECT_EQ(c["token_ids"].get<std::vector<Token>>(), (std::vector<Token>{17, 4}));
  EXPECT_EQ(c["weights_versions"].get<std::vector<uint64_t>>(), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["total_tokens"], 7);
  EXPECT_TRUE(j["kv_transfer_params"].is_null());
  EXPECT_FALSE(j.contains("error"));
}

TEST(CompletionResponseTest, ErrorFieldOnlyForErrors) {
  CompletionResult r = Sample();
  r.error = "load failed";   // ignored unless the reason is kError
  EXPECT_FALSE(json::parse(CompletionJson(r)).contains("error"));
  r.finish_reason = FinishReason::kAborted;
  json j = json::parse(CompletionJson(r));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "abort");
  EXPECT_FALSE(j.contains("error"));
  r.finish_reason = FinishReason::kError;
  j = json::parse(CompletionJson(r));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "error");
  EXPECT_EQ(j["error"], "load failed");
}

TEST(CompletionResponseTest, NoTokens) {
  CompletionResult r = Sample();
  r.tokens.clear();
  r.weights_versions.clear();
  r.finish_reason = FinishReason::kAborted;
  const json j = json::parse(CompletionJson(r));
  EXPECT_EQ(j["choices"][0]["text"], "");
  EXPECT_TRUE(j["choices"][0]["token_ids"].is_array());
  EXPECT_TRUE(j["choices"][0]["token_ids"].empty());
  EXPECT_TRUE(j["choices"][0]["weights_versions"].empty());
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
}

TEST(CompletionResponseTest, MismatchedVersionsAreABug) {
  CompletionResult r = Sample();
  r.weights_versions.pop_back();
  EXPECT_DEATH((void)CompletionJson(r), "");
}

TEST(CompletionResponseTest, KvTransferParamsFeedTheDecodeRequest) {
  CompletionResult r = Sample();
  KvTransferOut kv;
  kv.transfer = TransferId{0x0123456789abcdefull, 0xfedcba9876543210ull};
  kv.remote_engine_id = 3;
  kv.remote_host = "10.1.2.3";
  kv.remote_port = 8100;
  kv.remote_tp_size = 2;
  r.kv_transfer_params = kv;
  const json j = json::parse(CompletionJson(r));
  const json& out = j["kv_transfer_params"];
  EXPECT_EQ(out["do_remote_decode"], false);
  EXPECT_EQ(out["do_remote_prefill"], true);
  EXPECT_EQ(out["transfer_id"], "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(out["remote_engine_id"], 3);
  EXPECT_EQ(out["remote_host"], "10.1.2.3");
  EXPECT_EQ(out["remote_port"], 8100);
  EXPECT_EQ(out["remote_tp_size"], 2);

  // The router forwards P's kv_transfer_params to D as they are.
  json d_body = {{"prompt", "a b c"}, {"kv_transfer_params", out}};
  ParseLimits limits;
  limits.model_name = "tiny";
  Result<CompletionRequest> d = ParseCompletionRequest(d_body.dump(), limits);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->has_kv);
  EXPECT_TRUE(d->kv.do_remote_prefill);
  EXPECT_EQ(d->kv.transfer, kv.transfer);
  EXPECT_EQ(d->kv.remote_engine, 3u);
  EXPECT_EQ(d->kv.remote_tp, 2u);
  EXPECT_EQ(d->remote_host, "10.1.2.3");
  EXPECT_EQ(d->remote_port, 8100);
}

TEST(CompletionResponseTest, InvalidUtf8IsReplacedNotThrown) {
  CompletionResult r = Sample();
  r.model = "bad\xff";
  r.finish_reason = FinishReason::kError;
  r.error = "x\xc3";
  const json j = json::parse(CompletionJson(r));
  EXPECT_EQ(j["model"], "bad\xef\xbf\xbd");
  EXPECT_EQ(j["error"], "x\xef\xbf\xbd");
  json parsed;
  EXPECT_NO_THROW(parsed = json::parse(ErrorJson("m\xfe", "t", 400)));
  EXPECT_EQ(parsed["error"]["message"], "m\xef\xbf\xbd");
}

TEST(CompletionResponseTest, StreamChunks) {
  const std::vector<Token> toks{9};
  const std::vector<uint64_t> vers{3};
  EXPECT_EQ(StreamChunkJson("cmpl-1", "tiny", 5, toks, vers, std::nullopt, " t9"),
            R"({"id":"cmpl-1","object":"text_completion","created":5,"model":"tiny",)"
            R"("choices":[{"index":0,"text":" t9","token_ids":[9],"weights_versions":[3],)"
            R"("finish_reason":null,"logprobs":null}]})");
  const json last = json::parse(
      StreamChunkJson("cmpl-1", "tiny", 5, {}, {}, FinishReason::kLength, ""));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0]["token_ids"].empty());
  EXPECT_EQ(last["choices"][0]["text"], "");
  EXPECT_FALSE(last.contains("usage"));
}

TEST(CompletionResponseTest, ChatShapes) {
  CompletionResult r = Sample();
  r.api = Api::kChat;
  const json whole = json::parse(CompletionJson(r));
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"], (json{{"role", "assistant"}, {"content", " t17 t4"}}));
  EXPECT_FALSE(whole["choices"][0].contains("text"));
  EXPECT_EQ(whole["choices"][0]["token_ids"], (json{17, 4}));
  EXPECT_EQ(whole["usage"]["total_tokens"], 7);

  const std::vector<Token> toks{9};
  const std::vector<uint64_t> vers{3};
  EXPECT_EQ(StreamChunkJson("c-1", "tiny", 5, toks, vers, std::nullopt, " t9", Api::kChat, true),
            R"({"id":"c-1","object":"chat.completion.chunk","created":5,"model":"tiny",)"
            R"("choices":[{"index":0,"delta":{"role":"assistant","content":" t9"},)"
            R"("token_ids":[9],"weights_versions":[3],"finish_reason":null,"logprobs":null}]})");
  const json later = json::parse(
      StreamChunkJson("c-1", "tiny", 5, {}, {}, FinishReason::kStop, "", Api::kChat, false));
  EXPECT_EQ(later["choices"][0]["delta"], (json{{"content", ""}}));
  EXPECT_EQ(later["choices"][0]["finish_reason"], "stop");
  const json usage = json::parse(StreamUsageJson("c-1", "tiny", 5, 4, 2, Api::kChat));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 6);
}

TEST(CompletionResponseTest, SseFraming) {
  EXPECT_EQ(SseEvent(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(SseDone(), "data: [DONE]\n\n");
  // A chunk round-trips through the framing.
  const std::string ev = SseEvent(StreamChunkJson("i", "m", 1, {}, {}, std::nullopt, ""));
  ASSERT_TRUE(ev.starts_with("data: "));
  ASSERT_TRUE(ev.ends_with("\n\n"));
  const std::string payload = ev.substr(6, ev.size() - 8);
  EXPECT_EQ(payload.find('\n'), std::string::npos);   // one line per event
  EXPECT_EQ(json::parse(payload)["id"], "i");
}

TEST(CompletionResponseTest, ErrorShape) {
  EXPECT_EQ(ErrorJson("max_tokens must be an integer", "invalid_request_error", 400),
            R"({"error":{"message":"max_tokens must be an integer",)"
            R"("type":"invalid_request_error","code":400}})");
  const json j = json::parse(ErrorJson("say \"hi\"\n", "t", 413));
  EXPECT_EQ(j["error"]["message"], "say \"hi\"\n");
  EXPECT_EQ(j["error"]["code"], 413);
}

TEST(CompletionResponseTest, Models) {
  EXPECT_EQ(ModelsJson("tiny", 10, 1024),
            R"({"object":"list","data":[{"id":"tiny","object":"model","created":10,)"
            R"("owned_by":"kvrelay","max_model_len":1024}]})");
}

}  // namespace
}  // namespace kvrelay::server
