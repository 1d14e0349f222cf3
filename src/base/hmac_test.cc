// hmac_test.cc — the seven HMAC-SHA-256 vectors of RFC 4231 and the
// constant-time comparison.
#include "base/hmac.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvrelay {
namespace {

std::string Mac(const std::vector<uint8_t>& key, const std::string& data) {
  return HexOf(HmacSha256Of(key, std::span<const uint8_t>(
                                     reinterpret_cast<const uint8_t*>(data.data()), data.size())));
}

TEST(HmacTest, Rfc4231Case1) {
  EXPECT_EQ(Mac(std::vector<uint8_t>(20, 0x0b), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(HmacTest, Rfc4231Case2KeyShorterThanOutput) {
  EXPECT_EQ(HexOf(HmacSha256Of("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HmacTest, Rfc4231Case3) {
  EXPECT_EQ(Mac(std::vector<uint8_t>(20, 0xaa), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
}

TEST(HmacTest, Rfc4231Case4) {
  std::vector<uint8_t> key;
  for (uint8_t i = 1; i <= 25; ++i) key.push_back(i);
  EXPECT_EQ(Mac(key, std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
}

TEST(HmacTest, Rfc4231Case5Truncated) {
  EXPECT_EQ(Mac(std::vector<uint8_t>(20, 0x0c), "Test With Truncation").substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
}

TEST(HmacTest, Rfc4231Case6KeyLargerThanBlock) {
  EXPECT_EQ(Mac(std::vector<uint8_t>(131, 0xaa),
                "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacTest, Rfc4231Case7KeyAndDataLargerThanBlock) {
  EXPECT_EQ(Mac(std::vector<uint8_t>(131, 0xaa),
                "This is a test using a larger than block-size key and a larger than "
                "block-size data. The key needs to be hashed before being used by the HMAC "
                "algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacTest, IncrementalEqualsOneShot) {
  HmacSha256 h(std::string_view("Jefe"));
  h.Update(std::string_view("what do ya want "));
  h.Update(std::string_view("for nothing?"));
  EXPECT_EQ(h.Final(), HmacSha256Of("Jefe", "what do ya want for nothing?"));
}

TEST(HmacTest, ConstantTimeEqual) {
  const std::vector<uint8_t> a = {1, 2, 3}, b = {1, 2, 3}, c = {1, 2, 4}, d = {1, 2};
  EXPECT_TRUE(ConstantTimeEqual(a, b));
  EXPECT_FALSE(ConstantTimeEqual(a, c));
  EXPECT_FALSE(ConstantTimeEqual(a, d));
  EXPECT_TRUE(ConstantTimeEqual(std::span<const uint8_t>(), std::span<const uint8_t>()));
}

}  // namespace
}  // namespace kvrelay
