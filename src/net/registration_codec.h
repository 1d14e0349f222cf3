// registration_codec.h — the transports' registration decoders, reachable
// without creating a transport: decode a registration with exactly the
// checks Open() makes before it touches the system, and re-encode what was
// decoded.
//
// Why: a registration arrives inside a peer's handshake, so its decoder
// parses hostile bytes; the fuzzer (fuzz/registration_fuzz.cc) drives it
// directly and checks the round trip (a registration that decodes
// re-encodes to exactly its bytes), which finds logic bugs, not only
// crashes. The codecs themselves stay private to each transport's file.
//
// Thread safety: pure functions; any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/result.h"
#include "net/transport.h"

namespace kvrelay::net {

// The canonical encoding of the registration `bytes` decode to, or the
// decoder's error (kInvalidArgument, as Open() returns it).
Result<std::vector<uint8_t>> ReencodeRegistration(TransportKind kind,
                                                  std::span<const uint8_t> bytes);

// One per transport, defined beside each codec (shm_transport.cc,
// tcp_stream.h via registration_codec.cc, ucx_transport.cc).
Result<std::vector<uint8_t>> ReencodeShmRegistration(std::span<const uint8_t> bytes);
Result<std::vector<uint8_t>> ReencodeTcpRegistration(std::span<const uint8_t> bytes);
Result<std::vector<uint8_t>> ReencodeUcxRegistration(std::span<const uint8_t> bytes);

}  // namespace kvrelay::net
