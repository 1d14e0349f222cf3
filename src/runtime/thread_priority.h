// thread_priority.h — names and CFS nice values of the runtime's own threads.
//
// Why: when the load saturates the machine's cores, every hop of the
// control path (HTTP handler → engine loop → rank → ZeroMQ I/O → the peer's
// I/O → the peer's rank) waits for a time slice behind the threads doing
// bulk work (KV writes, HTTP streaming, the load itself). An abort that
// takes 1 ms at the median then takes tens of ms in the tail. Running the
// engine loop, the rank actors and ZeroMQ's I/O threads at a lower nice
// value (higher CFS weight) lets them preempt bulk work when they wake
// (measured in docs/performance.md, "Control threads ahead of bulk work").
// Linux keeps a nice value per thread: setpriority(PRIO_PROCESS, tid).
//
// Names: every runtime thread is named (kv-engine, kv-rank<r>, kv-writer,
// ...) so `top -H` and `ps -L` show what runs.
//
// Thread safety: any thread. Each function acts on the calling thread
// only, except CanSetNice (a short-lived thread of its own). A thread
// started later inherits its creator's nice value.
#pragma once

#include <string_view>

#include "base/status.h"

namespace kvrelay::runtime {

// Names the calling thread (Linux keeps 15 characters; the rest is cut).
void NameThisThread(std::string_view name);

// Sets the calling thread's nice value (-20..19). kFailedPrecondition when a
// value below the current one is not allowed (needs CAP_SYS_NICE or a
// RLIMIT_NICE that allows it); kInvalidArgument outside -20..19.
Status SetThisThreadNice(int nice);

// The calling thread's nice value.
int ThisThreadNice();

// Whether a thread of this process may set `nice`: tries it on a thread
// started for the purpose, so no running thread changes.
bool CanSetNice(int nice);

}  // namespace kvrelay::runtime
