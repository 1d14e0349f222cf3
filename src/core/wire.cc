#include "core/wire.h"

#include <cstring>

#include "base/byte_codec.h"
#include "base/check.h"

namespace kvrelay {

namespace {

using Writer = ByteWriter;
using Reader = ByteReader;   // a read past the end sets bad() and yields zero

void PutTransfer(Writer& w, TransferId t) {
  w.U64(t.hi);
  w.U64(t.lo);
}
TransferId GetTransfer(Reader& r) {
  TransferId t;
  t.hi = r.U64();
  t.lo = r.U64();
  return t;
}

void EncodePayload(Writer& w, const HandshakeMsg& m) {
  w.U32(m.engine_id);
  w.U32(m.incarnation);
  w.U32(m.rank);
  w.U32(m.tp);
  w.U8(m.role);
  w.U8(m.transport);
  w.U32(m.layers);
  w.U32(m.kv_heads);
  w.U32(m.head_dim);
  w.U32(m.dtype_bytes);
  w.U32(m.block_tokens);
  w.U32(m.num_blocks);
  w.U32(static_cast<uint32_t>(m.registration.size()));
  w.Bytes(m.registration);
  w.Bytes(m.nonce);
  w.Bytes(m.echo);
  w.Bytes(m.mac);
}
void EncodePayload(Writer& w, const PullMsg& m) {
  w.U64(m.pull_seq);
  w.U32(m.to_incarnation);
  w.U32(static_cast<uint32_t>(m.items.size()));
  for (const PullItem& item : m.items) {
    PutTransfer(w, item.transfer);
    w.U64(item.prompt_hash);
    w.U64(static_cast<uint64_t>(item.budget_ns));
    w.U32(static_cast<uint32_t>(item.dst.size()));
    for (const BlockId& b : item.dst) {
      w.U32(b.index);
      w.U32(b.generation);
    }
  }
}
void EncodePayload(Writer& w, const AnswerMsg& m) {
  w.U64(m.pull_seq);
  PutTransfer(w, m.transfer);
  w.U8(static_cast<uint8_t>(m.result));
  w.U32(m.first_token);
}
void EncodePayload(Writer& w, const HeartbeatMsg& m) {
  w.U32(m.incarnation);
  w.U64(m.seq);
}

void EncodePayload(Writer& w, const LeaseMsg& m) {
  w.U64(m.seq);
  PutTransfer(w, m.transfer);
  w.U64(m.prompt_hash);
}
void EncodePayload(Writer& w, const GrantMsg& m) {
  w.U64(m.seq);
  PutTransfer(w, m.transfer);
  w.U8(static_cast<uint8_t>(m.answer));
  w.U8(static_cast<uint8_t>(m.result));
  w.U64(static_cast<uint64_t>(m.remaining_ns));
  w.U32(static_cast<uint32_t>(m.src.size()));
  for (const BlockId& b : m.src) {
    w.U32(b.index);
    w.U32(b.generation);
  }
}
void EncodePayload(Writer& w, const RevokeMsg& m) {
  PutTransfer(w, m.transfer);
  w.U8(static_cast<uint8_t>(m.reason));
}
void EncodePayload(Writer& w, const NoticeMsg& m) {
  PutTransfer(w, m.transfer);
  w.U8(static_cast<uint8_t>(m.notice));
}

WireType TypeOf(const WireMessage& m) {
  static_assert(std::variant_size_v<WireMessage> == 8);
  return static_cast<WireType>(m.index() + 1);  // alternatives in WireType order
}

Status Truncated(const char* what) {
  return InvalidArgumentError(std::string("truncated ") + what);
}

Result<WireMessage> DecodeHandshake(Reader& r, const WireLimits& limits) {
  HandshakeMsg m;
  m.engine_id = r.U32();
  m.incarnation = r.U32();
  m.rank = r.U32();
  m.tp = r.U32();
  m.role = r.U8();
  m.transport = r.U8();
  m.layers = r.U32();
  m.kv_heads = r.U32();
  m.head_dim = r.U32();
  m.dtype_bytes = r.U32();
  m.block_tokens = r.U32();
  m.num_blocks = r.U32();
  const uint32_t reg = r.U32();
  if (r.bad()) return Truncated("handshake");
  if (reg > limits.max_registration_bytes) {
    return Status(StatusCode::kOutOfRange,
                  "handshake registration of " + std::to_string(reg) +
                      " bytes is over the limit (max_registration_bytes " +
                      std::to_string(limits.max_registration_bytes) + ")");
  }
  if (!r.Take(reg, &m.registration)) return Truncated("handshake registration");
  if (!r.Fixed(&m.nonce) || !r.Fixed(&m.echo) || !r.Fixed(&m.mac)) {
    return Truncated("handshake authentication");
  }
  if (m.tp == 0 || m.rank >= m.tp) return InvalidArgumentError("handshake rank not below tp");
  if (m.role > 2) return InvalidArgumentError("handshake role unknown");
  if (m.transport > 2) return InvalidArgumentError("handshake transport unknown");
  return WireMessage(std::move(m));
}

Result<WireMessage> DecodePull(Reader& r, const WireLimits& limits) {
  PullMsg m;
  m.pull_seq = r.U64();
  m.to_incarnation = r.U32();
  const uint32_t count = r.U32();
  if (r.bad()) return Truncated("pull");
  if (count > limits.max_items_per_pull) {
    return Status(StatusCode::kOutOfRange,
                  "pull with " + std::to_string(count) +
                      " transfers is over the limit (max_items_per_pull " +
                      std::to_string(limits.max_items_per_pull) + ")");
  }
  // Each item takes at least 36 bytes: refuse counts the frame cannot hold
  // before reserving anything.
  if (uint64_t{count} * 36 > r.left()) return Truncated("pull items");
  m.items.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    PullItem item;
    item.transfer = GetTransfer(r);
    item.prompt_hash = r.U64();
    item.budget_ns = static_cast<int64_t>(r.U64());
    const uint32_t blocks = r.U32();
    if (r.bad()) return Truncated("pull item");
    if (item.budget_ns < 0) return InvalidArgumentError("pull item with a negative budget");
    if (blocks > limits.max_blocks_per_item) {
      return Status(StatusCode::kOutOfRange,
                    "pull item with " + std::to_string(blocks) +
                      " blocks is over the limit (max_blocks_per_item " +
                      std::to_string(limits.max_blocks_per_item) + ")");
    }
    if (uint64_t{blocks} * 8 > r.left()) return Truncated("pull item blocks");
    item.dst.reserve(blocks);
    for (uint32_t b = 0; b < blocks; ++b) {
      BlockId id;
      id.index = r.U32();
      id.generation = r.U32();
      item.dst.push_back(id);
    }
    m.items.push_back(std::move(item));
  }
  if (r.bad()) return Truncated("pull");
  return WireMessage(std::move(m));
}

Result<WireMessage> DecodeAnswer(Reader& r) {
  AnswerMsg m;
  m.pull_seq = r.U64();
  m.transfer = GetTransfer(r);
  const uint8_t result = r.U8();
  m.first_token = r.U32();
  if (r.bad()) return Truncated("answer");
  if (result >= kTransferResultCount) {
    return InvalidArgumentError("answer result " + std::to_string(result) + " unknown");
  }
  m.result = static_cast<TransferResult>(result);
  if (m.result != TransferResult::kOk && m.first_token != kNoFirstToken) {
    return InvalidArgumentError("answer: a first token on a " +
                                std::string(TransferResultName(m.result)) + " answer");
  }
  return WireMessage(m);
}

Result<WireMessage> DecodeLease(Reader& r) {
  LeaseMsg m;
  m.seq = r.U64();
  m.transfer = GetTransfer(r);
  m.prompt_hash = r.U64();
  if (r.bad()) return Truncated("lease heartbeat");
  return WireMessage(m);
}

Result<WireMessage> DecodeGrant(Reader& r, const WireLimits& limits) {
  GrantMsg m;
  m.seq = r.U64();
  m.transfer = GetTransfer(r);
  const uint8_t answer = r.U8();
  const uint8_t result = r.U8();
  m.remaining_ns = static_cast<int64_t>(r.U64());
  const uint32_t blocks = r.U32();
  if (r.bad()) return Truncated("grant");
  if (answer > static_cast<uint8_t>(LeaseAnswer::kEnded)) {
    return InvalidArgumentError("grant answer " + std::to_string(answer) + " unknown");
  }
  if (result >= kTransferResultCount) {
    return InvalidArgumentError("grant result " + std::to_string(result) + " unknown");
  }
  if (m.remaining_ns < 0) return InvalidArgumentError("grant with a negative lease");
  if (blocks > limits.max_blocks_per_item) {
    return Status(StatusCode::kOutOfRange,
                  "grant with " + std::to_string(blocks) +
                      " blocks is over the limit (max_blocks_per_item " +
                      std::to_string(limits.max_blocks_per_item) + ")");
  }
  if (uint64_t{blocks} * 8 > r.left()) return Truncated("grant blocks");
  m.answer = static_cast<LeaseAnswer>(answer);
  m.result = static_cast<TransferResult>(result);
  m.src.reserve(blocks);
  for (uint32_t b = 0; b < blocks; ++b) {
    BlockId id;
    id.index = r.U32();
    id.generation = r.U32();
    m.src.push_back(id);
  }
  return WireMessage(std::move(m));
}

Result<WireMessage> DecodeNotice(Reader& r) {
  NoticeMsg m;
  m.transfer = GetTransfer(r);
  const uint8_t notice = r.U8();
  if (r.bad()) return Truncated("notice");
  if (notice > static_cast<uint8_t>(ReadNotice::kRevoked)) {
    return InvalidArgumentError("notice " + std::to_string(notice) + " unknown");
  }
  m.notice = static_cast<ReadNotice>(notice);
  return WireMessage(m);
}

}  // namespace

