// errno_message.h — ErrnoMessage: "what: <strerror(errno)>", the text a
// failed system call's Status carries, written once for every driver.
//
// Call it right after the failing call: it reads errno as the calling
// thread left it. Thread safety: any thread.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

namespace kvrelay {

inline std::string ErrnoMessage(std::string_view what) {
  const int err = errno;
  std::string out(what);
  out += ": ";
  out += std::strerror(err);
  return out;
}

}  // namespace kvrelay
