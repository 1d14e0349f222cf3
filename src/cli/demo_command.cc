// `kvrelay demo`: the main job. A P engine, a D engine and the router on
// loopback (child processes, logs in a folder), a load through the router
// with client disconnects and a lifecycle call landing mid-run, the report,
// and a clean shutdown of everything.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <httplib.h>

#include <cstdio>
#include <ctime>
#include <memory>

#include "cli/child_process.h"
#include "cli/commands.h"

namespace kvrelay::cli {
namespace {

struct DemoOptions {
  std::string logs;
  std::string transport = "shm";
  std::string shape = "tiny";
  uint32_t p_tp = 1, d_tp = 1;
  uint32_t num_blocks = 0;
  double step_per_token_us = 20;
};

// A port the kernel says is free now (and, for a control base, the next
// `span` ports too, as far as a bind can tell).
uint16_t FreePort(uint32_t span = 1) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    const uint16_t port = ntohs(a.sin_port);
    if (port + span >= 65535) continue;
    bool all_free = true;
    for (uint32_t k = 1; k < span && all_free; ++k) {
      int f2 = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in b = a;
      b.sin_port = htons(static_cast<uint16_t>(port + k));
      all_free = bind(f2, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
      close(f2);
    }
    if (all_free) return port;
  }
  return 0;
}

bool WaitHealthy(const std::string& url, ChildProcess& child, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  httplib::Client cli(url);
  cli.set_connection_timeout(1);
  cli.set_read_timeout(2);
  while (std::chrono::steady_clock::now() < until) {
    if (!child.Running()) return false;
    if (auto r = cli.Get("/health"); r && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "kvrelay";
  buf[n] = 0;
  return buf;
}

int RunDemo(const DemoOptions& d, const LoadOptions& load_base,
            const std::vector<std::string>& controls, const std::string& json_path) {
  std::string logs = d.logs;
  if (logs.empty()) logs = "/tmp/kvrelay-demo-" + std::to_string(std::time(nullptr));
  mkdir(logs.c_str(), 0755);
  const std::string self = SelfPath();
  const uint16_t p_port = FreePort(), d_port = FreePort(), r_port = FreePort();
  const uint16_t p_ctrl = FreePort(d.p_tp), d_ctrl = FreePort(d.d_tp);
  if (!p_port || !d_port || !r_port || !p_ctrl || !d_ctrl) {
    std::fprintf(stderr, "kvrelay demo: no free ports on loopback\n");
    return 1;
  }
  auto engine_args = [&](const char* role, uint16_t port, uint16_t ctrl, uint32_t tp) {
    std::vector<std::string> a = {self, "serve", "--role", role, "--port", std::to_string(port),
                                  "--ctrl-port", std::to_string(ctrl), "--tp",
                                  std::to_string(tp), "--transport", d.transport,
                                  "--model-shape", d.shape, "--step-per-token-us",
                                  std::to_string(d.step_per_token_us)};
    if (d.num_blocks != 0) {
      a.push_back("--num-blocks");
      a.push_back(std::to_string(d.num_blocks));
    }
    return a;
  };
  const std::string p_url = "http://127.0.0.1:" + std::to_string(p_port);
  const std::string d_url = "http://127.0.0.1:" + std::to_string(d_port);
  const std::string r_url = "http://127.0.0.1:" + std::to_string(r_port);
  std::printf("kvrelay demo: 1P1D on loopback, transport %s, model shape %s, logs in %s\n",
              d.transport.c_str(), d.shape.c_str(), logs.c_str());
  std::printf("  prefill %s (tp %u), decode %s (tp %u), router %s\n", p_url.c_str(), d.p_tp,
              d_url.c_str(), d.d_tp, r_url.c_str());
  std::fflush(stdout);
  ChildProcess p, dd, router;
  struct Named {
    const char* name;
    ChildProcess* proc;
    std::string url;
  };
  std::vector<Named> procs = {{"prefill", &p, p_url}, {"decode", &dd, d_url},
                              {"router", &router, r_url}};
  bool started = p.Start(engine_args("prefill", p_port, p_ctrl, d.p_tp), logs + "/prefill.log") &&
                 dd.Start(engine_args("decode", d_port, d_ctrl, d.d_tp), logs + "/decode.log") &&
                 router.Start({self, "router", "--prefill", p_url, "--decode", d_url, "--port",
                               std::to_string(r_port)},
                              logs + "/router.log");
  for (const Named& n : procs) {
    if (!started || !WaitHealthy(n.url, *n.proc, 60)) {
      std::fprintf(stderr, "kvrelay demo: the %s did not come up (%s); its log:\n%s", n.name,
                   n.proc->Describe().c_str(), n.proc->Tail(20).c_str());
      return 1;
    }
  }
  LoadOptions o = load_base;
  o.url = r_url;
  const int rc = RunLoadCommand(o, controls, json_path);
  std::printf("  shutdown:");
  for (auto it = procs.rbegin(); it != procs.rend(); ++it) {
    const std::string how = it->proc->Stop(std::chrono::seconds(15));
    std::printf(" %s %s;", it->name, how.c_str());
  }
  std::printf("\n  logs: %s/{prefill,decode,router}.log\n", logs.c_str());
  bool clean = true;
  for (const Named& n : procs) clean = clean && n.proc->ExitedCleanly();
  if (!clean) std::printf("  a process did not stop cleanly\n");
  return rc != 0 ? rc : (clean ? 0 : 1);
}

}  // namespace

void RegisterDemo(CLI::App& app) {
  auto d = std::make_shared<DemoOptions>();
  auto o = std::make_shared<LoadOptions>();
  auto controls = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"pause:mode=abort,target=p@3s"});
  auto json_path = std::make_shared<std::string>();
  o->requests = 600;
  o->concurrency = 96;
  o->disconnect_fraction = 0.1;
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "The main job: start a P engine, a D engine and the router on loopback, run a load "
      "through them with client disconnects and a lifecycle call (default: pause abort on P "
      "at 3 s, then resume), print the report, shut everything down");
  cmd->add_option("--logs", d->logs, "folder for the processes' logs (default /tmp/kvrelay-demo-<time>)");
  cmd->add_option("--transport", d->transport, "shm | tcp | ucx")->capture_default_str();
  cmd->add_option("--model-shape", d->shape, "tiny | small | 8b")->capture_default_str();
  cmd->add_option("--p-tp", d->p_tp, "prefill tp")->capture_default_str();
  cmd->add_option("--d-tp", d->d_tp, "decode tp")->capture_default_str();
  cmd->add_option("--num-blocks", d->num_blocks, "KV blocks per engine (default: serve's)");
  cmd->add_option("--step-per-token-us", d->step_per_token_us, "modelled compute per token")
      ->capture_default_str();
  AddLoadFlags(cmd, o.get(), controls.get(), json_path.get());
  cmd->callback([d, o, controls, json_path] {
    SetExitCode(RunDemo(*d, *o, *controls, *json_path));
  });
}

}  // namespace kvrelay::cli
