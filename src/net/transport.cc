#include "net/transport.h"

namespace kvrelay::net {

const char* TransportName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kUcx:
      return "ucx";
  }
  return "unknown";
}

bool ParseTransport(const std::string& name, TransportKind* out) {
  for (TransportKind kind : {TransportKind::kShm, TransportKind::kTcp, TransportKind::kUcx}) {
    if (name == TransportName(kind)) {
      *out = kind;
      return true;
    }
  }
  return false;
}

Result<std::unique_ptr<Transport>> MakeTransport(TransportKind kind,
                                                 const TransportOptions& options) {
  switch (kind) {
    case TransportKind::kShm:
      return MakeShmTransport(options);
    case TransportKind::kTcp:
      return MakeTcpTransport(options);
    case TransportKind::kUcx:
      return MakeUcxTransport(options);
  }
  return InvalidArgumentError("unknown transport kind " +
                              std::to_string(static_cast<int>(kind)));
}

}  // namespace kvrelay::net
