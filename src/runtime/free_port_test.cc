// free_port_test.cc — ports below the ephemeral range, free, never twice.
#include "runtime/free_port.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

namespace kvrelay::runtime {
namespace {

TEST(FreePortTest, SpansBindBelowTheEphemeralRangeAndNeverRepeat) {
  const uint32_t ephemeral = EphemeralPortLow();
  std::set<uint32_t> seen;
  for (int i = 0; i < 50; ++i) {
    const uint32_t n = 1 + i % 4;
    const uint16_t base = FreeLoopbackPorts(n);
    ASSERT_NE(base, 0);
    EXPECT_GE(base, 10000u);
    EXPECT_LT(base + n, ephemeral);
    for (uint32_t k = 0; k < n; ++k) {
      EXPECT_TRUE(seen.insert(base + k).second) << "port " << base + k << " handed out twice";
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(base + k));
      EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << base + k;
      ::close(fd);
    }
  }
  EXPECT_EQ(FreeLoopbackPorts(0) != 0, true);  // 0 counts as 1
}

}  // namespace
}  // namespace kvrelay::runtime
