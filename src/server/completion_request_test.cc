#include "server/completion_request.h"

#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "base/prng.h"
#include "server/tokenizer.h"

namespace kvrelay::server {
namespace {

using engine::Token;

ParseLimits Limits() {
  ParseLimits l;
  l.model_name = "tiny";
  l.vocab = 1000;
  l.max_context = 64;
  l.max_body_bytes = 4096;
  l.max_prompt_tokens = 60;
  return l;
}

const char* const kTransfer = "0123456789abcdef0123456789abcdef";

// A D-side body using every field.
std::string FullBody() {
  return std::string(R"({"model":"tiny","prompt":"the quick brown fox","max_tokens":8,)") +
         R"("stream":true,"request_id":"req-1","temperature":0.7,"top_p":1,"n":1,)" +
         R"("stop":["\n"],"seed":3,"echo":false,"logprobs":null,"user":"u",)" +
         R"("stream_options":{"include_usage":true},"kv_transfer_params":{)" +
         R"("do_remote_decode":false,"do_remote_prefill":true,"transfer_id":")" + kTransfer +
         R"(","remote_engine_id":7,"remote_host":"10.0.0.2","remote_port":9100,)" +
         R"("remote_tp_size":2,"remote_block_ids":null}})";
}

Result<CompletionRequest> Parse(const std::string& body) {
  return ParseCompletionRequest(body, Limits());
}

// ---------------------------------------------------------------------------
// Accepted bodies.

TEST(CompletionRequestTest, MinimalStringPromptGetsDefaults) {
  Result<CompletionRequest> r = Parse(R"({"prompt":"hello world"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt, Tokenize("hello world", 1000));
  EXPECT_EQ(r->max_tokens, 16u);
  EXPECT_FALSE(r->stream);
  EXPECT_EQ(r->request_id, "");
  EXPECT_FALSE(r->has_kv);
  EXPECT_FALSE(r->kv.do_remote_decode);
  EXPECT_FALSE(r->kv.do_remote_prefill);
}

TEST(CompletionRequestTest, TokenIdPrompt) {
  Result<CompletionRequest> r = Parse(R"({"model":"tiny","prompt":[0,5,999],"max_tokens":61})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt, (std::vector<Token>{0, 5, 999}));
  EXPECT_EQ(r->max_tokens, 61u);   // 3 + 61 = 64, the whole context
}

TEST(CompletionRequestTest, DefaultMaxTokensShrinksToTheRoomLeft) {
  // 60 tokens of a 64-token context: the default 16 becomes 4.
  std::string ids;
  for (int i = 0; i < 60; ++i) ids += (i ? "," : "") + std::to_string(i + 1);
  Result<CompletionRequest> r = Parse(R"({"prompt":[)" + ids + "]}");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->max_tokens, 4u);
}

TEST(CompletionRequestTest, FullDecodeSideBody) {
  Result<CompletionRequest> r = Parse(FullBody());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->request_id, "req-1");
  EXPECT_EQ(r->prompt.size(), 4u);
  EXPECT_EQ(r->max_tokens, 8u);
  EXPECT_TRUE(r->stream);
  ASSERT_TRUE(r->has_kv);
  EXPECT_EQ(r->kv.transfer.ToString(), kTransfer);
  EXPECT_FALSE(r->kv.do_remote_decode);
  EXPECT_TRUE(r->kv.do_remote_prefill);
  EXPECT_EQ(r->kv.remote_engine, 7u);
  EXPECT_EQ(r->kv.remote_tp, 2u);          // D: the producer's tp
  EXPECT_EQ(r->kv.prompt_hash, 0u);        // the engine computes it
  EXPECT_EQ(r->remote_host, "10.0.0.2");
  EXPECT_EQ(r->remote_port, 9100);
}

