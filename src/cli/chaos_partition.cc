// chaos_partition.cc — see chaos_partition.h.
#include "cli/chaos_partition.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <set>
#include <sstream>

#include "cli/chaos_cleanup.h"

namespace kvrelay::cli {

std::string PortPartition::Unavailable() {
  if (geteuid() != 0) return "not root: nftables rules need CAP_NET_ADMIN";
  std::string out;
  if (RunCommand("nft --version", &out) != 0) {
    return "nft not found (install nftables; scripts/setup lists it)";
  }
  const std::string probe = "inet kvrelay_chaos_probe_" + std::to_string(getpid());
  if (RunCommand("nft add table " + probe, &out) != 0) {
    return "nft cannot add a table here: " + out.substr(0, 200);
  }
  DeleteNftTable(probe);
  return "";
}

Result<std::unique_ptr<PortPartition>> PortPartition::Cut(const std::vector<uint16_t>& ports) {
  if (ports.empty()) return InvalidArgumentError("no port to partition");
  static std::atomic<int> serial{0};
  const std::string name = "kvrelay_chaos_" + std::to_string(getpid()) + "_" +
                           std::to_string(serial.fetch_add(1));
  std::string set;
  for (uint16_t p : ports) set += (set.empty() ? "" : ", ") + std::to_string(p);
  const std::string path = "/tmp/" + name + ".nft";
  {
    std::ofstream f(path);
    f << "table inet " << name << " {\n"
      << "  chain input {\n"
      << "    type filter hook input priority -10; policy accept;\n"
      << "    iif \"lo\" tcp dport { " << set << " } drop\n"
      << "    iif \"lo\" tcp sport { " << set << " } drop\n"
      << "  }\n}\n";
  }
  const std::string table = "inet " + name;
  RegisterNftTable(table);  // before it exists: a signal mid-way still removes it
  std::string out;
  const int rc = RunCommand("nft -f " + path, &out);
  unlink(path.c_str());
  if (rc != 0) {
    DeleteNftTable(table);
    UnregisterNftTable(table);
    return Status(StatusCode::kUnavailable, "nft -f failed: " + out.substr(0, 300));
  }
  return std::unique_ptr<PortPartition>(new PortPartition(table));
}

bool PortPartition::Heal() {
  if (healed_) return true;
  healed_ = DeleteNftTable(table_) == 0;
  if (healed_) UnregisterNftTable(table_);
  return healed_;
}

std::vector<uint16_t> ListeningTcpPorts(pid_t pid) {
  // The socket inodes the process holds...
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(fd_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[256];
      const std::string link = fd_dir + "/" + e->d_name;
      const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      const std::string t = target;
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    closedir(d);
  }
  // ...that are tcp sockets in LISTEN (state 0A).
  std::vector<uint16_t> ports;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ls >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (st != "0A" || inodes.count(inode) == 0) continue;
      const size_t colon = local.rfind(':');
      if (colon == std::string::npos) continue;
      ports.push_back(static_cast<uint16_t>(std::stoul(local.substr(colon + 1), nullptr, 16)));
    }
  }
  std::sort(ports.begin(), ports.end());
  ports.erase(std::unique(ports.begin(), ports.end()), ports.end());
  return ports;
}

}  // namespace kvrelay::cli
