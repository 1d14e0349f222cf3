// check.h — always-on assertions for programmer errors.
//
// Why: kvrelay separates *operating* errors (a peer vanished, a deadline
// passed, bad input) from *bugs* (a block freed twice, a state transition the
// machine does not allow). Operating errors travel as Status/Result values.
// Bugs stop the process at once, in release builds too, because continuing
// with a corrupted block table hands one request's KV to another.
//
// Thread safety: the macros may be used from any thread.
#pragma once

namespace kvrelay {

// Prints "file:line: CHECK failed: expr (msg)" to stderr and aborts.
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr,
                              const char* msg);

}  // namespace kvrelay

#define KV_CHECK(cond)                                                \
  do {                                                                \
    if (!(cond)) [[unlikely]]                                         \
      ::kvrelay::CheckFailed(__FILE__, __LINE__, #cond, "");          \
  } while (0)

#define KV_CHECK_MSG(cond, msg)                                       \
  do {                                                                \
    if (!(cond)) [[unlikely]]                                         \
      ::kvrelay::CheckFailed(__FILE__, __LINE__, #cond, (msg));       \
  } while (0)

#define KV_CHECK_EQ(a, b) KV_CHECK((a) == (b))
#define KV_CHECK_NE(a, b) KV_CHECK((a) != (b))
#define KV_CHECK_LT(a, b) KV_CHECK((a) < (b))
#define KV_CHECK_LE(a, b) KV_CHECK((a) <= (b))
#define KV_CHECK_GT(a, b) KV_CHECK((a) > (b))
#define KV_CHECK_GE(a, b) KV_CHECK((a) >= (b))
