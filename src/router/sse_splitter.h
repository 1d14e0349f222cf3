// sse_splitter.h — SseSplitter: cuts a server-sent-event byte stream into
// whole events, however the bytes were chunked on the way.
//
// Why: the router relays D's stream event by event, never half an event, so
// that it can end a stream with its own error event at any point and the
// client still sees well-formed SSE.
//
// An event is the text up to a blank line ("\n\n"; "\r\n" is read as "\n").
// Bytes after the last blank line wait for more input.
//
// Owner: one per relayed stream. Thread safety: none (one thread at a time).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kvrelay::router {

class SseSplitter {
 public:
  void Feed(std::string_view bytes);
  // The next whole event (without its terminating blank line), or nullopt.
  std::optional<std::string> Next();
  // Bytes held that do not yet form a whole event.
  size_t buffered() const { return buf_.size() - pos_; }

  // The payload of the event's "data:" lines (joined with "\n", one leading
  // space after the colon dropped); nullopt if it has none (a comment).
  static std::optional<std::string> DataOf(std::string_view event);

 private:
  std::string buf_;
  size_t pos_ = 0;   // start of the unconsumed bytes
};

}  // namespace kvrelay::router
