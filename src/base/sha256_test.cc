// sha256_test.cc — FIPS 180-4 (NIST example) vectors, and every split of a
// message across Update() calls giving the same digest.
#include "base/sha256.h"

#include <gtest/gtest.h>

#include <string>

namespace kvrelay {
namespace {

std::string Hex(std::string_view s) { return HexOf(Sha256::Hash(s)); }

TEST(Sha256Test, NistVectors) {
  EXPECT_EQ(Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
                "klmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256Test, MillionA) {
  Sha256 s;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) s.Update(chunk);
  EXPECT_EQ(HexOf(s.Final()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, EverySplitGivesTheSameDigest) {
  // Lengths around the padding boundaries (55, 56, 63, 64, ...).
  for (size_t len : {0u, 1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 127u, 128u, 200u}) {
    std::string m;
    for (size_t i = 0; i < len; ++i) m.push_back(static_cast<char>('a' + i % 26));
    const Sha256Digest whole = Sha256::Hash(m);
    for (size_t cut = 0; cut <= len; ++cut) {
      Sha256 s;
      s.Update(std::string_view(m).substr(0, cut));
      s.Update(std::string_view(m).substr(cut));
      EXPECT_EQ(s.Final(), whole) << "len " << len << " cut " << cut;
    }
  }
}

TEST(Sha256Test, HexRoundTrip) {
  std::array<uint8_t, 4> b{};
  EXPECT_TRUE(ParseHex("00ff7A10", b));
  EXPECT_EQ(HexOf(b), "00ff7a10");
  EXPECT_FALSE(ParseHex("00ff7a1", b));
  EXPECT_FALSE(ParseHex("00ff7a1g", b));
  EXPECT_FALSE(ParseHex("00ff7a1000", b));
}

}  // namespace
}  // namespace kvrelay
