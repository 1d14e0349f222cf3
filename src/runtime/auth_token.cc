// auth_token.cc — see auth_token.h.
#include "runtime/auth_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvrelay::runtime {

Result<std::string> LoadAuthToken(const std::string& path) {
  const std::string what = "--auth-token-file " + path + ": ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FailedPreconditionError(what + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return FailedPreconditionError(what + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return FailedPreconditionError(what + "not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    return FailedPreconditionError(what + "is accessible by group or others (mode " + mode +
                                   "); run chmod 600 on it");
  }
  std::string token;
  char buf[1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return FailedPreconditionError(what + std::strerror(err));
    }
    if (n == 0) break;
    token.append(buf, static_cast<size_t>(n));
    if (token.size() > kMaxAuthTokenBytes + 64) break;
  }
  ::close(fd);
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' ||
                            token.back() == ' ' || token.back() == '\t')) {
    token.pop_back();
  }
  if (token.empty()) return FailedPreconditionError(what + "is empty");
  if (token.size() > kMaxAuthTokenBytes) {
    return FailedPreconditionError(what + "is longer than " +
                                   std::to_string(kMaxAuthTokenBytes) + " bytes");
  }
  return token;
}

}  // namespace kvrelay::runtime
