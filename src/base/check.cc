#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace kvrelay {

void CheckFailed(const char* file, int line, const char* expr,
                 const char* msg) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s%s%s%s\n", file, line, expr,
               msg[0] ? " (" : "", msg, msg[0] ? ")" : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace kvrelay
