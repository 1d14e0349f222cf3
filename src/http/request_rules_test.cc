#include "http/request_rules.h"

#include <string>

#include <gtest/gtest.h>

namespace kvrelay::http {
namespace {

ServerLimits Small() {
  ServerLimits l;
  l.max_body_bytes = 16;
  l.max_header_bytes = 256;
  l.max_header_count = 4;
  l.max_target_bytes = 32;
  return l;
}

TEST(RequestRulesTest, AWholeRequestIsRead) {
  const ParsedBytes p = ParseRequestBytes(
      "POST /pause?mode=wait HTTP/1.1\r\nHost: x\r\nX-Up: 1\r\nContent-Length: 2\r\n\r\n{}",
      Small());
  ASSERT_EQ(p.kind, ParsedBytes::Kind::kRequest);
  EXPECT_EQ(p.request.path, "/pause");
  EXPECT_EQ(p.request.QueryValue("mode"), "wait");
  EXPECT_EQ(p.request.Header("x-up"), "1");
  EXPECT_EQ(p.request.body, "{}");
}

TEST(RequestRulesTest, AChunkedBodyIsReadWholeAndRefusedOverTheLimit) {
  ParsedBytes p = ParseRequestBytes(
      "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
      Small());
  ASSERT_EQ(p.kind, ParsedBytes::Kind::kRequest);
  EXPECT_EQ(p.request.body, "abcde");
  p = ParseRequestBytes(
      "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n1\r\nX\r\n",
      Small());
  ASSERT_EQ(p.kind, ParsedBytes::Kind::kRefused);
  EXPECT_EQ(p.refusal.status, 413);
  EXPECT_EQ(p.refusal.reason, Refusal::Reason::kBodyBytes);
}

TEST(RequestRulesTest, EachRuleRefusesWithItsStatus) {
  struct Case {
    std::string bytes;
    int status;
  } cases[] = {
      {"POST /a HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400},
      {"POST /a HTTP/1.1\r\nContent-Length: 17\r\n\r\n", 413},
      {"GET /a HTTP/1.1\r\nX: " + std::string(300, 'a') + "\r\n\r\n", 431},
      {"GET /a HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n\r\n", 431},
      {"GET /" + std::string(40, 'a') + " HTTP/1.1\r\n\r\n", 414},
      {"GET /%zz HTTP/1.1\r\n\r\n", 400},
      {"\x01\x02 / HTTP/1.1\r\n\r\n", 400},
  };
  for (const Case& c : cases) {
    const ParsedBytes p = ParseRequestBytes(c.bytes, Small());
    ASSERT_EQ(p.kind, ParsedBytes::Kind::kRefused) << c.bytes;
    EXPECT_EQ(p.refusal.status, c.status) << c.bytes << ": " << p.refusal.message;
  }
}

TEST(RequestRulesTest, APartialRequestNeedsMore) {
  EXPECT_EQ(ParseRequestBytes("GET /a HTTP/1.1\r\nHo", Small()).kind,
            ParsedBytes::Kind::kNeedMore);
  EXPECT_EQ(ParseRequestBytes("POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", Small()).kind,
            ParsedBytes::Kind::kNeedMore);
}

}  // namespace
}  // namespace kvrelay::http
