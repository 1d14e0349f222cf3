// local_host_test.cc — which endpoint hosts count as this machine.
#include "runtime/local_host.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <string>

namespace kvrelay::runtime {
namespace {

TEST(LocalHostTest, LoopbackNamesAndAddressesAreLocal) {
  EXPECT_TRUE(IsLocalHost("localhost"));
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("127.1.2.3"));
  EXPECT_TRUE(IsLocalHost("::1"));
  EXPECT_TRUE(IsLocalHost("[::1]"));
}

TEST(LocalHostTest, OtherNamesAndForeignAddressesAreNot) {
  EXPECT_FALSE(IsLocalHost(""));
  EXPECT_FALSE(IsLocalHost("prefill-0.example"));  // a name: no DNS, so not local
  EXPECT_FALSE(IsLocalHost("192.0.2.7"));          // TEST-NET-1, never assigned
  EXPECT_FALSE(IsLocalHost("2001:db8::7"));        // documentation prefix
  EXPECT_FALSE(IsLocalHost("128.0.0.1"));
  EXPECT_FALSE(IsLocalHost("127.0.0.1:5000"));     // not an address
}

// Every IPv4 address on this host's interfaces is local.
TEST(LocalHostTest, AnAddressOfAnInterfaceIsLocal) {
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  int seen = 0;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* s = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    ASSERT_NE(inet_ntop(AF_INET, &s->sin_addr, text, sizeof text), nullptr);
    EXPECT_TRUE(IsLocalHost(text)) << text;
    ++seen;
  }
  freeifaddrs(list);
  EXPECT_GE(seen, 1);  // lo at least
}

}  // namespace
}  // namespace kvrelay::runtime
