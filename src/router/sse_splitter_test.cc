#include "router/sse_splitter.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvrelay::router {
namespace {

std::vector<std::string> Drain(SseSplitter& s) {
  std::vector<std::string> out;
  while (auto e = s.Next()) out.push_back(*e);
  return out;
}

const std::string kStream =
    "data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
const std::vector<std::string> kEvents = {"data: {\"a\":1}", ": keep-alive", "data: {\"b\":2}",
                                          "data: [DONE]"};

TEST(SseSplitterTest, WholeEventsWhateverTheChunking) {
  for (size_t chunk = 1; chunk <= kStream.size(); ++chunk) {
    SseSplitter s;
    std::vector<std::string> got;
    for (size_t off = 0; off < kStream.size(); off += chunk) {
      s.Feed(std::string_view(kStream).substr(off, chunk));
      for (std::string& e : Drain(s)) got.push_back(std::move(e));
    }
    EXPECT_EQ(got, kEvents) << "chunk " << chunk;
    EXPECT_EQ(s.buffered(), 0u);
  }
}

TEST(SseSplitterTest, HoldsAPartialEvent) {
  SseSplitter s;
  s.Feed("data: {\"a\":1}\n");
  EXPECT_FALSE(s.Next().has_value());
  EXPECT_EQ(s.buffered(), 14u);
  s.Feed("\n");
  EXPECT_EQ(s.Next(), "data: {\"a\":1}");
}

TEST(SseSplitterTest, DataOf) {
  EXPECT_EQ(SseSplitter::DataOf("data: {\"a\":1}"), "{\"a\":1}");
  EXPECT_EQ(SseSplitter::DataOf("data:[DONE]"), "[DONE]");
  EXPECT_EQ(SseSplitter::DataOf("event: x\ndata: a\ndata: b"), "a\nb");
  EXPECT_FALSE(SseSplitter::DataOf(": keep-alive").has_value());
  EXPECT_FALSE(SseSplitter::DataOf("").has_value());
}

}  // namespace
}  // namespace kvrelay::router
