// wire.h — the control channel's binary format: encode and decode, pure.
//
// Why here, in the pure core: every byte a peer sends is hostile until
// decoded, and a decoder is exactly the kind of code that crashes a process
// or corrupts a table on a malformed frame. Keeping it pure (bytes in, a
// value or a Status out) makes it testable exhaustively and fuzzable, and
// lets the simulator and the runtime share it. docs/wire.md is the spec.
//
// Frame (little-endian):
//   u32 magic 'KVRL' | u16 version | u16 type | u32 payload_bytes | payload
// Types: 1 handshake, 2 pull, 3 answer, 4 heartbeat. Version 2 added the
// handshake's nonce, echo and mac (64 bytes); version 3 the answer's first
// token (core/first_token.h); version 4 the result kReset and a revoke's
// reason; version 5 the pull's to_incarnation. A decoder accepts only
// its own version; every count and length is checked against WireLimits
// before anything is read or allocated; trailing bytes are an error.
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.h"
#include "core/messages.h"

namespace kvrelay {

inline constexpr uint32_t kWireMagic = 0x4C52564B;  // "KVRL" in memory order
inline constexpr uint16_t kWireVersion = 5;  // 2: handshake auth; 3: answer's first token;
                                             // 4: result kReset, the revoke's reason;
                                             // 5: the pull's to_incarnation
inline constexpr size_t kWireHeaderBytes = 12;

enum class WireType : uint16_t {
  kHandshake = 1, kPull = 2, kAnswer = 3, kHeartbeat = 4,
  // read mode (core/lease_table.h)
  kLease = 5, kGrant = 6, kRevoke = 7, kNotice = 8,
};

// First message on a connection: who the sender is and how its KV is laid
// out, so the receiver can validate every later pull against it.
struct HandshakeMsg {
  uint32_t engine_id = 0;
  uint32_t incarnation = 0;
  uint32_t rank = 0;
  uint32_t tp = 1;
  uint8_t role = 0;        // ConnectorRole
  uint8_t transport = 0;   // 0 shm, 1 tcp, 2 ucx
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 0;
  uint32_t block_tokens = 0;
  uint32_t num_blocks = 0;
  std::vector<uint8_t> registration;  // transport data: segment name, rkey, ...
  // Authentication (core/handshake_auth.h), all zeros when the sender has
  // no token: a fresh nonce of the sender's, the peer's nonce this message
  // answers, and HMAC-SHA256(token, the message with `mac` zeroed).
  std::array<uint8_t, 16> nonce{};
  std::array<uint8_t, 16> echo{};
  std::array<uint8_t, 32> mac{};
  bool operator==(const HandshakeMsg&) const = default;
};

struct HeartbeatMsg {
  uint32_t incarnation = 0;
  uint64_t seq = 0;
  bool operator==(const HeartbeatMsg&) const = default;
};

// The order of the alternatives is the order of WireType (TypeOf).
using WireMessage = std::variant<HandshakeMsg, PullMsg, AnswerMsg, HeartbeatMsg, LeaseMsg,
                                 GrantMsg, RevokeMsg, NoticeMsg>;

struct WireLimits {
  uint32_t max_frame_bytes = 16u << 20;
  uint32_t max_items_per_pull = 4096;
  uint32_t max_blocks_per_item = 1u << 16;
  uint32_t max_registration_bytes = 4096;
};

// The WireLimits a frame can be over, for counting refusals
// (kvrelay_limit_rejections_total{limit=WireLimitName(...)}).
enum class WireLimit : uint8_t { kFrameBytes, kItemsPerPull, kBlocksPerItem, kRegistrationBytes };
inline constexpr int kWireLimitCount = 4;
// "wire_frame_bytes", "wire_items_per_pull", "wire_blocks_per_item",
// "wire_registration_bytes".
std::string_view WireLimitName(WireLimit limit);
// Which limit a DecodeWire error is over (its kOutOfRange message names the
// WireLimits field); nullopt for any other error.
std::optional<WireLimit> WireLimitOf(const Status& status);

// A whole frame (header + payload) for `msg`.
std::vector<uint8_t> EncodeWire(const WireMessage& msg);

// Decodes exactly one frame. Errors (kInvalidArgument, kOutOfRange for a
// limit, kFailedPrecondition for another version) say what is wrong;
// nothing is ever read past `frame`.
Result<WireMessage> DecodeWire(std::span<const uint8_t> frame, const WireLimits& limits);

}  // namespace kvrelay
