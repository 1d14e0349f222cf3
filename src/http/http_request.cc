#include "http/http_request.h"

namespace kvrelay::http {

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `in` (and '+' as a space when `plus_is_space`).
bool Decode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = HexValue(in[i + 1]);
      const int lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out->push_back(' ');
    } else {
      out->push_back(c);
    }
  }
  return true;
}

}  // namespace

std::string_view Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return {};
}

std::string Request::QueryValue(std::string_view key) const {
  auto it = query.find(std::string(key));
  return it == query.end() ? std::string() : it->second;
}

bool SplitTarget(std::string_view target, std::string* path,
                 std::multimap<std::string, std::string>* query) {
  const size_t q = target.find('?');
  const std::string_view raw_path = target.substr(0, q);
  if (raw_path.empty() || raw_path[0] != '/') return false;
  std::string decoded_path;
  if (!Decode(raw_path, /*plus_is_space=*/false, &decoded_path)) return false;
  std::multimap<std::string, std::string> params;
  if (q != std::string_view::npos) {
    std::string_view rest = target.substr(q + 1);
    while (!rest.empty()) {
      const size_t amp = rest.find('&');
      const std::string_view pair = rest.substr(0, amp);
      rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
      if (pair.empty()) continue;
      const size_t eq = pair.find('=');
      std::string key, value;
      if (!Decode(pair.substr(0, eq), true, &key)) return false;
      if (eq != std::string_view::npos && !Decode(pair.substr(eq + 1), true, &value)) {
        return false;
      }
      params.emplace(std::move(key), std::move(value));
    }
  }
  *path = std::move(decoded_path);
  *query = std::move(params);
  return true;
}

}  // namespace kvrelay::http
