// thread_priority.h — names and CFS nice values of kvrelay's own threads (os/).
//
// Why: when the load saturates the machine's cores, every hop of the
// control path (HTTP handler → engine loop → rank → ZeroMQ I/O → the peer's
// I/O → the peer's rank) waits for a time slice behind the threads doing
// bulk work (KV writes, HTTP streaming, the load itself). An abort that
// takes 1 ms at the median then takes tens of ms in the tail. Running the
// engine loop, the rank actors and ZeroMQ's I/O threads at a lower nice
// value (higher CFS weight) lets them preempt bulk work when they wake
// (measured in docs/performance.md, "What moved the bulk and one-block figures").
// Linux keeps a nice value per thread: setpriority(PRIO_PROCESS, tid).
//
// Names: every runtime thread is named (kv-engine, kv-rank<r>, kv-writer,
// ...) so `top -H` and `ps -L` show what runs.
//
// Slices: a nice value buys a thread more CPU time, which is what made
// `--control-nice` cost TTFT (the engine loop's KV work ran ahead of
// admissions). A short EEVDF slice (`--control-slice-us`) buys only an
// earlier turn after a wake-up, which is what the control path needs.
//
// Thread safety: any thread. Each function acts on the calling thread
// only, except CanSetNice (a short-lived thread of its own). A thread
// started later inherits its creator's nice value.
#pragma once

#include <string_view>

#include "base/status.h"

namespace kvrelay {

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

// Asks the scheduler for a time slice of `slice_us` µs for the calling
// thread (EEVDF's per-task slice: sched_setattr's sched_runtime for a
// SCHED_OTHER thread, Linux 6.12 and later; the kernel clamps it to
// 100 µs..100 ms). A shorter slice gives the thread an earlier virtual
// deadline, so on wake-up it preempts a thread with the default slice
// instead of waiting for that slice to run out; its share of CPU time, set
// by its nice value, does not change. Needs no privilege; the nice value is
// kept; threads started later inherit it. 0 restores the default slice.
// kInvalidArgument outside 0 and 100..100000; kFailedPrecondition when the
// kernel does not keep a per-thread slice (older kernels ignore the field:
// it is read back to tell) or the thread is not SCHED_OTHER.
Status SetThisThreadSliceUs(int slice_us);

// The calling thread's slice in µs as the kernel reports it: the one asked
// for, or the default (sched_base_slice, scaled by the number of CPUs);
// 0 on kernels that keep no per-thread slice, or for a thread that is not
// SCHED_OTHER.
int ThisThreadSliceUs();

}  // namespace kvrelay
