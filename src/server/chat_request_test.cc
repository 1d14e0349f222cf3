#include "server/chat_request.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/text_codec.h"
#include "server/tokenizer.h"

namespace kvrelay::server {
namespace {

using engine::Token;

// A small model: prompts of up to 63 tokens, bodies of up to 4 KiB.
ParseLimits Limits() {
  engine::ModelShape shape;
  shape.name = "tiny";
  shape.vocab = 1000;
  shape.max_context = 64;
  return ParseLimitsFor(shape, 4096);
}

Result<CompletionRequest> Parse(const std::string& body, const ParseLimits& l = Limits()) {
  return ParseChatRequest(body, l);
}

std::vector<Token> ToyChat(const std::vector<ChatMessage>& m) {
  return Tokenize(ChatPromptText(m), 1000);
}

TEST(ChatPromptTextTest, LaysOutEachMessageThenTheAssistantsTurn) {
  const std::vector<ChatMessage> m = {{"system", "be brief"}, {"user", "hi"}};
  EXPECT_EQ(ChatPromptText(m),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatRequestTest, MessagesBecomeTheTemplatesPrompt) {
  Result<CompletionRequest> r = Parse(
      R"({"model":"tiny","messages":[{"role":"system","content":"be brief"},)"
      R"({"role":"user","content":"hello there","name":"ann"}],"max_tokens":5,"stream":true,)"
      R"("stream_options":{"include_usage":true},"temperature":0,"seed":3,"logprobs":false})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt, ToyChat({{"system", "be brief"}, {"user", "hello there"}}));
  EXPECT_EQ(r->max_tokens, 5u);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->sampling.temperature, 0.0f);
  EXPECT_EQ(r->sampling.seed, 3u);
}

TEST(ChatRequestTest, TextPartsAreJoinedAsOneContent) {
  Result<CompletionRequest> parts = Parse(
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"hello "},)"
      R"({"type":"text","text":"there"}]}]})");
  Result<CompletionRequest> whole =
      Parse(R"({"messages":[{"role":"user","content":"hello there"}]})");
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(parts->prompt, whole->prompt);
}

TEST(ChatRequestTest, MaxCompletionTokensWinsOverMaxTokens) {
  Result<CompletionRequest> r = Parse(
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":9,"max_completion_tokens":3})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->max_tokens, 3u);
  // ...and is checked as max_tokens is.
  Result<CompletionRequest> bad =
      Parse(R"({"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "max_completion_tokens must be at least 1, got 0");
}

TEST(ChatRequestTest, KvTransferParamsAreACompletionsOwn) {
  Result<CompletionRequest> r = Parse(
      R"({"messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{)"
      R"("do_remote_decode":true,"transfer_id":"0123456789abcdef0123456789abcdef"}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->has_kv);
  EXPECT_TRUE(r->kv.do_remote_decode);
}

// A codec's own template is what the prompt becomes.
class FixedChatCodec final : public TextCodec {
 public:
  std::vector<Token> Encode(std::string_view) const override { return {1}; }
  std::string Decode(std::span<const Token>) const override { return ""; }
  std::vector<Token> EncodeChat(std::span<const ChatMessage> m) const override {
    return {7, static_cast<Token>(m.size()), 9};
  }
};

TEST(ChatRequestTest, TheCodecsTemplateMakesThePrompt) {
  FixedChatCodec codec;
  ParseLimits l = Limits();
  l.codec = &codec;
  Result<CompletionRequest> r =
      Parse(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]})",
            l);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt, (std::vector<Token>{7, 2, 9}));
}

struct Refused {
  const char* body;
  const char* words;
};

TEST(ChatRequestTest, RefusesWhatItCannotHonourSayingWhy) {
  const Refused cases[] = {
      {R"({})", "messages is required"},
      {R"({"messages":[]})", "messages is empty"},
      {R"({"messages":"hi"})", "messages must be an array of messages (got a string)"},
      {R"({"messages":[3]})", "messages[0] must be an object"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role must be a string"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role is \"robot\""},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content is required"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content must be a string"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
       "messages[0].content[0] is of type \"image_url\"; this server takes text parts only"},
      {R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})",
       "messages[0].content[0].text must be a string"},
      {R"({"messages":[{"role":"assistant","content":"x","tool_calls":[{}]}]})",
       "tool calls are not supported"},
      {R"({"messages":[{"role":"user","content":"x","name":1}]})",
       "messages[0].name must be a string"},
      {R"({"messages":[{"role":"user","content":"x"}],"prompt":"hi"})",
       "prompt is a /v1/completions field"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       "tools: tools are not supported"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})",
       "response_format: only"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})",
       "logprobs is not supported"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})",
       "top_logprobs is not supported"},
      {R"({"messages":[{"role":"user","content":"x"}],"model":"big"})",
       "model \"big\" is not served here"},
      {R"({"messages":[{"role":"user","content":"x"}],"n":2})", "n must be 1"},
      {R"([1])", "body must be a JSON object"},
  };
  for (const Refused& c : cases) {
    Result<CompletionRequest> r = Parse(c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(r.status().message().find(c.words), std::string::npos)
        << c.body << " → " << r.status().message();
  }
}

TEST(ChatRequestTest, EmptyToolsAndTextResponseFormatAreAccepted) {
  Result<CompletionRequest> r =
      Parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[],"tool_choice":null,)"
            R"("response_format":{"type":"text"},"logprobs":null})");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

TEST(ChatRequestTest, LimitsHoldForTheLaidOutPrompt) {
  std::string words;
  for (int i = 0; i < 70; ++i) words += "w" + std::to_string(i) + " ";
  Result<CompletionRequest> r =
      Parse(R"({"messages":[{"role":"user","content":")" + words + R"("}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ParseErrorLimit(r.status()), "prompt_tokens");

  std::string many = R"({"messages":[)";
  for (size_t i = 0; i <= kMaxChatMessages; ++i) {
    many += std::string(i == 0 ? "" : ",") + R"({"role":"user","content":""})";
  }
  ParseLimits big = Limits();
  big.max_body_bytes = 1 << 20;
  Result<CompletionRequest> m = Parse(many + "]}", big);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("the limit is 1024"), std::string::npos);

  Result<CompletionRequest> huge = Parse(std::string(5000, ' '));
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(HttpStatusForParseError(huge.status()), 413);
}

}  // namespace
}  // namespace kvrelay::server
