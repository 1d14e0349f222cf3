// utf8_stream.h — Utf8Stream: cuts a text that arrives in pieces (a streamed
// completion's chunks) only between characters.
//
// Why: a streamed chunk's text is its tokens decoded on their own, and a
// character whose bytes are several tokens (llama.cpp's byte tokens:
// <0xC3><0xA9> is "é") can end one chunk and start the next. Each chunk is a
// JSON string, where half a character becomes U+FFFD, so a client that
// appends the chunks' texts (as the OpenAI SDKs do) got "\uFFFD\uFFFD" where
// the same request without streaming says "é". Utf8Stream holds an
// incomplete last character back until the bytes that complete it arrive, or
// the stream ends; a chunk's token ids are sent as they come.
//
// Invariant: the concatenation of every Take() and the final Flush() is the
// concatenation of the pieces, byte for byte; at most 3 bytes are held.
// Owned by one streamed request; one thread at a time (the caller's lock).
#pragma once

#include <string>
#include <string_view>

namespace kvrelay::server {

class Utf8Stream {
 public:
  // What was held back and `piece`, up to the end of its last whole
  // character; an incomplete last character stays held. Bytes that are not
  // UTF-8 (a stray continuation byte, a byte no character starts with) pass
  // through: JSON replaces them as it would in the whole text.
  std::string Take(std::string_view piece);
  // Everything held back: the stream ended.
  std::string Flush();
  size_t held_bytes() const { return held_.size(); }

 private:
  std::string held_;
};

// The length of the longest prefix of `bytes` that does not end inside a
// UTF-8 character (`bytes.size()` unless its last character is incomplete).
size_t CompleteUtf8Prefix(std::string_view bytes);

}  // namespace kvrelay::server
