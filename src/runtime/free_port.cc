// free_port.cc — random loopback ports below the ephemeral range.
#include "runtime/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <random>
#include <set>

namespace kvrelay::runtime {
namespace {

bool CanBind(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

uint32_t EphemeralPortLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  uint32_t lo = 0;
  return in >> lo && lo > 0 ? lo : 32768;
}

uint16_t FreeLoopbackPorts(uint32_t n) {
  if (n == 0) n = 1;
  static std::mutex mu;
  static std::set<uint16_t> given;
  static std::mt19937 rng(std::random_device{}());
  const uint32_t lo = 10000;
  const uint32_t hi = std::min<uint32_t>(EphemeralPortLow(), 65535);
  if (hi <= lo + n) return 0;
  std::lock_guard<std::mutex> lock(mu);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint32_t base = lo + static_cast<uint32_t>(rng() % (hi - lo - n));
    bool ok = true;
    for (uint32_t k = 0; k < n && ok; ++k) {
      const auto p = static_cast<uint16_t>(base + k);
      ok = given.count(p) == 0 && CanBind(p);
    }
    if (!ok) continue;
    for (uint32_t k = 0; k < n; ++k) given.insert(static_cast<uint16_t>(base + k));
    return static_cast<uint16_t>(base);
  }
  return 0;
}

}  // namespace kvrelay::runtime
