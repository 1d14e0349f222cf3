#include "cli/local_cluster.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "http/http_client.h"
#include "runtime/free_port.h"

namespace kvrelay::cli {

uint16_t FreePort(uint32_t span) { return runtime::FreeLoopbackPorts(span); }

std::vector<std::string> StreamChunksArgs(uint32_t chunk_tokens) {
  return {"--stream-chunks", "--max-batch-tokens", std::to_string(chunk_tokens)};
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "kvrelay";
  buf[n] = 0;
  return buf;
}

namespace {
bool WaitHealthy(const std::string& url, ChildProcess& child, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const http::Client cli(url, http::ClientOptions::Timeouts(Duration::Seconds(1),
                                                            Duration::Seconds(2)));
  while (std::chrono::steady_clock::now() < until) {
    if (!child.Running()) return false;
    if (auto r = cli.Get("/health"); r.ok() && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// main.cc's flag: a child stops when this process exits, however it exits.
const char* ExitWithParent() { return "--exit-with-parent"; }
}  // namespace

Status LocalCluster::Start(const ClusterOptions& o) {
  for (size_t i = 1; i <= o.logs.size(); ++i) {  // mkdir -p
    if (i == o.logs.size() || o.logs[i] == '/') mkdir(o.logs.substr(0, i).c_str(), 0755);
  }
  const std::string self = SelfPath();
  auto start = [&](std::string name, std::vector<std::string> args, std::string url) -> Status {
    Proc p{name, url, std::make_unique<ChildProcess>(), args, o.logs + "/" + name + ".log"};
    if (!p.child->Start(args, p.log)) {
      return Status(StatusCode::kUnavailable, "cannot start " + name);
    }
    procs_.push_back(std::move(p));
    return Status::Ok();
  };
  // `twin`: the twin P (its own name, url and extra flags).
  auto engine = [&](const char* role, uint32_t index, uint32_t tp, bool twin = false) -> Status {
    const uint16_t port = FreePort(), ctrl = FreePort(tp);
    if (port == 0 || ctrl == 0) return Status(StatusCode::kUnavailable, "no free port");
    std::vector<std::string> a = {self, ExitWithParent(), std::to_string(getpid()), "serve", "--role", role, "--port", std::to_string(port),
                                  "--ctrl-port", std::to_string(ctrl), "--tp", std::to_string(tp),
                                  "--transport", o.transport,
                                  "--step-per-token-us", std::to_string(o.step_per_token_us)};
    if (!o.shape.empty()) {  // empty: the model names its own (--engine llama)
      a.push_back("--model-shape");
      a.push_back(o.shape);
    }
    if (o.num_blocks != 0) {
      a.push_back("--num-blocks");
      a.push_back(std::to_string(o.num_blocks));
    }
    if (o.control_nice != 0) {
      a.push_back("--control-nice");
      a.push_back(std::to_string(o.control_nice));
    }
    if (o.control_slice_us >= 0) {
      a.push_back("--control-slice-us");
      a.push_back(std::to_string(o.control_slice_us));
    }
    a.insert(a.end(), o.engine_args.begin(), o.engine_args.end());
    if (std::string(role) == "prefill") {
      a.insert(a.end(), o.p_engine_args.begin(), o.p_engine_args.end());
    }
    if (twin) a.insert(a.end(), o.twin_p_args.begin(), o.twin_p_args.end());
    if (!o.auth_token_file.empty()) {
      a.push_back("--auth-token-file");
      a.push_back(o.auth_token_file);
    }
    const std::string url = "http://127.0.0.1:" + std::to_string(port);
    const std::string r = role;
    if (twin) {
      twin_p_url_ = url;
      return start("twinprefill" + std::to_string(index), a, url);
    }
    (r == "prefill" ? p_urls_ : r == "decode" ? d_urls_ : plain_urls_).push_back(url);
    return start(std::string(role) + std::to_string(index), a, url);
  };
  for (uint32_t i = 0; i < o.num_p; ++i) {
    if (Status s = engine("prefill", i, o.p_tp); !s.ok()) return s;
  }
  for (uint32_t i = 0; i < o.num_d; ++i) {
    if (Status s = engine("decode", i, o.d_tp); !s.ok()) return s;
  }
  for (uint32_t i = 0; i < o.num_plain; ++i) {
    if (Status s = engine("plain", i, 1); !s.ok()) return s;
  }
  if (!o.twin_p_args.empty()) {
    if (Status s = engine("prefill", 0, o.p_tp, true); !s.ok()) return s;
  }
  // A router over `ps` and every D.
  auto router = [&](const std::string& name, const std::vector<std::string>& ps,
                    std::string* url) -> Status {
    const uint16_t rport = FreePort();
    if (rport == 0) return Status(StatusCode::kUnavailable, "no free port");
    *url = "http://127.0.0.1:" + std::to_string(rport);
    std::vector<std::string> ra = {self, ExitWithParent(), std::to_string(getpid()), "router",
                                   "--port", std::to_string(rport)};
    if (!o.auth_token_file.empty()) {
      ra.push_back("--auth-token-file");
      ra.push_back(o.auth_token_file);
    }
    for (const auto& u : ps) {
      ra.push_back("--prefill");
      ra.push_back(u);
    }
    for (const auto& u : d_urls_) {
      ra.push_back("--decode");
      ra.push_back(u);
    }
    ra.insert(ra.end(), o.router_args.begin(), o.router_args.end());
    return start(name, ra, *url);
  };
  if (Status s = router("router", p_urls_, &router_url_); !s.ok()) return s;
  if (!o.twin_p_args.empty()) {
    if (Status s = router("twinrouter", {twin_p_url_}, &twin_router_url_); !s.ok()) return s;
  }
  for (Proc& p : procs_) {
    if (!WaitHealthy(p.url, *p.child, 60)) {
      return Status(StatusCode::kUnavailable, "the " + p.name + " did not come up (" +
                                                  p.child->Describe() + "); its log:\n" +
                                                  p.child->Tail(20));
    }
  }
  return Status::Ok();
}

LocalCluster::Proc* LocalCluster::Find(const std::string& name) {
  for (Proc& p : procs_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

pid_t LocalCluster::Pid(const std::string& name) {
  Proc* p = Find(name);
  return p != nullptr && p->child->Running() ? p->child->pid() : -1;
}

Status LocalCluster::Kill(const std::string& name) {
  Proc* p = Find(name);
  if (p == nullptr) return NotFoundError("no process " + name);
  p->child->Kill();
  return Status::Ok();
}

Status LocalCluster::Restart(const std::string& name, double timeout_s) {
  Proc* p = Find(name);
  if (p == nullptr) return NotFoundError("no process " + name);
  if (p->child->Running()) return FailedPreconditionError(name + " is still running");
  p->child = std::make_unique<ChildProcess>();
  if (!p->child->Start(p->argv, p->log)) {
    return Status(StatusCode::kUnavailable, "cannot restart " + name);
  }
  if (!WaitHealthy(p->url, *p->child, timeout_s)) {
    return Status(StatusCode::kUnavailable, "the restarted " + name + " did not come up (" +
                                                p->child->Describe() + "); its log:\n" +
                                                p->child->Tail(20));
  }
  return Status::Ok();
}

std::string LocalCluster::Stop(bool* clean) {
  std::string out;
  bool all = true;
  for (auto it = procs_.rbegin(); it != procs_.rend(); ++it) {
    const std::string how = it->child->Stop(std::chrono::seconds(15));
    out += it->name + " " + how + "; ";
    all = all && it->child->ExitedCleanly();
  }
  procs_.clear();
  if (clean != nullptr) *clean = all;
  return out;
}

double MetricSample(const std::string& url, const std::string& sample) {
  const http::Client cli(url, http::ClientOptions::Timeouts(Duration::Seconds(1),
                                                            Duration::Seconds(3)));
  auto r = cli.Get("/metrics");
  if (!r.ok() || r->status != 200) return -1;
  const std::string key = "\n" + sample + " ";  // a sample line, not its # HELP
  const size_t at = r->body.find(key);
  return at == std::string::npos ? -1 : std::strtod(r->body.c_str() + at + key.size(), nullptr);
}

Result<nlohmann::json> GetJson(const std::string& url, const std::string& path) {
  const http::Client cli(url, http::ClientOptions::Timeouts(Duration::Seconds(2),
                                                            Duration::Seconds(5)));
  auto r = cli.Get(path);
  if (!r.ok() || r->status != 200) return Status(StatusCode::kUnavailable, url + path);
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded()) return Status(StatusCode::kUnavailable, url + path + ": not JSON");
  return j;
}

}  // namespace kvrelay::cli
