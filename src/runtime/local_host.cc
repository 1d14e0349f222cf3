// local_host.cc — IsLocalHost: literals and "localhost" only, no DNS.
#include "runtime/local_host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

namespace kvrelay::runtime {

bool IsLocalHost(const std::string& host) {
  if (host == "localhost") return true;
  // "[::1]" as in a URL: drop the brackets.
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = inet_pton(AF_INET, h.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && inet_pton(AF_INET6, h.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) return false;
  if (is_v4 && (ntohl(v4.s_addr) >> 24) == 127) return true;
  if (is_v6 && IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    if (is_v4 && a->ifa_addr->sa_family == AF_INET) {
      const auto* s = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      found = s->sin_addr.s_addr == v4.s_addr;
    } else if (is_v6 && a->ifa_addr->sa_family == AF_INET6) {
      const auto* s = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      found = std::memcmp(&s->sin6_addr, &v6, sizeof v6) == 0;
    }
  }
  freeifaddrs(list);
  return found;
}

}  // namespace kvrelay::runtime
