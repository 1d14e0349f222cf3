#include "core/wire.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>

#include "base/prng.h"

namespace kvrelay {
namespace {

HandshakeMsg SampleHandshake() {
  HandshakeMsg h;
  h.engine_id = 7;
  h.incarnation = 3;
  h.rank = 1;
  h.tp = 2;
  h.role = 1;
  h.transport = 0;
  h.layers = 36;
  h.kv_heads = 8;
  h.head_dim = 128;
  h.dtype_bytes = 2;
  h.block_tokens = 16;
  h.num_blocks = 4096;
  h.registration = {'/', 'k', 'v', 'r', 'e', 'l', 'a', 'y'};
  for (uint8_t i = 0; i < 16; ++i) {
    h.nonce[i] = i + 1;
    h.echo[i] = 0xF0 ^ i;
  }
  h.mac[0] = 0xAB;
  h.mac[31] = 0xCD;
  return h;
}

PullMsg SamplePull() {
  PullMsg p;
  p.pull_seq = 42;
  p.items.push_back(PullItem{TransferId{1, 2}, {BlockId{3, 1}, BlockId{4, 2}}, 99});
  p.items.push_back(PullItem{TransferId{5, 6}, {}, 0});  // a release
  return p;
}

std::vector<WireMessage> Samples() {
  return {SampleHandshake(),
          SamplePull(),
          AnswerMsg{42, TransferId{1, 2}, TransferResult::kDeadline},
          AnswerMsg{43, TransferId{1, 2}, TransferResult::kOk, 1234},
          HeartbeatMsg{3, 77},
          LeaseMsg{9, TransferId{1, 2}, 0x1234},
          GrantMsg{9, TransferId{1, 2}, LeaseAnswer::kGranted, TransferResult::kOk,
                   20'000'000'000, {BlockId{3, 1}, BlockId{4, 2}}},
          GrantMsg{10, TransferId{1, 2}, LeaseAnswer::kEnded, TransferResult::kExpired, 0, {}},
          RevokeMsg{TransferId{5, 6}},
          RevokeMsg{TransferId{5, 6}, TransferResult::kReset},
          AnswerMsg{44, TransferId{1, 2}, TransferResult::kMismatch},
          NoticeMsg{TransferId{5, 6}, ReadNotice::kRevoked}};
}

TEST(WireTest, EveryTypeRoundTrips) {
  for (const WireMessage& m : Samples()) {
    const std::vector<uint8_t> frame = EncodeWire(m);
    Result<WireMessage> back = DecodeWire(frame, WireLimits{});
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == m);
  }
}

TEST(WireTest, EveryTruncationIsRejected) {
  for (const WireMessage& m : Samples()) {
    const std::vector<uint8_t> frame = EncodeWire(m);
    for (size_t n = 0; n < frame.size(); ++n) {
      Result<WireMessage> r =
          DecodeWire(std::span<const uint8_t>(frame.data(), n), WireLimits{});
      EXPECT_FALSE(r.ok()) << "prefix of " << n << " bytes decoded";
    }
  }
}

// A corrupted byte is either refused or yields a message that encodes back
// to exactly the corrupted frame: the decoder never invents content.
TEST(WireTest, EverySingleByteCorruptionIsRefusedOrExact) {
  for (const WireMessage& m : Samples()) {
    const std::vector<uint8_t> frame = EncodeWire(m);
    for (size_t i = 0; i < frame.size(); ++i) {
      for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
        std::vector<uint8_t> bad = frame;
        bad[i] ^= flip;
        Result<WireMessage> r = DecodeWire(bad, WireLimits{});
        if (r.ok()) {
          EXPECT_EQ(EncodeWire(*r), bad) << "byte " << i;
        }
      }
    }
  }
}

TEST(WireTest, ErrorsSayWhatIsWrong) {
  std::vector<uint8_t> frame = EncodeWire(SamplePull());
  std::vector<uint8_t> v2 = frame;
  v2[4] = kWireVersion + 1;
  EXPECT_EQ(DecodeWire(v2, {}).status().code(), StatusCode::kFailedPrecondition);
  std::vector<uint8_t> magic = frame;
  magic[0] ^= 1;
  EXPECT_NE(DecodeWire(magic, {}).status().message().find("magic"), std::string::npos);
  std::vector<uint8_t> trailing = frame;
  trailing.push_back(0);
  EXPECT_EQ(DecodeWire(trailing, {}).status().code(), StatusCode::kInvalidArgument);
  WireLimits small;
  small.max_items_per_pull = 1;
  EXPECT_EQ(DecodeWire(frame, small).status().code(), StatusCode::kOutOfRange);
  small = WireLimits{};
  small.max_blocks_per_item = 1;
  EXPECT_EQ(DecodeWire(frame, small).status().code(), StatusCode::kOutOfRange);
  small = WireLimits{};
  small.max_frame_bytes = 16;
  EXPECT_EQ(DecodeWire(frame, small).status().code(), StatusCode::kOutOfRange);
  AnswerMsg a{1, TransferId{1, 1}, TransferResult::kOk};
  std::vector<uint8_t> bad_result = EncodeWire(a);
  bad_result[bad_result.size() - 5] = kTransferResultCount;  // result, then a u32 token
  EXPECT_FALSE(DecodeWire(bad_result, {}).ok());
}

// Only an ok answer names the producer's first token: a failed transfer
// has no KV at D to go with it.
TEST(WireTest, AFirstTokenOnlyRidesAnOkAnswer) {
  Result<WireMessage> ok = DecodeWire(
      EncodeWire(AnswerMsg{1, TransferId{1, 1}, TransferResult::kOk, 7}), {});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(std::get<AnswerMsg>(*ok).first_token, 7u);
  Result<WireMessage> none = DecodeWire(EncodeWire(AnswerMsg{1, TransferId{1, 1}}), {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(std::get<AnswerMsg>(*none).first_token, kNoFirstToken);
  Result<WireMessage> bad = DecodeWire(
      EncodeWire(AnswerMsg{1, TransferId{1, 1}, TransferResult::kAborted, 7}), {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("first token"), std::string::npos)
      << bad.status().ToString();
}

// Every limit refusal says which WireLimits field it is over, so the rank
// actor can count it (kvrelay_limit_rejections_total{limit=...}).
TEST(WireTest, LimitRefusalsNameTheirLimit) {
  const std::vector<uint8_t> pull = EncodeWire(SamplePull());
  const std::vector<uint8_t> hs = EncodeWire(SampleHandshake());
  WireLimits small;
  small.max_items_per_pull = 1;
  EXPECT_EQ(WireLimitOf(DecodeWire(pull, small).status()), WireLimit::kItemsPerPull);
  small = WireLimits{};
  small.max_blocks_per_item = 1;
  EXPECT_EQ(WireLimitOf(DecodeWire(pull, small).status()), WireLimit::kBlocksPerItem);
  small = WireLimits{};
  small.max_frame_bytes = 16;
  EXPECT_EQ(WireLimitOf(DecodeWire(pull, small).status()), WireLimit::kFrameBytes);
  small = WireLimits{};
  small.max_registration_bytes = 2;
  EXPECT_EQ(WireLimitOf(DecodeWire(hs, small).status()), WireLimit::kRegistrationBytes);
  std::vector<uint8_t> trailing = pull;
  trailing.push_back(0);
  EXPECT_EQ(WireLimitOf(DecodeWire(trailing, {}).status()), std::nullopt);
  EXPECT_EQ(WireLimitOf(Status::Ok()), std::nullopt);
  EXPECT_EQ(WireLimitName(WireLimit::kItemsPerPull), "wire_items_per_pull");
}

// A count that claims more items than the frame can hold is refused before
// anything is reserved (no allocation driven by a peer's number).
TEST(WireTest, HugeCountsAreRefusedCheaply) {
  PullMsg p;
  p.pull_seq = 1;
  std::vector<uint8_t> frame = EncodeWire(p);
  const uint32_t lie = 4000;  // under the limit, far over the bytes present
  // The item count follows pull_seq (u64) and to_incarnation (u32).
  std::memcpy(frame.data() + kWireHeaderBytes + 12, &lie, 4);
  EXPECT_FALSE(DecodeWire(frame, {}).ok());
}

// A pull names the P incarnation it is for (version 5): a restarted P tells
// its predecessor's pulls from its own.
TEST(WireTest, APullCarriesItsPIncarnation) {
  PullMsg p;
  p.pull_seq = 6;
  p.to_incarnation = 0xC0FFEE;
  p.items.push_back(PullItem{TransferId{1, 2}, {BlockId{3, 4}}, 5, 6});
  Result<WireMessage> back = DecodeWire(EncodeWire(p), {});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::get<PullMsg>(*back), p);
  EXPECT_EQ(std::get<PullMsg>(*back).to_incarnation, 0xC0FFEEu);
}

TEST(WireTest, RandomBytesNeverCrash) {
  Prng prng(12345);
  for (int i = 0; i < 100000; ++i) {
    std::vector<uint8_t> buf(prng.Uniform(64));
    for (auto& b : buf) b = static_cast<uint8_t>(prng.Next64());
    if (buf.size() >= 12 && prng.OneIn(2)) {  // a valid header, random payload
      const uint32_t magic = kWireMagic;
      std::memcpy(buf.data(), &magic, 4);
      buf[4] = 1;
      buf[5] = 0;
      buf[6] = static_cast<uint8_t>(1 + prng.Uniform(4));
      buf[7] = 0;
      const uint32_t len = static_cast<uint32_t>(buf.size() - 12);
      std::memcpy(buf.data() + 8, &len, 4);
    }
    Result<WireMessage> r = DecodeWire(buf, WireLimits{});
    if (r.ok()) {
      EXPECT_EQ(EncodeWire(*r), buf);
    }
  }
}

RC_GTEST_PROP(WireProperty, PullRoundTrips, (uint64_t seq, std::vector<uint32_t> shape)) {
  PullMsg p;
  p.pull_seq = seq;
  for (size_t i = 0; i < shape.size() && i < 50; ++i) {
    PullItem item;
    item.transfer = TransferId{shape[i], seq ^ i};
    item.prompt_hash = Mix64(shape[i]);
    for (uint32_t b = 0; b < shape[i] % 20; ++b) item.dst.push_back(BlockId{b, shape[i]});
    p.items.push_back(std::move(item));
  }
  Result<WireMessage> back = DecodeWire(EncodeWire(p), WireLimits{});
  RC_ASSERT(back.ok());
  RC_ASSERT(std::get<PullMsg>(*back) == p);
}

// A revoke names why the lease ends; an unknown reason, or "ok", is
// refused like any other bad field.
TEST(WireTest, ARevokeWithAnUnknownReasonIsRejected) {
  for (uint8_t bad : {uint8_t{0}, static_cast<uint8_t>(kTransferResultCount), uint8_t{255}}) {
    std::vector<uint8_t> frame = EncodeWire(RevokeMsg{TransferId{5, 6}, TransferResult::kReset});
    frame.back() = bad;  // the reason is the last byte
    EXPECT_FALSE(DecodeWire(frame, WireLimits{}).ok()) << int{bad};
  }
}

}  // namespace
}  // namespace kvrelay
