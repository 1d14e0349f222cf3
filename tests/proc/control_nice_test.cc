// control_nice_test.cc — `kvrelay serve --control-nice`: the control path's
// threads (engine loop, rank actors, ZeroMQ's I/O and reaper threads) run
// at the value given, bulk threads (writers, HTTP) keep the default; a
// value outside -20..0 is refused at start.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

TEST(ControlNiceTest, ValueOutsideTheRangeIsRefused) {
  for (const char* bad : {"3", "-21"}) {
    SCOPED_TRACE(bad);
    EngineConfig c;
    c.name = std::string("nice-bad") + bad;
    c.role = "prefill";
    c.extra = {"--control-nice", bad};
    std::string error;
    EXPECT_FALSE(Engine::Start(c, &error));
    EXPECT_NE(error.find("control-nice"), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace kvrelay::proctest
