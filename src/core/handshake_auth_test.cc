// handshake_auth_test.cc — the challenge-response of handshake_auth.h:
// signing, tampering, side separation, single use, and the bounds.
#include "core/handshake_auth.h"

#include <gtest/gtest.h>

#include "base/prng.h"

namespace kvrelay {
namespace {

HandshakeNonce NonceFrom(Prng& prng) {
  HandshakeNonce n;
  for (auto& b : n) b = static_cast<uint8_t>(prng.Next64());
  return n;
}

HandshakeMsg Hello() {
  HandshakeMsg h;
  h.engine_id = 9;
  h.incarnation = 4;
  h.tp = 1;
  h.role = 1;
  h.layers = 2;
  h.num_blocks = 64;
  h.registration = {1, 2, 3};
  return h;
}

TEST(HandshakeAuthTest, SignedHandshakeVerifiesAndTamperingBreaksIt) {
  const uint64_t seed = 7;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Prng prng(seed);
  HandshakeAuth auth("s3cret");
  HandshakeMsg h = Hello();
  h.nonce = NonceFrom(prng);
  h.echo = NonceFrom(prng);
  auth.Sign(HandshakeSide::kConsumerHello, &h);
  EXPECT_TRUE(HandshakeAuth::Signed(h));
  EXPECT_TRUE(auth.MacValid(HandshakeSide::kConsumerHello, h));
  // The other side's label does not verify: a reply is never a hello.
  EXPECT_FALSE(auth.MacValid(HandshakeSide::kProducerReply, h));
  // Another token does not verify.
  EXPECT_FALSE(HandshakeAuth("s3creT").MacValid(HandshakeSide::kConsumerHello, h));
  // Any field changed breaks it: identity, incarnation, role, nonces, registration.
  for (int field = 0; field < 7; ++field) {
    HandshakeMsg t = h;
    switch (field) {
      case 0: t.engine_id ^= 1; break;
      case 1: t.incarnation ^= 1; break;
      case 2: t.role = 0; break;
      case 3: t.nonce[3] ^= 1; break;
      case 4: t.echo[15] ^= 1; break;
      case 5: t.registration.push_back(0); break;
      default: t.mac[0] ^= 1; break;
    }
    EXPECT_FALSE(auth.MacValid(HandshakeSide::kConsumerHello, t)) << "field " << field;
  }
}

TEST(HandshakeAuthTest, DisabledSignsNothingAndVerifiesNothing) {
  HandshakeAuth off("");
  HandshakeMsg h = Hello();
  off.Sign(HandshakeSide::kConsumerHello, &h);
  EXPECT_FALSE(HandshakeAuth::Signed(h));
  EXPECT_FALSE(off.MacValid(HandshakeSide::kConsumerHello, h));
}

TEST(HandshakeAuthTest, MutualExchangeAndReplay) {
  const uint64_t seed = 11;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  Prng prng(seed);
  HandshakeAuth d_auth("tok"), p_auth("tok");
  ChallengeBook d_book(16, 4), p_book(16, 4);
  const std::string d_key = "9:0:4", p_key = "tcp://p:1";
  // D hello 1.
  HandshakeMsg hello = Hello();
  hello.nonce = NonceFrom(prng);
  d_book.Issue(p_key, hello.nonce);
  d_auth.Sign(HandshakeSide::kConsumerHello, &hello);
  ASSERT_TRUE(p_auth.MacValid(HandshakeSide::kConsumerHello, hello));
  EXPECT_FALSE(p_book.Redeem(d_key, hello.echo));  // zero echo: not proved yet
  // P reply.
  HandshakeMsg reply = Hello();
  reply.engine_id = 3;
  reply.role = 0;
  reply.nonce = NonceFrom(prng);
  reply.echo = hello.nonce;
  p_book.Issue(d_key, reply.nonce);
  p_auth.Sign(HandshakeSide::kProducerReply, &reply);
  ASSERT_TRUE(d_auth.MacValid(HandshakeSide::kProducerReply, reply));
  EXPECT_TRUE(d_book.Redeem(p_key, reply.echo));   // P proved
  EXPECT_FALSE(d_book.Redeem(p_key, reply.echo));  // a replayed reply proves nothing
  // D hello 2 answers P's challenge.
  HandshakeMsg hello2 = Hello();
  hello2.nonce = NonceFrom(prng);
  hello2.echo = reply.nonce;
  d_auth.Sign(HandshakeSide::kConsumerHello, &hello2);
  ASSERT_TRUE(p_auth.MacValid(HandshakeSide::kConsumerHello, hello2));
  EXPECT_TRUE(p_book.Redeem(d_key, hello2.echo));   // D proved
  EXPECT_FALSE(p_book.Redeem(d_key, hello2.echo));  // replay of hello 2
  // A challenge issued to one peer does not redeem for another.
  p_book.Issue(d_key, reply.nonce);
  EXPECT_FALSE(p_book.Redeem("other", reply.nonce));
}

TEST(HandshakeAuthTest, ChallengeBookIsBounded) {
  Prng prng(3);
  ChallengeBook book(2, 2);
  const HandshakeNonce a = NonceFrom(prng), b = NonceFrom(prng), c = NonceFrom(prng);
  book.Issue("x", a);
  book.Issue("x", b);
  book.Issue("x", c);  // a dropped (per-peer bound)
  EXPECT_FALSE(book.Redeem("x", a));
  EXPECT_TRUE(book.Redeem("x", b));
  book.Issue("y", a);
  book.Issue("z", a);  // x (least recently issued to) dropped
  EXPECT_EQ(book.peers(), 2u);
  EXPECT_FALSE(book.Redeem("x", c));
  EXPECT_TRUE(book.Redeem("y", a));
  EXPECT_TRUE(book.Redeem("z", a));
  book.Forget("z");
  EXPECT_EQ(book.peers(), 1u);
  EXPECT_FALSE(book.Redeem("y", HandshakeNonce{}));
}

}  // namespace
}  // namespace kvrelay
