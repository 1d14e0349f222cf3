// proc_sample.cc — ProcSample from /proc/<pid>/status and /proc/<pid>/fd.
#include "cli/proc_sample.h"

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace kvrelay::cli {

ProcSample SampleProc(pid_t pid) {
  ProcSample s;
  const std::string dir = "/proc/" + std::to_string(pid);
  std::ifstream f(dir + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mib = std::atof(line.c_str() + 6) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) s.threads = std::atoi(line.c_str() + 8);
  }
  if (DIR* d = opendir((dir + "/fd").c_str()); d != nullptr) {
    s.fds = 0;
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++s.fds;
    }
    closedir(d);
  }
  return s;
}

}  // namespace kvrelay::cli
