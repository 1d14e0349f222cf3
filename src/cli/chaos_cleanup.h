// chaos_cleanup.h — what `kvrelay chaos` must undo even when it is
// interrupted: nft tables it installed and child processes it stopped or
// started. A process-wide registry, and a thread that waits for SIGINT or
// SIGTERM, undoes everything registered and exits 130.
//
// Why: a partition left behind would break every later test on the host,
// and a SIGSTOPped child would never exit. Destructors do the normal-path
// cleanup; this registry covers the signal path.
//
// Threading: every function is thread-safe. InstallChaosSignalCleanup must
// be called before any other thread starts (it blocks the signals in the
// calling thread, which the others inherit).
#pragma once

#include <sys/types.h>

#include <string>

namespace kvrelay::cli {

void InstallChaosSignalCleanup();
void RegisterNftTable(const std::string& table);     // "inet <name>"
void UnregisterNftTable(const std::string& table);
void RegisterChildPid(pid_t pid);                    // SIGCONT + SIGKILL on a signal
void UnregisterChildPid(pid_t pid);
// Deletes a table: `nft delete table <table>`. Returns nft's exit status.
int DeleteNftTable(const std::string& table);
// Runs a shell command line; its exit status, its output in *out.
int RunCommand(const std::string& command_line, std::string* out);

}  // namespace kvrelay::cli
