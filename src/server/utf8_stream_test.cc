// Utf8Stream: a text cut anywhere comes out cut only between characters, and
// nothing is lost, added or reordered. rapidcheck prints its seed and the
// shrunk case on failure (RC_PARAMS="seed=N" replays it).
#include "server/utf8_stream.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

namespace kvrelay::server {
namespace {

TEST(Utf8StreamTest, ACharacterSplitOverTwoPiecesComesOutWhole) {
  Utf8Stream s;
  EXPECT_EQ(s.Take("caf\xC3"), "caf");   // "é" is C3 A9
  EXPECT_EQ(s.held_bytes(), 1u);
  EXPECT_EQ(s.Take("\xA9!"), "\xC3\xA9!");
  EXPECT_EQ(s.held_bytes(), 0u);
  // A four-byte character (U+1F600) one byte at a time.
  EXPECT_EQ(s.Take("\xF0"), "");
  EXPECT_EQ(s.Take("\x9F"), "");
  EXPECT_EQ(s.Take("\x98"), "");
  EXPECT_EQ(s.Take("\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8StreamTest, AStreamThatEndsInsideACharacterGivesItsBytesAtTheEnd) {
  Utf8Stream s;
  EXPECT_EQ(s.Take("a\xE2\x82"), "a");
  EXPECT_EQ(s.Flush(), "\xE2\x82");   // JSON makes it U+FFFD, as in the whole text
  EXPECT_EQ(s.held_bytes(), 0u);
}

TEST(Utf8StreamTest, BytesThatAreNotUtf8PassThrough) {
  EXPECT_EQ(CompleteUtf8Prefix("a\x80\x80\x80\x80"), 5u);   // stray continuations
  EXPECT_EQ(CompleteUtf8Prefix("a\xFF"), 2u);               // starts no character
  EXPECT_EQ(CompleteUtf8Prefix("\xC3" "A"), 2u);            // a lead cut short by ASCII
  EXPECT_EQ(CompleteUtf8Prefix("\xC3\xA9\xA9"), 3u);        // one continuation too many
  EXPECT_EQ(CompleteUtf8Prefix("x\xF0\x9F\x98"), 1u);       // 3 of 4 bytes: held
  EXPECT_EQ(CompleteUtf8Prefix(""), 0u);
}

// Any valid UTF-8 text, cut into pieces at any byte offsets: every piece
// that comes out is valid UTF-8 on its own, and together with the flush they
// are the text.
RC_GTEST_PROP(Utf8StreamProperty, PiecesOfValidTextComeOutValidAndWhole, ()) {
  const std::vector<uint32_t> code_points = *rc::gen::container<std::vector<uint32_t>>(
      rc::gen::oneOf(rc::gen::inRange<uint32_t>(0x20, 0x80),
                     rc::gen::inRange<uint32_t>(0x80, 0x800),
                     rc::gen::inRange<uint32_t>(0x800, 0xD800),
                     rc::gen::inRange<uint32_t>(0x10000, 0x110000)));
  std::string text;
  for (uint32_t c : code_points) {
    if (c < 0x80) {
      text += static_cast<char>(c);
    } else if (c < 0x800) {
      text += static_cast<char>(0xC0 | (c >> 6));
      text += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      text += static_cast<char>(0xE0 | (c >> 12));
      text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      text += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      text += static_cast<char>(0xF0 | (c >> 18));
      text += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      text += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      text += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  const std::vector<size_t> cuts = *rc::gen::container<std::vector<size_t>>(
      rc::gen::inRange<size_t>(0, text.size() + 1));
  std::vector<size_t> at(cuts.begin(), cuts.end());
  std::sort(at.begin(), at.end());
  Utf8Stream s;
  std::string joined;
  size_t from = 0;
  auto take = [&](size_t to) {
    const std::string out = s.Take(std::string_view(text).substr(from, to - from));
    RC_ASSERT(CompleteUtf8Prefix(out) == out.size());
    RC_ASSERT(s.held_bytes() <= 3u);
    // A piece that comes out starts a character: it never begins with a
    // continuation byte.
    RC_ASSERT(out.empty() || (static_cast<uint8_t>(out[0]) & 0xC0) != 0x80);
    joined += out;
    from = to;
  };
  for (size_t to : at) take(to);
  take(text.size());
  RC_ASSERT(s.held_bytes() == 0u);   // valid text ends on a whole character
  joined += s.Flush();
  RC_ASSERT(joined == text);
}

}  // namespace
}  // namespace kvrelay::server
