#include "os/thread_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

namespace kvrelay {

namespace {
id_t ThisTid() { return static_cast<id_t>(::syscall(SYS_gettid)); }

// The kernel's struct sched_attr (glibc 2.36 declares no wrapper for it).
struct SchedAttr {
  uint32_t size = sizeof(SchedAttr);
  uint32_t sched_policy = 0;
  uint64_t sched_flags = 0;
  int32_t sched_nice = 0;
  uint32_t sched_priority = 0;
  uint64_t sched_runtime = 0;
  uint64_t sched_deadline = 0;
  uint64_t sched_period = 0;
  uint32_t sched_util_min = 0;
  uint32_t sched_util_max = 0;
};

bool GetAttr(SchedAttr* attr) {
  return ::syscall(SYS_sched_getattr, 0, attr, sizeof(SchedAttr), 0) == 0;
}
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

Status SetThisThreadSliceUs(int slice_us) {
  if (slice_us != 0 && (slice_us < 100 || slice_us > 100000)) {
    return InvalidArgumentError("slice " + std::to_string(slice_us) +
                                " µs is outside 100..100000 (0: the default)");
  }
  SchedAttr attr;
  if (!GetAttr(&attr)) return InternalError(std::string("sched_getattr: ") + std::strerror(errno));
  if (attr.sched_policy != SCHED_OTHER) {
    return FailedPreconditionError("the thread is not SCHED_OTHER (policy " +
                                   std::to_string(attr.sched_policy) + ")");
  }
  const uint64_t want_ns = static_cast<uint64_t>(slice_us) * 1000;
  attr.size = sizeof attr;
  attr.sched_flags = 0;
  attr.sched_runtime = want_ns;  // the nice value read above is written back unchanged
  if (::syscall(SYS_sched_setattr, 0, &attr, 0) != 0) {
    const int err = errno;
    return InternalError(std::string("sched_setattr: ") + std::strerror(err));
  }
  if (slice_us != 0 && ThisThreadSliceUs() != slice_us) {
    return FailedPreconditionError("this kernel keeps no per-thread slice (Linux 6.12 or later "
                                   "does)");
  }
  return Status::Ok();
}

int ThisThreadSliceUs() {
  SchedAttr attr;
  if (!GetAttr(&attr) || attr.sched_policy != SCHED_OTHER) return 0;
  return static_cast<int>(attr.sched_runtime / 1000);
}

}  // namespace kvrelay
