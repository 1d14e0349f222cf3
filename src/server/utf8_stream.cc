#include "server/utf8_stream.h"

#include <cstdint>

namespace kvrelay::server {
namespace {

// The length a UTF-8 character starting with `lead` has, or 0 when `lead`
// starts none (a continuation byte 10xxxxxx, or 0xF8 and above).
size_t SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 0;
}

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

}  // namespace

size_t CompleteUtf8Prefix(std::string_view bytes) {
  // The last lead byte within the last 4 bytes decides: if the bytes after
  // it are all continuations and fewer than its character needs, the
  // character is incomplete and the prefix ends before it.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto b = static_cast<uint8_t>(bytes[n - back]);
    if (IsContinuation(b)) continue;
    const size_t need = SequenceLength(b);
    return need > back ? n - back : n;
  }
  return n;   // only continuation bytes at the end: nothing to wait for
}

std::string Utf8Stream::Take(std::string_view piece) {
  std::string text = std::move(held_);
  held_.clear();
  text.append(piece);
  const size_t complete = CompleteUtf8Prefix(text);
  held_.assign(text, complete, std::string::npos);
  text.resize(complete);
  return text;
}

std::string Utf8Stream::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace kvrelay::server