TEST(CompletionRequestTest, PrefillSide) {
  const std::string body = std::string(R"({"prompt":"a b","kv_transfer_params":{)") +
                           R"("do_remote_decode":true,"transfer_id":")" + kTransfer + R"("}})";
  Result<CompletionRequest> r = Parse(body);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_kv);
  EXPECT_TRUE(r->kv.do_remote_decode);
  EXPECT_FALSE(r->kv.do_remote_prefill);
  EXPECT_EQ(r->kv.remote_tp, 1u);   // consumer_tp_size defaults to 1
  EXPECT_EQ(r->remote_port, 0);

  const std::string with_tp = std::string(R"({"prompt":"a b","kv_transfer_params":{)") +
                              R"("do_remote_decode":true,"consumer_tp_size":4,)" +
                              R"("remote_tp_size":2,"transfer_id":")" + kTransfer + R"("}})";
  Result<CompletionRequest> r2 = Parse(with_tp);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->kv.remote_tp, 4u);  // P: the consumer's tp
  EXPECT_EQ(r2->kv.consumer_engine, UINT32_MAX);  // not named: the first D to pull

  const std::string named = std::string(R"({"prompt":"a b","kv_transfer_params":{)") +
                            R"("do_remote_decode":true,"consumer_engine_id":12,)" +
                            R"("transfer_id":")" + kTransfer + R"("}})";
  Result<CompletionRequest> r3 = Parse(named);
  ASSERT_TRUE(r3.ok()) << r3.status().ToString();
  EXPECT_EQ(r3->kv.consumer_engine, 12u);
  const std::string bad = std::string(R"({"prompt":"a b","kv_transfer_params":{)") +
                          R"("do_remote_decode":true,"consumer_engine_id":-1,)" +
                          R"("transfer_id":")" + kTransfer + R"("}})";
  EXPECT_FALSE(Parse(bad).ok());
}

TEST(CompletionRequestTest, VllmProxyStylePrefillBodyWithNulls) {
  // vLLM's toy proxy sends P the flags with every remote_* field null.
  const std::string body =
      std::string(R"({"model":"tiny","prompt":"x","max_tokens":1,"stream":false,)") +
      R"("kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,)" +
      R"("remote_engine_id":null,"remote_block_ids":null,"remote_host":null,)" +
      R"("remote_port":null,"transfer_id":")" + kTransfer + R"("}})";
  Result<CompletionRequest> r = Parse(body);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->has_kv);
  EXPECT_TRUE(r->kv.do_remote_decode);
}

TEST(CompletionRequestTest, KvParamsWithoutFlagsOrNullAreNoTransfer) {
  for (const char* body : {R"({"prompt":"x","kv_transfer_params":null})",
                           R"({"prompt":"x","kv_transfer_params":{}})",
                           R"({"prompt":"x","kv_transfer_params":{"do_remote_decode":false}})"}) {
    Result<CompletionRequest> r = Parse(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.status().ToString();
    EXPECT_FALSE(r->has_kv) << body;
  }
}

TEST(CompletionRequestTest, IgnoredAndUnknownFieldsAreAccepted) {
  for (const char* body : {
           R"({"prompt":"x","temperature":0,"top_p":0.9,"n":1,"stop":"\n","seed":-4})",
           R"({"prompt":"x","stop":null,"seed":null,"user":null,"stream_options":null})",
           R"({"prompt":"x","echo":false,"logprobs":null,"presence_penalty":0.5})",
           R"({"prompt":"x","best_of":3,"suffix":"s","logit_bias":{"1":2},"whatever":[1,{}]})",
           R"({"prompt":"x","model":null,"max_tokens":null,"stream":null,"request_id":null})",
       }) {
    Result<CompletionRequest> r = Parse(body);
    EXPECT_TRUE(r.ok()) << body << ": " << r.status().ToString();
  }
}

TEST(CompletionRequestTest, LargeUnsignedAndBoundaryValues) {
  Result<CompletionRequest> r = Parse(std::string(R"({"prompt":"x","kv_transfer_params":{)") +
                                      R"("do_remote_prefill":true,"transfer_id":")" + kTransfer +
                                      R"(","remote_engine_id":4294967295,"remote_host":"h",)" +
                                      R"("remote_port":65535,"remote_tp_size":4}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kv.remote_engine, 4294967295u);
  EXPECT_EQ(r->remote_port, 65535);
  EXPECT_EQ(r->kv.remote_tp, 4u);
  const std::string id128(128, 'r');
  Result<CompletionRequest> r2 = Parse(R"({"prompt":"x","request_id":")" + id128 + R"("})");
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->request_id, id128);
}

