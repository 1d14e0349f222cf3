// chaos_cleanup.cc — see chaos_cleanup.h.
#include "cli/chaos_cleanup.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <thread>

#include "base/mutex.h"

namespace kvrelay::cli {
namespace {

// Guards the two sets below: the runner registers and unregisters from its
// threads, the signal thread walks them.
Mutex g_mu;
std::set<std::string>& Tables() REQUIRES(g_mu) {
  static auto* t = new std::set<std::string>;
  return *t;
}
std::set<pid_t>& Pids() REQUIRES(g_mu) {
  static auto* p = new std::set<pid_t>;
  return *p;
}

}  // namespace

int RunCommand(const std::string& command_line, std::string* out) {
  FILE* f = popen((command_line + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[512];
  std::string text;
  while (size_t n = fread(buf, 1, sizeof buf, f)) text.append(buf, n);
  const int st = pclose(f);
  if (out != nullptr) *out = text;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int DeleteNftTable(const std::string& table) {
  return RunCommand("nft delete table " + table, nullptr);
}

void RegisterNftTable(const std::string& table) {
  MutexLock lock(&g_mu);
  Tables().insert(table);
}
void UnregisterNftTable(const std::string& table) {
  MutexLock lock(&g_mu);
  Tables().erase(table);
}
void RegisterChildPid(pid_t pid) {
  MutexLock lock(&g_mu);
  Pids().insert(pid);
}
void UnregisterChildPid(pid_t pid) {
  MutexLock lock(&g_mu);
  Pids().erase(pid);
}

void InstallChaosSignalCleanup() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "\nkvrelay chaos: signal %d: removing partitions, killing children\n",
                 sig);
    MutexLock lock(&g_mu);
    for (const std::string& t : Tables()) DeleteNftTable(t);
    for (pid_t p : Pids()) {
      kill(p, SIGCONT);
      kill(p, SIGKILL);
    }
    _exit(130);
  }).detach();
}

}  // namespace kvrelay::cli
