#include "server/json_body.h"

#include <string>

#include <gtest/gtest.h>

namespace kvrelay::server {
namespace {

TEST(ParseJsonBodyTest, ReadsAWholeValue) {
  Result<nlohmann::json> j = ParseJsonBody(R"({"a": [1, 2]})");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["a"][1], 2);
}

// nlohmann stops at a NUL and would take `{"a":1}` as the whole body.
TEST(ParseJsonBodyTest, ABodyWithANulIsRefusedNotCutShort) {
  const std::string body = std::string(R"({"a":1})") + '\0' + "garbage";
  Result<nlohmann::json> j = ParseJsonBody(body);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(j.status().message(), "body is not valid JSON: a NUL byte at offset 7");
}

TEST(ParseJsonBodyTest, ErrorsSayWhereWithoutTheLibrarysTag) {
  for (const char* bad : {"{", "{\"a\":}", "[1e400]", "", "nul"}) {
    Result<nlohmann::json> j = ParseJsonBody(bad);
    ASSERT_FALSE(j.ok()) << bad;
    const std::string m = j.status().message();
    EXPECT_EQ(m.rfind("body is not valid JSON: ", 0), 0u) << m;
    EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
    EXPECT_LE(m.size(), 24u + 203u) << m;
  }
}

}  // namespace
}  // namespace kvrelay::server