// ---------------------------------------------------------------------------
// Rejected bodies: one row per rule.

struct BadCase {
  std::string body;
  StatusCode code;
  std::string message;   // a substring of the error message
};

std::string Kv(const std::string& inner) {
  return R"({"prompt":"a b c","kv_transfer_params":{)" + inner + "}}";
}
std::string Tid() { return std::string(R"("transfer_id":")") + kTransfer + "\""; }
std::string DFields() {
  return R"("remote_engine_id":1,"remote_host":"h","remote_port":9000,"remote_tp_size":1)";
}

TEST(CompletionRequestTest, RejectsEveryBrokenRule) {
  const StatusCode kInv = StatusCode::kInvalidArgument;
  const StatusCode kRange = StatusCode::kOutOfRange;
  std::string ids61, ids64;
  for (int i = 0; i < 64; ++i) {
    if (i < 61) ids61 += (i ? "," : "") + std::to_string(i);
    ids64 += (i ? "," : "") + std::to_string(i);
  }
  std::string words61;
  for (int i = 0; i < 61; ++i) words61 += "w ";
  const std::vector<BadCase> cases = {
      // JSON and top level
      {"", kInv, "body is not valid JSON: at line 1, column 1"},
      {"{", kInv, "body is not valid JSON: at line 1, column 2"},
      {R"({"prompt":"x",})", kInv, "body is not valid JSON"},
      {R"({"prompt":"x"} trailing)", kInv, "body is not valid JSON"},
      {"{\"prompt\":\"\xff\"}", kInv, "body is not valid JSON"},
      {R"({"prompt":"x","max_tokens":1e400})", kInv,
       "body is not valid JSON: number overflow parsing '1e400'"},
      {"[1,2]", kInv, "body must be a JSON object (got an array)"},
      {"\"text\"", kInv, "body must be a JSON object (got a string)"},
      {"null", kInv, "body must be a JSON object (got null)"},
      // model
      {R"({"model":"8b","prompt":"x"})", kInv,
       R"(model "8b" is not served here; this server serves "tiny")"},
      {R"({"model":3,"prompt":"x"})", kInv, "model must be a string (got an integer)"},
      // prompt
      {R"({})", kInv, "prompt is required"},
      {R"({"prompt":null})", kInv, "prompt is required"},
      {R"({"prompt":""})", kInv, "prompt is empty"},
      {R"({"prompt":" \n\t "})", kInv, "prompt is empty"},
      {R"({"prompt":[]})", kInv, "prompt is empty"},
      {R"({"prompt":["a","b"]})", kInv, "batched prompts are not supported"},
      {R"({"prompt":[[1,2],[3]]})", kInv, "batched prompts are not supported"},
      {R"({"prompt":[1,"b"]})", kInv, "prompt[1] must be an integer token id (got a string)"},
      {R"({"prompt":[1,2.5]})", kInv, "prompt[1] must be an integer token id (got a non-integer"},
      {R"({"prompt":[1,true]})", kInv, "prompt[1] must be an integer token id (got a boolean)"},
      {R"({"prompt":[1,null]})", kInv, "prompt[1] must be an integer token id (got null)"},
      {R"({"prompt":[-1]})", kRange, "prompt[0] is -1; token ids must be in [0, 1000)"},
      {R"({"prompt":[1000]})", kRange, "prompt[0] is 1000; token ids must be in [0, 1000)"},
      {R"({"prompt":[18446744073709551615]})", kRange, "token ids must be in [0, 1000)"},
      {R"({"prompt":[)" + ids61 + "]}", kRange, "prompt has 61 tokens; the limit is 60"},
      {R"({"prompt":")" + words61 + "\"}", kRange, "prompt has 61 tokens; the limit is 60"},
      {R"({"prompt":7})", kInv,
       "prompt must be a string or an array of integer token ids (got an integer)"},
      {R"({"prompt":{"text":"x"}})", kInv, "prompt must be a string or an array"},
      // max_tokens
      {R"({"prompt":"x","max_tokens":"8"})", kInv, "max_tokens must be an integer (got a string)"},
      {R"({"prompt":"x","max_tokens":8.0})", kInv, "max_tokens must be an integer"},
      {R"({"prompt":"x","max_tokens":1e3})", kInv, "max_tokens must be an integer"},
      {R"({"prompt":"x","max_tokens":true})", kInv, "max_tokens must be an integer"},
      {R"({"prompt":"x","max_tokens":0})", kInv, "max_tokens must be at least 1, got 0"},
      {R"({"prompt":"x","max_tokens":-5})", kInv, "max_tokens must be at least 1, got -5"},
      {R"({"prompt":"x","max_tokens":64})", kRange,
       "max_tokens is 64, but the prompt's 1 tokens leave room for at most 63 in the model's "
       "context of 64 tokens"},
      {R"({"prompt":"x","max_tokens":18446744073709551615})", kRange, "max_tokens is"},
      // stream, request_id
      {R"({"prompt":"x","stream":"yes"})", kInv, "stream must be a boolean (got a string)"},
      {R"({"prompt":"x","stream":1})", kInv, "stream must be a boolean (got an integer)"},
      {R"({"prompt":"x","request_id":5})", kInv, "request_id must be a string"},
      {R"({"prompt":"x","request_id":""})", kInv, "request_id must be 1..128 printable ASCII"},
      {R"({"prompt":"x","request_id":")" + std::string(129, 'r') + "\"}", kInv,
       "request_id must be 1..128"},
      {R"({"prompt":"x","request_id":"a\nb"})", kInv, "request_id must be 1..128"},
      // ignored fields with the wrong type or an unsupported value
      {R"({"prompt":"x","n":2})", kInv, "n must be 1 (one completion per request), got 2"},
      {R"({"prompt":"x","n":"1"})", kInv, "n must be an integer"},
      {R"({"prompt":"x","echo":true})", kInv, "echo is not supported"},
      {R"({"prompt":"x","echo":"no"})", kInv, "echo must be a boolean"},
      {R"({"prompt":"x","logprobs":1})", kInv, "logprobs is not supported"},
      {R"({"prompt":"x","temperature":"hot"})", kInv, "temperature must be a number"},
      {R"({"prompt":"x","top_p":[1]})", kInv, "top_p must be a number"},
      {R"({"prompt":"x","seed":1.5})", kInv, "seed must be an integer"},
      {R"({"prompt":"x","stop":[1]})", kInv, "stop must be a string or an array of strings"},
      {R"({"prompt":"x","user":{}})", kInv, "user must be a string"},
      {R"({"prompt":"x","stream_options":true})", kInv, "stream_options must be an object"},
      // kv_transfer_params: types
      {R"({"prompt":"x","kv_transfer_params":"p"})", kInv,
       "kv_transfer_params must be an object or null (got a string)"},
      {R"({"prompt":"x","kv_transfer_params":[]})", kInv, "kv_transfer_params must be an object"},
      {Kv(R"("do_remote_decode":"true")"), kInv,
       "kv_transfer_params.do_remote_decode must be a boolean (got a string)"},
      {Kv(R"("do_remote_prefill":1)"), kInv, "kv_transfer_params.do_remote_prefill must be a boolean"},
      {Kv(R"("transfer_id":5)"), kInv, "kv_transfer_params.transfer_id must be a string"},
      {Kv(R"("transfer_id":"abc")"), kInv,
       R"(kv_transfer_params.transfer_id must be 32 lowercase hex digits, got "abc")"},
      {Kv(R"("transfer_id":"0123456789ABCDEF0123456789abcdef")"), kInv,
       "transfer_id must be 32 lowercase hex digits"},
      {Kv(R"("transfer_id":"0123456789abcdef0123456789abcdef0")"), kInv,
       "transfer_id must be 32 lowercase hex digits"},
      {Kv(R"("transfer_id":"00000000000000000000000000000000")"), kInv,
       "transfer_id must not be all zeros"},
      {Kv(R"("remote_engine_id":"e1")"), kInv, "kv_transfer_params.remote_engine_id must be an integer"},
      {Kv(R"("remote_engine_id":-1)"), kInv,
       "kv_transfer_params.remote_engine_id must be between 0 and 4294967295, got -1"},
      {Kv(R"("remote_engine_id":4294967296)"), kInv, "remote_engine_id must be between 0 and"},
      {Kv(R"("remote_host":7)"), kInv, "kv_transfer_params.remote_host must be a string"},
      {Kv(R"("remote_host":"")"), kInv, "kv_transfer_params.remote_host must be a host name"},
      {Kv(R"("remote_host":"a b")"), kInv, "remote_host must be a host name"},
      {Kv(R"("remote_port":0)"), kInv,
       "kv_transfer_params.remote_port must be between 1 and 65535, got 0"},
      {Kv(R"("remote_port":65536)"), kInv, "remote_port must be between 1 and 65535, got 65536"},
      {Kv(R"("remote_port":"80")"), kInv, "remote_port must be an integer"},
      {Kv(R"("remote_tp_size":3)"), kInv, "kv_transfer_params.remote_tp_size must be 1, 2 or 4, got 3"},
      {Kv(R"("remote_tp_size":8)"), kInv, "remote_tp_size must be 1, 2 or 4"},
      {Kv(R"("consumer_tp_size":0)"), kInv, "kv_transfer_params.consumer_tp_size must be 1, 2 or 4"},
      {Kv(R"("consumer_tp_size":2.0)"), kInv, "consumer_tp_size must be an integer"},
      // kv_transfer_params: rules
      {Kv(R"("do_remote_decode":true,"do_remote_prefill":true,)" + Tid() + "," + DFields()), kInv,
       "do_remote_decode and do_remote_prefill cannot both be true"},
      {Kv(R"("do_remote_decode":true)"), kInv,
       "kv_transfer_params.transfer_id is required when do_remote_decode is true"},
      {Kv(R"("do_remote_prefill":true,)" + DFields()), kInv,
       "kv_transfer_params.transfer_id is required when do_remote_prefill is true"},
      {Kv(R"("do_remote_prefill":true,)" + Tid() +
          R"(,"remote_host":"h","remote_port":9000,"remote_tp_size":1)"),
       kInv, "kv_transfer_params.remote_engine_id is required when do_remote_prefill is true"},
      {Kv(R"("do_remote_prefill":true,)" + Tid() +
          R"(,"remote_engine_id":1,"remote_port":9000,"remote_tp_size":1)"),
       kInv, "kv_transfer_params.remote_host is required when do_remote_prefill is true"},
      {Kv(R"("do_remote_prefill":true,)" + Tid() +
          R"(,"remote_engine_id":1,"remote_host":"h","remote_tp_size":1)"),
       kInv, "kv_transfer_params.remote_port is required when do_remote_prefill is true"},
      {Kv(R"("do_remote_prefill":true,)" + Tid() +
          R"(,"remote_engine_id":1,"remote_host":"h","remote_port":9000)"),
       kInv, "kv_transfer_params.remote_tp_size is required when do_remote_prefill is true"},
      {Kv(R"("do_remote_prefill":true,)" + Tid() +
          R"(,"remote_engine_id":1,"remote_host":null,"remote_port":9000,"remote_tp_size":1)"),
       kInv, "kv_transfer_params.remote_host is required"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.body);
    Result<CompletionRequest> r = Parse(c.body);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos)
        << "got: " << r.status().message() << "\nwant: " << c.message;
    EXPECT_EQ(HttpStatusForParseError(r.status()), 400);
  }
}

