// handshake_auth.h — HandshakeAuth and ChallengeBook: the control channel's
// challenge-response over the shared secret (`--auth-token-file`), pure.
//
// Why: a P rank must not write KV for, nor answer pulls from, a process
// that merely knows its address; a D rank must not take answers from a
// process posing as its producer. Both sides prove the token without
// sending it: every Handshake carries a fresh `nonce` of its sender, the
// `echo` of the peer's latest nonce, and mac = HMAC-SHA256(token, label ||
// side || the encoded handshake with `mac` zeroed) — which binds the
// identities (engine id, incarnation, rank, role), the layout, the
// registration and both nonces. A peer is proved by a handshake whose MAC
// checks and whose `echo` redeems a challenge this side issued and has not
// seen redeemed (single use: a replayed handshake redeems nothing).
//
//   D → P  hello(nonce=nD1, echo=0)            P: MAC ok, nothing redeemed
//   P → D  reply(nonce=nP1, echo=nD1)          D: MAC ok, redeems nD1: P proved
//   D → P  hello(nonce=nD2, echo=nP1)          P: redeems nP1: D proved
//   ...every heartbeat repeats the last two lines with fresh nonces.
//
// The side label keeps a P reply from ever counting as a D hello (and the
// reverse). Frames after the handshake are not MACed: they are trusted by
// their ZeroMQ connection (see docs/wire.md, "Authentication").
//
// Ownership and threading: owned by one RankActor, called from its thread;
// no I/O, no clock — nonces come from the caller (getrandom in the runtime).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>

#include "base/sha256.h"
#include "core/wire.h"

namespace kvrelay {

using HandshakeNonce = std::array<uint8_t, 16>;

// Who sent a handshake: D's hello (also its heartbeat) or P's reply.
enum class HandshakeSide : uint8_t { kConsumerHello = 1, kProducerReply = 2 };

class HandshakeAuth {
 public:
  // An empty token disables authentication: Sign() leaves the MAC zero.
  explicit HandshakeAuth(std::string token) : token_(std::move(token)) {}
  bool enabled() const { return !token_.empty(); }

  // Sets hs->mac over everything else in *hs (nonce and echo included).
  void Sign(HandshakeSide side, HandshakeMsg* hs) const;
  // True iff enabled and hs.mac is the MAC Sign() would set. Constant time
  // in the MAC's bytes.
  bool MacValid(HandshakeSide side, const HandshakeMsg& hs) const;
  // The sender signed it (a token-less sender leaves the MAC all zeros).
  static bool Signed(const HandshakeMsg& hs);
  static bool IsZero(const HandshakeNonce& n);

 private:
  Sha256Digest Mac(HandshakeSide side, const HandshakeMsg& hs) const;
  const std::string token_;
};

// Outstanding single-use challenges, per peer key (a ZeroMQ identity on P,
// a producer rank's endpoint on D). Bounded: at most `max_per_peer` nonces
// per peer (oldest dropped) and `max_peers` peers (the least recently
// issued-to peer dropped), so unauthenticated peers cannot grow it.
class ChallengeBook {
 public:
  ChallengeBook(size_t max_peers, size_t max_per_peer);

  void Issue(const std::string& peer, const HandshakeNonce& nonce);
  // True exactly once per issued nonce of `peer`; a zero nonce never redeems.
  bool Redeem(const std::string& peer, const HandshakeNonce& nonce);
  void Forget(const std::string& peer);
  size_t peers() const { return book_.size(); }

 private:
  struct Entry {
    std::deque<HandshakeNonce> nonces;
    uint64_t seq = 0;  // last Issue, for least-recent eviction
  };
  const size_t max_peers_, max_per_peer_;
  uint64_t next_seq_ = 0;
  std::unordered_map<std::string, Entry> book_;
  std::map<uint64_t, std::string> by_seq_;
};

}  // namespace kvrelay
