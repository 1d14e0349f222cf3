// chaos_partition.h — PortPartition: a real network partition on loopback,
// made with nftables: every tcp packet arriving on `lo` from or to a set of
// ports is dropped (silently, as a dead link drops: no reset, the senders
// retransmit), until Heal().
//
// Why ports: P and D of a local cluster share one host and one loopback,
// so "between P and D" is P's control ports (D's heartbeats and pulls, P's
// answers) plus D's tcp data-plane ports (P's writes) and, in read mode,
// P's (D's reads). The HTTP ports stay
// open: the router still reaches both, as when only the P–D link fails.
// (The shm transport cannot be partitioned: P writes D's memory directly.)
//
// Ownership: the case runner owns it; the destructor heals. The table is
// also registered with chaos_cleanup so a signal removes it.
// Threading: one owner thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"

namespace kvrelay::cli {

class PortPartition {
 public:
  // "" when nftables can be used here; otherwise why not (a case then
  // reports SKIPPED with it).
  static std::string Unavailable();
  static Result<std::unique_ptr<PortPartition>> Cut(const std::vector<uint16_t>& ports);
  ~PortPartition() { Heal(); }
  PortPartition(const PortPartition&) = delete;
  PortPartition& operator=(const PortPartition&) = delete;
  // Removes the rules (idempotent); false if nft failed to.
  bool Heal();

 private:
  explicit PortPartition(std::string table) : table_(std::move(table)) {}
  std::string table_;
  bool healed_ = false;
};

// The tcp ports process `pid` listens on (from /proc), ascending.
std::vector<uint16_t> ListeningTcpPorts(pid_t pid);

}  // namespace kvrelay::cli