TEST(CompletionRequestTest, PromptLeavingNoRoomIsOutOfRange) {
  ParseLimits l = Limits();
  l.max_prompt_tokens = 100;   // above the context: the context decides
  std::string ids;
  for (int i = 0; i < 64; ++i) ids += (i ? "," : "") + std::to_string(i);
  Result<CompletionRequest> r = ParseCompletionRequest(R"({"prompt":[)" + ids + "]}", l);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(r.status().message(),
            "prompt has 64 tokens; the model's context of 64 tokens leaves no room for output");
}

TEST(CompletionRequestTest, BodyOverTheLimitIs413) {
  ParseLimits l = Limits();
  l.max_body_bytes = 20;
  const std::string ok_body = R"({"prompt":"abcdefg"})";   // 20 bytes
  ASSERT_EQ(ok_body.size(), 20u);
  EXPECT_TRUE(ParseCompletionRequest(ok_body, l).ok());
  Result<CompletionRequest> r = ParseCompletionRequest(R"({"prompt":"abcdefgh"})", l);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(r.status().message(), "request body is 21 bytes; the limit is 20 bytes");
  EXPECT_EQ(HttpStatusForParseError(r.status()), 413);
}

TEST(CompletionRequestTest, LongValuesInMessagesAreCut) {
  const std::string model(500, 'm');
  Result<CompletionRequest> r = Parse(R"({"model":")" + model + R"(","prompt":"x"})");
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 150u) << r.status().message();
}

