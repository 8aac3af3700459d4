// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html) as
// macros, and the annotated mutex they need: libstdc++'s std::mutex carries no capability
// attribute, so the analysis cannot see it.
//
//     class Queue {
//       void push(int v) DTRAIN_EXCLUDES(mu_) { MutexLock lock(mu_); items_.push_back(v); }
//       void drop_locked() DTRAIN_REQUIRES(mu_);
//       Mutex mu_;
//       std::vector<int> items_ DTRAIN_GUARDED_BY(mu_);
//     };
//     // with a condition variable (std::condition_variable on the lock's std::unique_lock):
//     MutexLock lock(mu_);
//     cv_.wait(lock.native(), [&] { mu_.assert_held(); return !items_.empty(); });
//
// The macros expand to nothing on GCC; the test lint.thread_safety compiles the annotated
// sources with clang -Wthread-safety -Werror=thread-safety, so a lock misuse fails the suite.
// Mutex and MutexLock cost what std::mutex and std::unique_lock cost (they are those inside).
#pragma once

#include <mutex>

#if defined(__clang__)
#define DTRAIN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DTRAIN_THREAD_ANNOTATION(x)
#endif

#define DTRAIN_CAPABILITY(x) DTRAIN_THREAD_ANNOTATION(capability(x))
#define DTRAIN_SCOPED_CAPABILITY DTRAIN_THREAD_ANNOTATION(scoped_lockable)
#define DTRAIN_GUARDED_BY(x) DTRAIN_THREAD_ANNOTATION(guarded_by(x))
#define DTRAIN_PT_GUARDED_BY(x) DTRAIN_THREAD_ANNOTATION(pt_guarded_by(x))
#define DTRAIN_REQUIRES(...) DTRAIN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define DTRAIN_ACQUIRE(...) DTRAIN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define DTRAIN_RELEASE(...) DTRAIN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define DTRAIN_TRY_ACQUIRE(...) DTRAIN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define DTRAIN_EXCLUDES(...) DTRAIN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define DTRAIN_ASSERT_CAPABILITY(x) DTRAIN_THREAD_ANNOTATION(assert_capability(x))
#define DTRAIN_RETURN_CAPABILITY(x) DTRAIN_THREAD_ANNOTATION(lock_returned(x))
#define DTRAIN_NO_THREAD_SAFETY_ANALYSIS DTRAIN_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace dtrain {

// std::mutex as a capability. Not recursive; lock()/unlock() for the rare hand-held lock.
class DTRAIN_CAPABILITY("mutex") Mutex {
 public:
  void lock() DTRAIN_ACQUIRE() { mu_.lock(); }
  void unlock() DTRAIN_RELEASE() { mu_.unlock(); }
  bool try_lock() DTRAIN_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds it (a condition variable's predicate runs locked).
  void assert_held() const DTRAIN_ASSERT_CAPABILITY(this) {}
  std::mutex& native() DTRAIN_RETURN_CAPABILITY(this) { return mu_; }

 private:
  std::mutex mu_;
};

// std::unique_lock<std::mutex> over a Mutex: held from construction to destruction, except
// between unlock() and lock(). native() is for std::condition_variable's waits.
class DTRAIN_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) DTRAIN_ACQUIRE(mu) : lock_(mu.native()) {}
  // Takes over a Mutex the caller locked (after a successful try_lock()).
  MutexLock(Mutex& mu, std::adopt_lock_t) DTRAIN_REQUIRES(mu)
      : lock_(mu.native(), std::adopt_lock) {}
  ~MutexLock() DTRAIN_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  void lock() DTRAIN_ACQUIRE() { lock_.lock(); }
  void unlock() DTRAIN_RELEASE() { lock_.unlock(); }
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace dtrain
