// os_random.cc — getrandom(2), retried on EINTR and short reads.
#include "os/os_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "base/check.h"

namespace kvrelay {

Status FillFromOs(std::span<uint8_t> out) {
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::getrandom(out.data() + got, out.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return InternalError(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

std::array<uint8_t, 16> NonceFromOs() {
  std::array<uint8_t, 16> n{};
  const Status s = FillFromOs(n);
  KV_CHECK_MSG(s.ok(), s.ToString().c_str());
  return n;
}

}  // namespace kvrelay
