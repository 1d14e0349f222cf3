// registration_codec.cc — dispatch to each transport's registration codec
// (see registration_codec.h); tcp's codec is declared in tcp_stream.h.
#include "net/registration_codec.h"

#include "net/tcp_stream.h"

namespace kvrelay::net {

Result<std::vector<uint8_t>> ReencodeTcpRegistration(std::span<const uint8_t> bytes) {
  Result<tcp::TcpRegistration> r = tcp::DecodeRegistration(bytes);
  if (!r.ok()) return r.status();
  return tcp::EncodeRegistration(*r);
}

Result<std::vector<uint8_t>> ReencodeRegistration(TransportKind kind,
                                                  std::span<const uint8_t> bytes) {
  switch (kind) {
    case TransportKind::kShm: return ReencodeShmRegistration(bytes);
    case TransportKind::kTcp: return ReencodeTcpRegistration(bytes);
    case TransportKind::kUcx: return ReencodeUcxRegistration(bytes);
  }
  return InvalidArgumentError("unknown transport kind");
}

}  // namespace kvrelay::net
