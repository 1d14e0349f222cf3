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

TEST(JsonTypeNameTest, NamesEachKindAsAnErrorSaysIt) {
  using nlohmann::json;
  EXPECT_EQ(JsonTypeName(json(nullptr)), "null");
  EXPECT_EQ(JsonTypeName(json(true)), "a boolean");
  EXPECT_EQ(JsonTypeName(json(-3)), "an integer");
  EXPECT_EQ(JsonTypeName(json(3u)), "an integer");
  EXPECT_EQ(JsonTypeName(json(0.5)), "a non-integer number");
  EXPECT_EQ(JsonTypeName(json("x")), "a string");
  EXPECT_EQ(JsonTypeName(json::array()), "an array");
  EXPECT_EQ(JsonTypeName(json::object()), "an object");
}

TEST(QuoteForErrorTest, QuotesShortTextWholeAndCutsLongTextAtACharacter) {
  EXPECT_EQ(QuoteForError("abc"), "\"abc\"");
  const std::string exact(64, 'a');
  EXPECT_EQ(QuoteForError(exact), "\"" + exact + "\"");
  EXPECT_EQ(QuoteForError(exact + "b"), "\"" + exact + "...\"");
  // "é" (2 bytes) straddles the 64-byte cut: it is left out whole.
  const std::string straddle = std::string(63, 'a') + "\xC3\xA9" + "zz";
  EXPECT_EQ(QuoteForError(straddle), "\"" + std::string(63, 'a') + "...\"");
}

}  // namespace
}  // namespace kvrelay::server