std::string_view WireLimitName(WireLimit limit) {
  switch (limit) {
    case WireLimit::kFrameBytes: return "wire_frame_bytes";
    case WireLimit::kItemsPerPull: return "wire_items_per_pull";
    case WireLimit::kBlocksPerItem: return "wire_blocks_per_item";
    case WireLimit::kRegistrationBytes: return "wire_registration_bytes";
  }
  return "wire_unknown";
}

std::optional<WireLimit> WireLimitOf(const Status& status) {
  if (status.code() != StatusCode::kOutOfRange) return std::nullopt;
  const std::string& m = status.message();
  if (m.find("(max_frame_bytes ") != std::string::npos) return WireLimit::kFrameBytes;
  if (m.find("(max_items_per_pull ") != std::string::npos) return WireLimit::kItemsPerPull;
  if (m.find("(max_blocks_per_item ") != std::string::npos) return WireLimit::kBlocksPerItem;
  if (m.find("(max_registration_bytes ") != std::string::npos) {
    return WireLimit::kRegistrationBytes;
  }
  return std::nullopt;
}

std::vector<uint8_t> EncodeWire(const WireMessage& msg) {
  std::vector<uint8_t> out;
  Writer w(&out);
  w.U32(kWireMagic);
  w.U16(kWireVersion);
  w.U16(static_cast<uint16_t>(TypeOf(msg)));
  w.U32(0);  // payload length, patched below
  std::visit([&w](const auto& m) { EncodePayload(w, m); }, msg);
  const uint32_t payload = static_cast<uint32_t>(out.size() - kWireHeaderBytes);
  std::memcpy(out.data() + 8, &payload, 4);
  return out;
}

