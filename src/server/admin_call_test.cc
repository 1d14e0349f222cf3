#include "server/admin_call.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace kvrelay::server {
namespace {

using engine::PauseMode;
using Query = std::map<std::string, std::string>;

template <typename T>
T Must(std::string_view path, const Query& q = {}, std::string_view body = "") {
  Result<AdminCall> r = ParseAdminCall(path, q, body);
  EXPECT_TRUE(r.ok()) << path << ": " << r.status().ToString();
  if (!r.ok()) return T{};
  EXPECT_TRUE(std::holds_alternative<T>(*r)) << path;
  if (!std::holds_alternative<T>(*r)) return T{};
  return std::get<T>(*r);
}

// ---------------------------------------------------------------------------
// Every endpoint, with its defaults and each argument.

TEST(AdminCallTest, PauseDefaultsAndArguments) {
  PauseCall c = Must<PauseCall>("/pause");
  EXPECT_EQ(c.mode, PauseMode::kAbort);
  EXPECT_FALSE(c.clear_cache);
  c = Must<PauseCall>("/pause", {{"mode", "wait"}});
  EXPECT_EQ(c.mode, PauseMode::kWait);
  c = Must<PauseCall>("/pause", {{"mode", "keep"}, {"clear_cache", "true"}});
  EXPECT_EQ(c.mode, PauseMode::kKeep);
  EXPECT_TRUE(c.clear_cache);
  c = Must<PauseCall>("/pause", {{"mode", "abort"}, {"clear_cache", "0"}});
  EXPECT_EQ(c.mode, PauseMode::kAbort);
  EXPECT_FALSE(c.clear_cache);
}

TEST(AdminCallTest, BooleanSpellings) {
  for (const char* t : {"true", "TRUE", "True", "1"}) {
    EXPECT_TRUE(Must<PauseCall>("/pause", {{"clear_cache", t}}).clear_cache) << t;
    EXPECT_TRUE(Must<ResetPrefixCacheCall>("/reset_prefix_cache",
                                           {{"reset_running_requests", t}})
                    .reset_running_requests)
        << t;
  }
  for (const char* f : {"false", "FALSE", "False", "0"}) {
    EXPECT_FALSE(Must<PauseCall>("/pause", {{"clear_cache", f}}).clear_cache) << f;
  }
}

TEST(AdminCallTest, Resume) { Must<ResumeCall>("/resume"); }

TEST(AdminCallTest, SleepDefaultsAndArguments) {
  SleepCall c = Must<SleepCall>("/sleep");
  EXPECT_EQ(c.level, 1u);
  EXPECT_EQ(c.mode, PauseMode::kAbort);
  for (uint32_t level : {0u, 1u, 2u}) {
    c = Must<SleepCall>("/sleep", {{"level", std::to_string(level)}, {"mode", "wait"}});
    EXPECT_EQ(c.level, level);
    EXPECT_EQ(c.mode, PauseMode::kWait);
  }
  EXPECT_EQ(Must<SleepCall>("/sleep", {{"mode", "keep"}}).mode, PauseMode::kKeep);
}

TEST(AdminCallTest, WakeUp) { Must<WakeUpCall>("/wake_up"); }

TEST(AdminCallTest, ResetPrefixCache) {
  EXPECT_FALSE(Must<ResetPrefixCacheCall>("/reset_prefix_cache").reset_running_requests);
  EXPECT_TRUE(Must<ResetPrefixCacheCall>("/reset_prefix_cache",
                                         {{"reset_running_requests", "true"}})
                  .reset_running_requests);
  EXPECT_FALSE(Must<ResetPrefixCacheCall>("/reset_prefix_cache",
                                          {{"reset_running_requests", "false"}})
                   .reset_running_requests);
}

TEST(AdminCallTest, ReleaseKvCacheMemory) {
  Must<ReleaseKvCacheMemoryCall>("/release_kv_cache_memory");
}

TEST(AdminCallTest, AbortRequests) {
  AbortRequestsCall c = Must<AbortRequestsCall>("/abort_requests", {}, "{}");
  EXPECT_TRUE(c.all);
  EXPECT_TRUE(c.request_ids.empty());
  c = Must<AbortRequestsCall>("/abort_requests", {}, R"({"request_ids": ["a", "cmpl-2"]})");
  EXPECT_FALSE(c.all);
  EXPECT_EQ(c.request_ids, (std::vector<std::string>{"a", "cmpl-2"}));
  c = Must<AbortRequestsCall>("/abort_requests", {}, R"({"request_ids": []})");
  EXPECT_FALSE(c.all);   // an empty list aborts nothing, not everything
  EXPECT_TRUE(c.request_ids.empty());
}

TEST(AdminCallTest, UpdateWeights) {
  UpdateWeightsCall c = Must<UpdateWeightsCall>("/update_weights", {}, R"({"version": 2})");
  EXPECT_EQ(c.version, 2u);
  EXPECT_EQ(c.mode, PauseMode::kAbort);
  c = Must<UpdateWeightsCall>("/update_weights", {}, R"({"version": 7, "mode": "wait"})");
  EXPECT_EQ(c.version, 7u);
  EXPECT_EQ(c.mode, PauseMode::kWait);
  c = Must<UpdateWeightsCall>("/update_weights", {},
                              R"({"version": 18446744073709551615, "mode": "keep"})");
  EXPECT_EQ(c.version, UINT64_MAX);
  EXPECT_EQ(c.mode, PauseMode::kKeep);
  c = Must<UpdateWeightsCall>("/update_weights", {}, R"({"version": 1, "mode": null})");
  EXPECT_EQ(c.mode, PauseMode::kAbort);
}

TEST(AdminCallTest, QueryOnlyEndpointsAcceptEmptyishBodies) {
  for (const char* body : {"", "  \n", "{}", " { } ", "null"}) {
    Must<PauseCall>("/pause", {}, body);
    Must<ResumeCall>("/resume", {}, body);
    Must<WakeUpCall>("/wake_up", {}, body);
  }
}

TEST(AdminCallTest, Names) {
  EXPECT_EQ(AdminCallName(AdminCall(PauseCall{})), "pause");
  EXPECT_EQ(AdminCallName(AdminCall(ResumeCall{})), "resume");
  EXPECT_EQ(AdminCallName(AdminCall(SleepCall{})), "sleep");
  EXPECT_EQ(AdminCallName(AdminCall(WakeUpCall{})), "wake_up");
  EXPECT_EQ(AdminCallName(AdminCall(ResetPrefixCacheCall{})), "reset_prefix_cache");
  EXPECT_EQ(AdminCallName(AdminCall(ReleaseKvCacheMemoryCall{})), "release_kv_cache_memory");
  EXPECT_EQ(AdminCallName(AdminCall(AbortRequestsCall{})), "abort_requests");
  EXPECT_EQ(AdminCallName(AdminCall(UpdateWeightsCall{})), "update_weights");
  EXPECT_EQ(PauseModeName(PauseMode::kAbort), "abort");
  EXPECT_EQ(PauseModeName(PauseMode::kWait), "wait");
  EXPECT_EQ(PauseModeName(PauseMode::kKeep), "keep");
}

TEST(AdminCallTest, EveryPathParsesToItsOwnName) {
  for (std::string_view path : AdminPaths()) {
    std::string body;
    if (path == "/abort_requests") body = "{}";
    if (path == "/update_weights") body = R"({"version": 3})";
    Result<AdminCall> r = ParseAdminCall(path, {}, body);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    EXPECT_EQ("/" + std::string(AdminCallName(*r)), path);
  }
  EXPECT_EQ(AdminPaths().size(), std::variant_size_v<AdminCall>);
}

// ---------------------------------------------------------------------------
// Errors: one row per rule.

struct BadCall {
  std::string path;
  Query query;
  std::string body;
  StatusCode code;
  std::string message;   // the exact message
};

TEST(AdminCallTest, Errors) {
  const StatusCode kInv = StatusCode::kInvalidArgument;
  const std::vector<BadCall> cases = {
      // paths
      {"/pauze", {}, "", StatusCode::kNotFound, R"(no admin endpoint "/pauze")"},
      {"/pause/", {}, "", StatusCode::kNotFound, R"(no admin endpoint "/pause/")"},
      {"", {}, "", StatusCode::kNotFound, R"(no admin endpoint "")"},
      // modes
      {"/pause", {{"mode", "drain"}}, "", kInv, R"(mode must be abort, wait or keep; got "drain")"},
      {"/pause", {{"mode", "ABORT"}}, "", kInv, R"(mode must be abort, wait or keep; got "ABORT")"},
      {"/pause", {{"mode", ""}}, "", kInv, R"(mode must be abort, wait or keep; got "")"},
      {"/sleep", {{"mode", "stop"}}, "", kInv, R"(mode must be abort, wait or keep; got "stop")"},
      // booleans
      {"/pause", {{"clear_cache", "yes"}}, "", kInv,
       R"(clear_cache must be true, false, 1 or 0; got "yes")"},
      {"/pause", {{"clear_cache", ""}}, "", kInv,
       R"(clear_cache must be true, false, 1 or 0; got "")"},
      {"/pause", {{"clear_cache", "2"}}, "", kInv,
       R"(clear_cache must be true, false, 1 or 0; got "2")"},
      {"/reset_prefix_cache", {{"reset_running_requests", "on"}}, "", kInv,
       R"(reset_running_requests must be true, false, 1 or 0; got "on")"},
      // levels
      {"/sleep", {{"level", "3"}}, "", kInv, R"(level must be 0, 1 or 2; got "3")"},
      {"/sleep", {{"level", "-1"}}, "", kInv, R"(level must be 0, 1 or 2; got "-1")"},
      {"/sleep", {{"level", "01"}}, "", kInv, R"(level must be 0, 1 or 2; got "01")"},
      {"/sleep", {{"level", ""}}, "", kInv, R"(level must be 0, 1 or 2; got "")"},
      // unknown query parameters
      {"/pause", {{"clear", "true"}}, "", kInv,
       R"(unknown query parameter "clear" for POST /pause; allowed: mode, clear_cache)"},
      {"/sleep", {{"mode", "wait"}, {"lvl", "2"}}, "", kInv,
       R"(unknown query parameter "lvl" for POST /sleep; allowed: level, mode)"},
      {"/reset_prefix_cache", {{"all", "1"}}, "", kInv,
       R"(unknown query parameter "all" for POST /reset_prefix_cache; allowed: reset_running_requests)"},
      {"/resume", {{"mode", "wait"}}, "", kInv, R"(POST /resume takes no query parameters; got "mode")"},
      {"/wake_up", {{"tags", "x"}}, "", kInv, R"(POST /wake_up takes no query parameters; got "tags")"},
      {"/release_kv_cache_memory", {{"x", ""}}, "", kInv,
       R"(POST /release_kv_cache_memory takes no query parameters; got "x")"},
      {"/abort_requests", {{"all", "true"}}, "{}", kInv,
       R"(POST /abort_requests takes no query parameters; got "all")"},
      {"/update_weights", {{"version", "2"}}, R"({"version":2})", kInv,
       R"(POST /update_weights takes no query parameters; got "version")"},
      // bodies sent to query-only endpoints
      {"/pause", {}, R"({"mode":"wait"})", kInv,
       "POST /pause takes its arguments in the query string, not in a body (got 15 bytes of body)"},
      {"/sleep", {}, "level=2", kInv,
       "POST /sleep takes its arguments in the query string, not in a body (got 7 bytes of body)"},
      {"/resume", {}, "[]", kInv,
       "POST /resume takes its arguments in the query string, not in a body (got 2 bytes of body)"},
      {"/pause", {}, R"({"x":1e400})", kInv,
       "POST /pause takes its arguments in the query string, not in a body (got 11 bytes of body)"},
      // abort_requests bodies
      {"/abort_requests", {}, "", kInv,
       R"(POST /abort_requests needs a JSON body, e.g. {"request_ids": ["id", ...]}, or {} to abort every request)"},
      {"/abort_requests", {}, "{", kInv,
       "body is not valid JSON: at line 1, column 2: syntax error while parsing object key - "
       "unexpected end of input; expected string literal"},
      {"/abort_requests", {}, R"(["a"])", kInv,
       R"(body must be a JSON object (got an array), e.g. {"request_ids": ["id", ...]}, or {} to abort every request)"},
      {"/abort_requests", {}, R"({"request_id": ["a"]})", kInv,
       R"(unknown field "request_id" in the body of POST /abort_requests; allowed: request_ids)"},
      {"/abort_requests", {}, R"({"request_ids": null})", kInv,
       "request_ids must be an array of strings (got null); send {} to abort every request"},
      {"/abort_requests", {}, R"({"request_ids": "a"})", kInv,
       "request_ids must be an array of strings (got a string); send {} to abort every request"},
      {"/abort_requests", {}, R"({"request_ids": ["a", 2]})", kInv,
       "request_ids[1] must be a string (got an integer)"},
      // update_weights bodies
      {"/update_weights", {}, "", kInv,
       R"(POST /update_weights needs a JSON body, e.g. {"version": 2, "mode": "abort"})"},
      {"/update_weights", {}, "{}", kInv,
       "version is required: the weights version to load, an integer >= 1"},
      {"/update_weights", {}, R"({"version": null})", kInv,
       "version is required: the weights version to load, an integer >= 1"},
      {"/update_weights", {}, R"({"version": 0})", kInv, "version must be an integer >= 1; got 0"},
      {"/update_weights", {}, R"({"version": -2})", kInv, "version must be an integer >= 1; got -2"},
      {"/update_weights", {}, R"({"version": 1.5})", kInv,
       "version must be an integer >= 1 (got a non-integer number)"},
      {"/update_weights", {}, R"({"version": "2"})", kInv,
       "version must be an integer >= 1 (got a string)"},
      {"/update_weights", {}, R"({"version": 18446744073709551616})", kInv,
       "version must be an integer >= 1 (got a non-integer number)"},
      {"/update_weights", {}, R"({"version": 2, "mode": "later"})", kInv,
       R"(mode must be abort, wait or keep; got "later")"},
      {"/update_weights", {}, R"({"version": 2, "mode": 1})", kInv,
       "mode must be a string: abort, wait or keep (got an integer)"},
      {"/update_weights", {}, R"({"version": 2, "weights": "x"})", kInv,
       R"(unknown field "weights" in the body of POST /update_weights; allowed: version, mode)"},
      {"/update_weights", {}, R"({"version": 1e400})", kInv,
       "body is not valid JSON: number overflow parsing '1e400'"},
  };
  for (const BadCall& c : cases) {
    SCOPED_TRACE(c.path + " body " + c.body);
    Result<AdminCall> r = ParseAdminCall(c.path, c.query, c.body);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code);
    EXPECT_EQ(r.status().message(), c.message);
  }
}

TEST(AdminCallTest, LongValuesInMessagesAreCut) {
  Result<AdminCall> r = ParseAdminCall("/pause", {{"mode", std::string(1000, 'x')}}, "");
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 120u);
}

// Parameters as the HTTP layer hands them over: a key given twice is refused,
// never read as the first or the last.
TEST(AdminRequestTest, RepeatedQueryParametersAreRefused) {
  const std::multimap<std::string, std::string> twice = {{"mode", "wait"}, {"mode", "abort"}};
  Result<AdminCall> r = ParseAdminRequest("/pause", twice, "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("\"mode\" is given more than once"), std::string::npos);
  const std::multimap<std::string, std::string> once = {{"mode", "wait"},
                                                        {"clear_cache", "true"}};
  r = ParseAdminRequest("/pause", once, "");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::get<PauseCall>(*r).mode, engine::PauseMode::kWait);
  EXPECT_TRUE(std::get<PauseCall>(*r).clear_cache);
}

}  // namespace
}  // namespace kvrelay::server