TEST(CompletionRequestTest, LimitsForAShape) {
  engine::ModelShape shape;
  ASSERT_TRUE(engine::ModelShapeByName("tiny", &shape));
  const ParseLimits l = ParseLimitsFor(shape, 1 << 16);
  EXPECT_EQ(l.model_name, "tiny");
  EXPECT_EQ(l.vocab, shape.vocab);
  EXPECT_EQ(l.max_context, shape.max_context);
  EXPECT_EQ(l.max_prompt_tokens, shape.max_context - 1);
  EXPECT_EQ(l.max_body_bytes, size_t{1} << 16);
}

// ---------------------------------------------------------------------------
// Random mutations of a valid body never crash, and whatever is accepted
// obeys every rule.

void CheckAccepted(const CompletionRequest& r, const ParseLimits& l) {
  ASSERT_FALSE(r.prompt.empty());
  ASSERT_LE(r.prompt.size(), l.max_prompt_tokens);
  for (Token t : r.prompt) ASSERT_LT(t, l.vocab);
  ASSERT_GE(r.max_tokens, 1u);
  ASSERT_LE(r.prompt.size() + r.max_tokens, l.max_context);
  ASSERT_LE(r.request_id.size(), kMaxRequestIdChars);
  ASSERT_FALSE(r.kv.do_remote_decode && r.kv.do_remote_prefill);
  ASSERT_EQ(r.has_kv, r.kv.do_remote_decode || r.kv.do_remote_prefill);
  if (r.has_kv) {
    ASSERT_FALSE(r.kv.transfer.IsZero());
    ASSERT_TRUE(r.kv.remote_tp == 1 || r.kv.remote_tp == 2 || r.kv.remote_tp == 4);
  }
  if (r.kv.do_remote_prefill) {
    ASSERT_FALSE(r.remote_host.empty());
    ASSERT_NE(r.remote_port, 0);
  }
}