Result<WireMessage> DecodeWire(std::span<const uint8_t> frame, const WireLimits& limits) {
  if (frame.size() > limits.max_frame_bytes) {
    return Status(StatusCode::kOutOfRange,
                  "frame of " + std::to_string(frame.size()) +
                      " bytes is over the limit (max_frame_bytes " +
                      std::to_string(limits.max_frame_bytes) + ")");
  }
  Reader r(frame);
  const uint32_t magic = r.U32();
  const uint16_t version = r.U16();
  const uint16_t type = r.U16();
  const uint32_t payload = r.U32();
  if (r.bad()) return Truncated("header");
  if (magic != kWireMagic) return InvalidArgumentError("not a kvrelay frame (bad magic)");
  if (version != kWireVersion) {
    return FailedPreconditionError("wire version " + std::to_string(version) +
                                   ", this build speaks " + std::to_string(kWireVersion));
  }
  if (payload != r.left()) {
    return InvalidArgumentError("payload length " + std::to_string(payload) +
                                " does not match the frame's " + std::to_string(r.left()));
  }
  Result<WireMessage> m = InvalidArgumentError("unknown message type " + std::to_string(type));
  switch (static_cast<WireType>(type)) {
    case WireType::kHandshake: m = DecodeHandshake(r, limits); break;
    case WireType::kPull: m = DecodePull(r, limits); break;
    case WireType::kAnswer: m = DecodeAnswer(r); break;
    case WireType::kHeartbeat: {
      HeartbeatMsg h;
      h.incarnation = r.U32();
      h.seq = r.U64();
      m = r.bad() ? Result<WireMessage>(Truncated("heartbeat")) : Result<WireMessage>(h);
      break;
    }
    case WireType::kLease: m = DecodeLease(r); break;
    case WireType::kGrant: m = DecodeGrant(r, limits); break;
    case WireType::kRevoke: {
      RevokeMsg v;
      v.transfer = GetTransfer(r);
      const uint8_t reason = r.U8();
      if (r.bad()) {
        m = Truncated("revoke");
      } else if (reason >= kTransferResultCount ||
                 reason == static_cast<uint8_t>(TransferResult::kOk)) {
        m = InvalidArgumentError("revoke reason " + std::to_string(reason) + " unknown");
      } else {
        v.reason = static_cast<TransferResult>(reason);
        m = Result<WireMessage>(v);
      }
      break;
    }
    case WireType::kNotice: m = DecodeNotice(r); break;
  }
  if (m.ok() && r.left() != 0) {
    return InvalidArgumentError(std::to_string(r.left()) + " trailing bytes after the message");
  }
  return m;
}

}  // namespace kvrelay
