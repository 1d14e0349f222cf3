// handshake_auth.cc — see handshake_auth.h for the protocol.
#include "core/handshake_auth.h"

#include <algorithm>

#include "base/check.h"
#include "base/hmac.h"

namespace kvrelay {

namespace {
constexpr std::string_view kLabel = "kvrelay-handshake-v2";
}  // namespace

Sha256Digest HandshakeAuth::Mac(HandshakeSide side, const HandshakeMsg& hs) const {
  HandshakeMsg unsigned_hs = hs;
  unsigned_hs.mac.fill(0);
  const std::vector<uint8_t> bytes = EncodeWire(unsigned_hs);
  HmacSha256 h(token_);
  h.Update(kLabel);
  const uint8_t s = static_cast<uint8_t>(side);
  h.Update(std::span<const uint8_t>(&s, 1));
  h.Update(bytes);
  return h.Final();
}

void HandshakeAuth::Sign(HandshakeSide side, HandshakeMsg* hs) const {
  hs->mac.fill(0);
  if (!enabled()) return;
  hs->mac = Mac(side, *hs);
}

bool HandshakeAuth::MacValid(HandshakeSide side, const HandshakeMsg& hs) const {
  if (!enabled()) return false;
  const Sha256Digest want = Mac(side, hs);
  return ConstantTimeEqual(want, hs.mac);
}

bool HandshakeAuth::Signed(const HandshakeMsg& hs) {
  return std::any_of(hs.mac.begin(), hs.mac.end(), [](uint8_t b) { return b != 0; });
}

bool HandshakeAuth::IsZero(const HandshakeNonce& n) {
  return std::all_of(n.begin(), n.end(), [](uint8_t b) { return b == 0; });
}

ChallengeBook::ChallengeBook(size_t max_peers, size_t max_per_peer)
    : max_peers_(max_peers), max_per_peer_(max_per_peer) {
  KV_CHECK_GT(max_peers_, 0u);
  KV_CHECK_GT(max_per_peer_, 0u);
}

void ChallengeBook::Issue(const std::string& peer, const HandshakeNonce& nonce) {
  auto it = book_.find(peer);
  if (it == book_.end()) {
    if (book_.size() >= max_peers_) {
      auto oldest = by_seq_.begin();
      book_.erase(oldest->second);
      by_seq_.erase(oldest);
    }
    it = book_.emplace(peer, Entry{}).first;
  } else {
    by_seq_.erase(it->second.seq);
  }
  Entry& e = it->second;
  e.seq = next_seq_++;
  by_seq_.emplace(e.seq, peer);
  e.nonces.push_back(nonce);
  while (e.nonces.size() > max_per_peer_) e.nonces.pop_front();
}

bool ChallengeBook::Redeem(const std::string& peer, const HandshakeNonce& nonce) {
  if (HandshakeAuth::IsZero(nonce)) return false;
  auto it = book_.find(peer);
  if (it == book_.end()) return false;
  auto& ns = it->second.nonces;
  auto n = std::find(ns.begin(), ns.end(), nonce);
  if (n == ns.end()) return false;
  ns.erase(n);
  return true;
}

void ChallengeBook::Forget(const std::string& peer) {
  auto it = book_.find(peer);
  if (it == book_.end()) return;
  by_seq_.erase(it->second.seq);
  book_.erase(it);
}

}  // namespace kvrelay
