#include "runtime/thread_priority.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

namespace kvrelay::runtime {

namespace {
id_t ThisTid() { return static_cast<id_t>(::syscall(SYS_gettid)); }
}  // namespace

void NameThisThread(std::string_view name) {
  const std::string cut(name.substr(0, 15));
  (void)pthread_setname_np(pthread_self(), cut.c_str());
}

Status SetThisThreadNice(int nice) {
  if (nice < -20 || nice > 19) {
    return InvalidArgumentError("nice value " + std::to_string(nice) + " is outside -20..19");
  }
  if (::setpriority(PRIO_PROCESS, ThisTid(), nice) != 0) {
    const int err = errno;
    const std::string why = "setpriority(" + std::to_string(nice) + "): " + std::strerror(err);
    if (err == EPERM || err == EACCES) return FailedPreconditionError(why);
    return InternalError(why);
  }
  return Status::Ok();
}

int ThisThreadNice() {
  errno = 0;
  return ::getpriority(PRIO_PROCESS, ThisTid());
}

bool CanSetNice(int nice) {
  bool ok = false;
  std::thread probe([&] { ok = SetThisThreadNice(nice).ok(); });
  probe.join();
  return ok;
}

}  // namespace kvrelay::runtime
