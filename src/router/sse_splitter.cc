#include "router/sse_splitter.h"

namespace kvrelay::router {

void SseSplitter::Feed(std::string_view bytes) {
  if (pos_ > 0 && pos_ * 2 >= buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  for (char c : bytes) {
    if (c != '\r') buf_.push_back(c);
  }
}

std::optional<std::string> SseSplitter::Next() {
  const size_t end = buf_.find("\n\n", pos_);
  if (end == std::string::npos) return std::nullopt;
  std::string event = buf_.substr(pos_, end - pos_);
  pos_ = end + 2;
  return event;
}

std::optional<std::string> SseSplitter::DataOf(std::string_view event) {
  std::optional<std::string> data;
  while (!event.empty()) {
    const size_t nl = event.find('\n');
    std::string_view line = event.substr(0, nl);
    event = nl == std::string_view::npos ? std::string_view() : event.substr(nl + 1);
    if (!line.starts_with("data:")) continue;
    line.remove_prefix(5);
    if (line.starts_with(" ")) line.remove_prefix(1);
    if (data) {
      data->push_back('\n');
      data->append(line);
    } else {
      data = std::string(line);
    }
  }
  return data;
}

}  // namespace kvrelay::router
