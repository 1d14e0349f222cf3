// control_nice_test.cc — `kvrelay serve --control-nice`: the control path's
// threads (engine loop, rank actors, ZeroMQ's I/O and reaper threads) run
// at the value given, bulk threads (writers, HTTP) keep the default; a
// value outside -20..0 is refused at start. `--control-slice-us`: the HTTP
// workers, rank actors and ZeroMQ's threads ask for the EEVDF slice given
// (100 µs by default), the engine loop and writers keep the kernel's.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "os/thread_priority.h"
#include "proc/harness.h"

namespace kvrelay::proctest {
namespace {

// Thread name → the nice values of the threads of `pid` with that name.
std::map<std::string, std::vector<int>> NiceByThreadName(pid_t pid) {
  std::map<std::string, std::vector<int>> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(dir)) {
    std::string name, stat;
    std::getline(std::ifstream(task.path() / "comm"), name);
    std::getline(std::ifstream(task.path() / "stat"), stat);
    // Fields after the name's closing parenthesis start at field 3; the
    // nice value is field 19.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 19 && rest >> field; ++i) {
    }
    out[name].push_back(std::stoi(field));
  }
  return out;
}

// Thread name → the EEVDF slices (µs) of the threads of `pid` with that
// name, from /proc/<pid>/task/<tid>/sched; with the main thread's under
// "(main)". Empty when the kernel shows none.
std::map<std::string, std::vector<int>> SliceByThreadName(pid_t pid) {
  std::map<std::string, std::vector<int>> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(dir)) {
    std::string name, line;
    std::getline(std::ifstream(task.path() / "comm"), name);
    if (task.path().filename() == std::to_string(pid)) name = "(main)";
    std::ifstream sched(task.path() / "sched");
    while (std::getline(sched, line)) {
      if (line.rfind("se.slice", 0) != 0) continue;
      out[name].push_back(static_cast<int>(std::stoll(line.substr(line.find(':') + 1)) / 1000));
    }
  }
  return out;
}

// Whether this process (and so the engine it starts) may lower a nice value.
bool MayLower(int nice) {
  bool ok = false;
  std::thread t([&] { ok = setpriority(PRIO_PROCESS, syscall(SYS_gettid), nice) == 0; });
  t.join();
  return ok;
}

TEST(ControlNiceTest, ControlThreadsRunAtTheValueBulkThreadsDoNot) {
  const int want = MayLower(-5) ? -5 : 0;  // not permitted: logged, not applied
  for (const std::string role : {"prefill", "decode"}) {
    SCOPED_TRACE(role);
    EngineConfig c;
    c.name = "nice-" + role;
    c.role = role;
    c.extra = {"--control-nice", "-5", "--num-workers", "3"};
    std::string error;
    std::unique_ptr<Engine> e = Engine::Start(c, &error);
    ASSERT_TRUE(e) << error;
    const auto nice = NiceByThreadName(e->proc().pid());
    for (const char* control : {"kv-engine", "kv-rank0", "ZMQbg/IO/0", "ZMQbg/Reaper"}) {
      ASSERT_TRUE(nice.count(control)) << control;
      EXPECT_EQ(nice.at(control), std::vector<int>{want}) << control;
    }
    ASSERT_TRUE(nice.count("kv-writer"));
    EXPECT_EQ(nice.at("kv-writer"), std::vector<int>(3, 0));
    ASSERT_TRUE(nice.count("kvrelay"));  // the HTTP threads and main
    for (int n : nice.at("kvrelay")) EXPECT_EQ(n, 0);
  }
}

// Whether this kernel takes a per-thread slice (Linux 6.12+); elsewhere the
// engine logs that the flag was not applied and the tests below skip.
bool KernelTakesASlice() {
  bool ok = false;
  std::thread t([&] { ok = kvrelay::SetThisThreadSliceUs(100).ok(); });
  t.join();
  return ok;
}