TEST(CompletionRequestTest, RandomMutationsNeverCrash) {
  const uint64_t seed = 0x5EED0C0DE;
  std::cout << "RandomMutationsNeverCrash seed " << seed << "\n";
  SCOPED_TRACE("seed " + std::to_string(seed));
  Prng rng(seed);
  const ParseLimits l = Limits();
  const std::string base = FullBody();
  const std::vector<std::string> snippets = {
      "null", "true", "false", "0", "-1", "1e400", "18446744073709551616", "\"\"", "[", "]",
      "{", "}", ",", ":", "\"", "\\", "\\u0000", "\\ud800", "[[1]]", "{\"a\":1}", "65536",
      "4294967296", "\"prompt\":", "\"kv_transfer_params\":", "\xff", "\xc3", " ", "1.5",
      "\"0123456789abcdef0123456789abcdef\"", "2", "4"};
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body = base;
    const int edits = static_cast<int>(rng.Range(1, 4));
    for (int e = 0; e < edits; ++e) {
      const size_t pos = body.empty() ? 0 : rng.Uniform(body.size());
      switch (rng.Uniform(6)) {
        case 0:   // flip a byte
          if (!body.empty()) body[pos] = static_cast<char>(rng.Uniform(256));
          break;
        case 1:   // delete a range
          if (!body.empty()) body.erase(pos, rng.Range(1, 8));
          break;
        case 2:   // insert a snippet
          body.insert(pos, snippets[rng.Uniform(snippets.size())]);
          break;
        case 3: {  // replace a range with a snippet
          body.replace(pos, rng.Range(1, 12), snippets[rng.Uniform(snippets.size())]);
          break;
        }
        case 4: {  // duplicate a range
          const std::string piece = body.substr(pos, rng.Range(1, 30));
          body.insert(rng.Uniform(body.size() + 1), piece);
          break;
        }
        default:  // change a digit
          if (!body.empty() && body[pos] >= '0' && body[pos] <= '9') {
            body[pos] = static_cast<char>('0' + rng.Uniform(10));
          }
          break;
      }
    }
    SCOPED_TRACE("iteration " + std::to_string(i) + " body " + body);
    Result<CompletionRequest> r = ParseCompletionRequest(body, l);
    if (r.ok()) {
      ++accepted;
      CheckAccepted(*r, l);
    } else {
      const StatusCode c = r.status().code();
      ASSERT_TRUE(c == StatusCode::kInvalidArgument || c == StatusCode::kOutOfRange ||
                  c == StatusCode::kResourceExhausted)
          << r.status().ToString();
      ASSERT_FALSE(r.status().message().empty());
    }
  }
  // Both sides of the parser were exercised.
  EXPECT_GT(accepted, 500);
  EXPECT_LT(accepted, 19500);
  std::cout << "accepted " << accepted << " of 20000 mutations\n";
}

