#include "router/transfer_id_source.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace kvrelay::router {

Result<TransferId> NewTransferIdFromOs() {
  for (int attempt = 0; attempt < 4; ++attempt) {
    unsigned char buf[16];
    size_t got = 0;
    while (got < sizeof buf) {
      const ssize_t n = ::getrandom(buf + got, sizeof buf - got, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return InternalError(std::string("getrandom: ") + std::strerror(errno));
      }
      got += static_cast<size_t>(n);
    }
    TransferId t;
    for (int i = 0; i < 8; ++i) {
      t.hi = (t.hi << 8) | buf[i];
      t.lo = (t.lo << 8) | buf[8 + i];
    }
    if (!t.IsZero()) return t;
  }
  return InternalError("getrandom returned zeros four times in a row");
}

}  // namespace kvrelay::router
