// thread_annotations.h — clang's thread-safety attributes as macros.
//
// Why: a lock protects data only if every access takes it. Clang's static
// analysis (-Wthread-safety, on in every clang build of kvrelay, an error
// under -Werror) proves it at compile time for code that says which mutex
// guards what: GUARDED_BY on the member, REQUIRES on a helper that expects
// the lock held, EXCLUDES on a method that takes it itself. The lockable
// type is kvrelay::Mutex (base/mutex.h); std::mutex is not annotated, so
// code that uses it directly is not checked.
//
// Under g++ (the release build) every macro expands to nothing.
//
// Usage:
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_) = 0;
//   void BumpLocked() REQUIRES(mu_) { ++count_; }
//   void Bump() EXCLUDES(mu_) { MutexLock lock(&mu_); BumpLocked(); }
//
// Thread safety: declarations only.
#pragma once

#if defined(__clang__)
#define KVRELAY_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVRELAY_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (kvrelay::Mutex).
#define CAPABILITY(x) KVRELAY_THREAD_ANNOTATION(capability(x))
// An RAII type that holds a lock for its lifetime (kvrelay::MutexLock).
#define SCOPED_CAPABILITY KVRELAY_THREAD_ANNOTATION(scoped_lockable)

// A member read or written only with the lock held.
#define GUARDED_BY(x) KVRELAY_THREAD_ANNOTATION(guarded_by(x))
// A pointer member whose pointee is read or written only with the lock held.
#define PT_GUARDED_BY(x) KVRELAY_THREAD_ANNOTATION(pt_guarded_by(x))

// Lock ordering: this lock is taken before / after the named ones.
#define ACQUIRED_BEFORE(...) KVRELAY_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) KVRELAY_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))

// The caller must hold the lock (exclusively / at least shared).
#define REQUIRES(...) KVRELAY_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) KVRELAY_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))

// The function takes / releases the lock (no argument: `this`).
#define ACQUIRE(...) KVRELAY_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) KVRELAY_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) KVRELAY_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) KVRELAY_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) KVRELAY_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
// Takes the lock if it returns the given value.
#define TRY_ACQUIRE(...) KVRELAY_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) \
  KVRELAY_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))

// The caller must not hold the lock (the function takes it; no recursion).
#define EXCLUDES(...) KVRELAY_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// Tells the analysis the lock is held here (checked at run time or by
// construction).
#define ASSERT_CAPABILITY(x) KVRELAY_THREAD_ANNOTATION(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) KVRELAY_THREAD_ANNOTATION(assert_shared_capability(x))

// The function returns a reference to the given lock.
#define RETURN_CAPABILITY(x) KVRELAY_THREAD_ANNOTATION(lock_returned(x))

// Turns the analysis off for one function: only for code the analysis
// cannot follow (say why at the use).
#define NO_THREAD_SAFETY_ANALYSIS KVRELAY_THREAD_ANNOTATION(no_thread_safety_analysis)