TEST(ControlSliceTest, ControlThreadsAskForTheSliceBulkThreadsDoNot) {
  if (!KernelTakesASlice()) GTEST_SKIP() << "this kernel takes no per-thread slice";
  const int kernel_default = SliceByThreadName(getpid())["(main)"].empty()
                                 ? 0
                                 : SliceByThreadName(getpid())["(main)"][0];
  if (kernel_default == 0) GTEST_SKIP() << "this kernel shows no per-thread slice";
  for (const std::string flag : {"", "250"}) {
    SCOPED_TRACE("--control-slice-us " + (flag.empty() ? "(default)" : flag));
    const int want = flag.empty() ? 100 : std::stoi(flag);
    EngineConfig c;
    c.name = "slice-" + (flag.empty() ? std::string("default") : flag);
    c.role = "prefill";
    c.extra = {"--num-workers", "3", "--http-workers", "8"};
    if (!flag.empty()) c.extra.insert(c.extra.end(), {"--control-slice-us", flag});
    std::string error;
    std::unique_ptr<Engine> e = Engine::Start(c, &error);
    ASSERT_TRUE(e) << error;
    const auto slice = SliceByThreadName(e->proc().pid());
    for (const char* control : {"kv-rank0", "ZMQbg/IO/0", "ZMQbg/Reaper"}) {
      ASSERT_TRUE(slice.count(control)) << control;
      EXPECT_EQ(slice.at(control), std::vector<int>{want}) << control;
    }
    // The HTTP server's 2 I/O threads and its 8 workers ask for it; main
    // does not.
    ASSERT_TRUE(slice.count("kv-http-io"));
    EXPECT_EQ(slice.at("kv-http-io"), (std::vector<int>{want, want}));
    ASSERT_TRUE(slice.count("kv-http-work"));
    EXPECT_EQ(std::count(slice.at("kv-http-work").begin(), slice.at("kv-http-work").end(), want),
              8);
    EXPECT_EQ(slice.at("(main)"), std::vector<int>{kernel_default});
    for (const char* bulk : {"kv-engine", "kv-writer"}) {
      ASSERT_TRUE(slice.count(bulk)) << bulk;
      for (int s : slice.at(bulk)) EXPECT_EQ(s, kernel_default) << bulk;
    }
  }
}

TEST(ControlSliceTest, ZeroLeavesEveryThreadAtTheKernelsSlice) {
  const auto own = SliceByThreadName(getpid());
  if (own.count("(main)") == 0) GTEST_SKIP() << "this kernel shows no per-thread slice";
  const int kernel_default = own.at("(main)")[0];
  EngineConfig c;
  c.name = "slice-zero";
  c.role = "decode";
  c.extra = {"--control-slice-us", "0", "--http-workers", "8"};
  std::string error;
  std::unique_ptr<Engine> e = Engine::Start(c, &error);
  ASSERT_TRUE(e) << error;
  for (const auto& [name, slices] : SliceByThreadName(e->proc().pid())) {
    for (int s : slices) EXPECT_EQ(s, kernel_default) << name;
  }
}

// An engine started with `flag` set to each of `bad` refuses to start and
// names the flag.
void ExpectRefused(const std::string& flag, std::initializer_list<const char*> bad) {
  for (const char* value : bad) {
    SCOPED_TRACE(flag + " " + value);
    EngineConfig c;
    c.name = "bad-" + flag.substr(2) + value;
    c.role = "prefill";
    c.extra = {flag, value};
    std::string error;
    EXPECT_FALSE(Engine::Start(c, &error));
    EXPECT_NE(error.find(flag.substr(2)), std::string::npos) << error;
  }
}

TEST(ControlSliceTest, ValueOutsideTheRangeIsRefused) {
  ExpectRefused("--control-slice-us", {"99", "100001", "-1"});
}

TEST(ControlNiceTest, ValueOutsideTheRangeIsRefused) {
  ExpectRefused("--control-nice", {"3", "-21"});
}

}  // namespace
}  // namespace kvrelay::proctest