// The limit a refusal is over, as kvrelay_limit_rejections_total counts it.
TEST(CompletionRequestTest, ParseErrorLimitNamesTheLimit) {
  ParseLimits l = Limits();
  l.max_body_bytes = 40;
  l.max_prompt_tokens = 3;
  auto limit_of = [&](const std::string& body) {
    return std::string(ParseErrorLimit(ParseCompletionRequest(body, l).status()));
  };
  EXPECT_EQ(limit_of(R"({"prompt":"x","padding":")" + std::string(50, 'p') + "\"}"),
            "body_bytes");
  EXPECT_EQ(limit_of(R"({"prompt":[1,2,3,4]})"), "prompt_tokens");
  EXPECT_EQ(limit_of(R"({"prompt":"a b c d"})"), "prompt_tokens");
  const Status s = ParseCompletionRequest(R"({"prompt":[1,2,3,4]})", l).status();
  EXPECT_NE(s.message().find("prompt has 4 tokens; the limit is 3 (--max-prompt-tokens)"),
            std::string::npos)
      << s.ToString();
  EXPECT_EQ(limit_of(R"({"prompt":[1000]})"), "");      // a token id: not a configured limit
  EXPECT_EQ(limit_of(R"({"prompt":"x","max_tokens":"2"})"), "");
  EXPECT_EQ(limit_of(R"({"prompt":"x"})"), "");          // accepted
}

}  // namespace
}  // namespace kvrelay::server
