// log.h — the process's log (os/): one line per event on stderr, with a
// monotonic timestamp and the component; LogOnce for things a hostile or
// broken peer can repeat (a malformed message is logged once per kind and
// counted always). Thread-safe.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <set>
#include <string>

#include "base/mutex.h"
#include "os/clock.h"

namespace kvrelay {

// The process's log lock (one line at a time on stderr) and LogOnce's keys.
struct LogState {
  Mutex mu;
  std::set<std::string> seen GUARDED_BY(mu);
};
inline LogState& TheLog() {
  static LogState* state = new LogState();  // never destroyed: threads may log at exit
  return *state;
}

__attribute__((format(printf, 2, 3))) inline void Log(const char* component, const char* fmt,
                                                       ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  MutexLock lock(&TheLog().mu);
  std::fprintf(stderr, "[%.3f] %s: %s\n", MonoNow().seconds(), component, buf);
}

// Logs `message` the first time `key` is seen in this process.
inline void LogOnce(const char* component, const std::string& key, const std::string& message) {
  {
    LogState& log = TheLog();
    MutexLock lock(&log.mu);
    if (!log.seen.insert(key).second) return;
  }
  Log(component, "%s (logged once; counted in /metrics)", message.c_str());
}

}  // namespace kvrelay
