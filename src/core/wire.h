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
// Types: 1 handshake, 2 pull, 3 answer, 4 heartbeat. A decoder accepts only
// its own version; every count and length is checked against WireLimits
// before anything is read or allocated; trailing bytes are an error.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "base/result.h"
#include "core/messages.h"

namespace kvrelay {

inline constexpr uint32_t kWireMagic = 0x4C52564B;  // "KVRL" in memory order
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kWireHeaderBytes = 12;

enum class WireType : uint16_t { kHandshake = 1, kPull = 2, kAnswer = 3, kHeartbeat = 4 };

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
  bool operator==(const HandshakeMsg&) const = default;
};

struct HeartbeatMsg {
  uint32_t incarnation = 0;
  uint64_t seq = 0;
  bool operator==(const HeartbeatMsg&) const = default;
};

using WireMessage = std::variant<HandshakeMsg, PullMsg, AnswerMsg, HeartbeatMsg>;

struct WireLimits {
  uint32_t max_frame_bytes = 16u << 20;
  uint32_t max_items_per_pull = 4096;
  uint32_t max_blocks_per_item = 1u << 16;
  uint32_t max_registration_bytes = 4096;
};

// A whole frame (header + payload) for `msg`.
std::vector<uint8_t> EncodeWire(const WireMessage& msg);

// Decodes exactly one frame. Errors (kInvalidArgument, kOutOfRange for a
// limit, kFailedPrecondition for another version) say what is wrong;
// nothing is ever read past `frame`.
Result<WireMessage> DecodeWire(std::span<const uint8_t> frame, const WireLimits& limits);

}  // namespace kvrelay
