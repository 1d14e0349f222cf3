// nonce_store_test.cc — admin nonces are single use, expire, and are bounded.
#include "server/nonce_store.h"

#include <gtest/gtest.h>

#include <string>

namespace kvrelay::server {
namespace {

const Instant kT0 = Instant::FromNanos(5'000'000'000);

TEST(NonceStoreTest, SingleUse) {
  NonceStore s(8, Duration::Seconds(30));
  s.Add("a", kT0);
  EXPECT_TRUE(s.Consume("a", kT0));
  EXPECT_FALSE(s.Consume("a", kT0));  // replay
  EXPECT_FALSE(s.Consume("never", kT0));
}

TEST(NonceStoreTest, Expires) {
  NonceStore s(8, Duration::Seconds(30));
  s.Add("a", kT0);
  s.Add("b", kT0);
  EXPECT_TRUE(s.Consume("a", kT0 + Duration::Seconds(29)));
  EXPECT_FALSE(s.Consume("b", kT0 + Duration::Seconds(30)));
  EXPECT_EQ(s.size(), 0u);
}

TEST(NonceStoreTest, BoundedOldestDropped) {
  NonceStore s(3, Duration::Seconds(30));
  for (int i = 0; i < 5; ++i) s.Add("n" + std::to_string(i), kT0);
  EXPECT_EQ(s.size(), 3u);
  EXPECT_FALSE(s.Consume("n0", kT0));
  EXPECT_FALSE(s.Consume("n1", kT0));
  EXPECT_TRUE(s.Consume("n2", kT0));
  EXPECT_TRUE(s.Consume("n4", kT0));
}

TEST(NonceStoreTest, ChurnStaysBounded) {
  const uint64_t seed = 99;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  NonceStore s(16, Duration::Seconds(30));
  for (int i = 0; i < 10000; ++i) {
    const std::string n = "c" + std::to_string(i);
    s.Add(n, kT0);
    if (i % 3 != 0) {
      EXPECT_TRUE(s.Consume(n, kT0));
    }
    EXPECT_LE(s.size(), 16u);
  }
}

}  // namespace
}  // namespace kvrelay::server
