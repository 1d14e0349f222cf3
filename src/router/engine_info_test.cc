#include "router/engine_info.h"

#include <gtest/gtest.h>

namespace kvrelay::router {
namespace {

using nlohmann::json;

json Good() {
  return json{{"engine_id", 18100},  {"incarnation", 603511826}, {"role", "prefill"},
              {"tp", 2},             {"kv_host", "127.0.0.1"},    {"kv_port", 19100},
              {"transport", "shm"},  {"kv_mode", "read"},         {"model", "kvrelay-tiny"},
              {"model_shape", "tiny"}, {"max_context", 1024}};
}

TEST(EngineInfoTest, KvModeIsPushWhenAbsentAndOnlyPushOrRead) {
  json j = Good();
  j.erase("kv_mode");  // an engine from before read mode
  Result<EngineInfo> info = ParseEngineInfo(j.dump());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->kv_mode, "push");
  j["kv_mode"] = "pull";
  EXPECT_FALSE(ParseEngineInfo(j.dump()).ok());
}

TEST(EngineInfoTest, ParsesKvInfoAndWritesItBack) {
  Result<EngineInfo> info = ParseEngineInfo(Good().dump());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->engine_id, 18100u);
  EXPECT_EQ(info->tp, 2u);
  EXPECT_EQ(info->kv_host, "127.0.0.1");
  EXPECT_EQ(info->kv_port, 19100);
  EXPECT_EQ(info->kv_mode, "read");
  EXPECT_EQ(info->ToJson(), Good());
}

TEST(EngineInfoTest, NamesTheBadField) {
  struct Case {
    const char* field;
    json value;
  } cases[] = {{"engine_id", -1},     {"engine_id", "x"},  {"tp", 0},
               {"kv_port", 0},        {"kv_port", 70000},  {"kv_host", ""},
               {"role", 3},           {"max_context", nullptr}};
  for (const Case& c : cases) {
    json j = Good();
    j[c.field] = c.value;
    Result<EngineInfo> info = ParseEngineInfo(j.dump());
    ASSERT_FALSE(info.ok()) << c.field;
    EXPECT_NE(info.status().message().find(c.field), std::string::npos)
        << info.status().message();
  }
  json j = Good();
  j.erase("transport");
  EXPECT_FALSE(ParseEngineInfo(j.dump()).ok());
  EXPECT_FALSE(ParseEngineInfo("not json").ok());
  EXPECT_FALSE(ParseEngineInfo("[]").ok());
}

TEST(EngineInfoTest, NormalizesUrls) {
  EXPECT_EQ(*NormalizeEngineUrl("http://127.0.0.1:8100"), "http://127.0.0.1:8100");
  EXPECT_EQ(*NormalizeEngineUrl("http://127.0.0.1:8100/"), "http://127.0.0.1:8100");
  EXPECT_EQ(*NormalizeEngineUrl("localhost:80"), "http://localhost:80");
  for (const char* bad : {"", "http://", "127.0.0.1", "http://h:0", "http://h:99999",
                          "https://h:1", "http://h:1/v1", "h:x", ":80", "ftp://h:1",
                          "http://a b:1"}) {
    EXPECT_FALSE(NormalizeEngineUrl(bad).ok()) << bad;
  }
}

TEST(EngineInfoTest, RoleMustFitTheList) {
  EngineInfo i;
  for (const char* role : {"prefill", "both"}) {
    i.role = role;
    EXPECT_TRUE(CheckRoleFits("u", i, LegRole::kPrefill).ok()) << role;
  }
  for (const char* role : {"decode", "plain"}) {
    i.role = role;
    Status s = CheckRoleFits("http://x:1", i, LegRole::kPrefill);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << role;
    EXPECT_NE(s.message().find("http://x:1"), std::string::npos);
    EXPECT_NE(s.message().find("--prefill"), std::string::npos);
  }
  for (const char* role : {"decode", "both"}) {
    i.role = role;
    EXPECT_TRUE(CheckRoleFits("u", i, LegRole::kDecode).ok()) << role;
  }
  for (const char* role : {"prefill", "plain"}) {
    i.role = role;
    EXPECT_FALSE(CheckRoleFits("u", i, LegRole::kDecode).ok()) << role;
  }
}

}  // namespace
}  // namespace kvrelay::router
