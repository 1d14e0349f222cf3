#include "os/errno_message.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kvrelay {
namespace {

TEST(ErrnoMessageTest, NamesTheCallThenTheSystemsTextForErrno) {
  errno = ENOENT;
  EXPECT_EQ(ErrnoMessage("shm_open /kvrelay-x"),
            std::string("shm_open /kvrelay-x: ") + std::strerror(ENOENT));
  const std::string what = "connect 127.0.0.1:" + std::to_string(9);
  errno = ECONNREFUSED;
  EXPECT_EQ(ErrnoMessage(what), what + ": " + std::strerror(ECONNREFUSED));
}

}  // namespace
}  // namespace kvrelay
