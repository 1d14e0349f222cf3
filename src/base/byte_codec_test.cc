#include "base/byte_codec.h"

#include <gtest/gtest.h>

namespace kvrelay {
namespace {

TEST(ByteCodecTest, FieldsAreLittleEndianAndReadBack) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U8(0x01);
  w.U16(0x0302);
  w.U32(0x07060504);
  w.U64(0x0f0e0d0c0b0a0908ull);
  ASSERT_EQ(out.size(), 15u);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], i + 1) << i;
  ByteReader r(out);
  EXPECT_EQ(r.U8(), 0x01);
  EXPECT_EQ(r.U16(), 0x0302);
  EXPECT_EQ(r.U32(), 0x07060504u);
  EXPECT_EQ(r.U64(), 0x0f0e0d0c0b0a0908ull);
  EXPECT_TRUE(r.AtEnd());
  EXPECT_TRUE(r.ok());
}

TEST(ByteCodecTest, AReadPastTheEndFailsAndStaysFailed) {
  const std::vector<uint8_t> in = {1, 2, 3};
  ByteReader r(in);
  EXPECT_EQ(r.U16(), 0x0201);
  EXPECT_EQ(r.U32(), 0u);   // 1 byte left
  EXPECT_TRUE(r.bad());
  EXPECT_EQ(r.U8(), 0u);    // even though a byte is left
  std::vector<uint8_t> taken;
  EXPECT_FALSE(r.Take(1, &taken));
  EXPECT_EQ(r.GetString(1), "");
}

TEST(ByteCodecTest, Fnv1a64KnownVectors) {
  // From the FNV reference (http://www.isthe.com/chongo/tech/comp/fnv/).
  EXPECT_EQ(Fnv1a64(std::string_view("")), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64(std::string_view("a")), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64(std::string_view("foobar")), 0x85944171f73967e8ull);
}

}  // namespace
}  // namespace kvrelay
