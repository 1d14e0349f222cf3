// child_process.h — ChildProcess: a kvrelay process started by another
// (`demo`, `matrix`), its output in a log file, stopped on destruction.
//
// Thread safety: one owner thread.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kvrelay::cli {

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() { Stop(std::chrono::seconds(10)); }

  // Starts `argv` (argv[0] is the program path) with stdout and stderr
  // appended to `log_path`. False (with errno) if it could not start.
  bool Start(const std::vector<std::string>& argv, const std::string& log_path) {
    log_path_ = log_path;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = posix_spawn(&pid_, argv[0].c_str(), &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid_ = -1;
      return false;
    }
    return true;
  }
  bool Running() {
    if (pid_ <= 0) return false;
    int st;
    const pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = st;
      pid_ = -1;
      return false;
    }
    return true;
  }
  // SIGTERM, then SIGKILL after `grace`. Returns a description of the exit.
  std::string Stop(std::chrono::milliseconds grace) {
    if (pid_ <= 0) return Describe();
    kill(pid_, SIGTERM);
    const auto until = std::chrono::steady_clock::now() + grace;
    while (std::chrono::steady_clock::now() < until) {
      if (!Running()) return Describe();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    int st;
    waitpid(pid_, &st, 0);
    status_ = st;
    pid_ = -1;
    return "did not stop within the grace period; killed";
  }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st;
      waitpid(pid_, &st, 0);
      status_ = st;
      pid_ = -1;
    }
  }
  std::string Describe() const {
    if (pid_ > 0) return "running";
    if (WIFEXITED(status_)) return "exited " + std::to_string(WEXITSTATUS(status_));
    if (WIFSIGNALED(status_)) return "killed by signal " + std::to_string(WTERMSIG(status_));
    return "unknown";
  }
  bool ExitedCleanly() const { return pid_ <= 0 && WIFEXITED(status_) && WEXITSTATUS(status_) == 0; }
  // The last `lines` lines of the log.
  std::string Tail(size_t lines) const {
    std::ifstream in(log_path_);
    std::vector<std::string> all;
    for (std::string l; std::getline(in, l);) all.push_back(l);
    std::string out;
    for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
      out += "    " + all[i] + "\n";
    }
    return out;
  }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  std::string log_path_;
};

}  // namespace kvrelay::cli
