// proc_sample.h — ProcSample: what one process holds now — resident memory,
// threads, open files — read from /proc: the resources a leak grows.
//
// Used by the tools that watch the processes they start (bench http, demo
// --rounds). Threading: any thread. A process that is gone, or a field
// /proc does not give, reads as -1.
#pragma once

#include <sys/types.h>

namespace kvrelay::cli {

struct ProcSample {
  double rss_mib = -1;   // VmRSS
  int threads = -1;      // Threads
  int fds = -1;          // entries of /proc/<pid>/fd
};

ProcSample SampleProc(pid_t pid);

}  // namespace kvrelay::cli
