// A temporary directory a process owns while it lives, and which the next one made on the host
// removes if its owner died without removing it (SIGKILL, a job step's cgroup killed whole).
//
//     OwnedTempDir dir("dtrain-run-");   // /tmp/dtrain-run-<pid>-XXXXXX
//     ... dir.path() ...                 // removed by the destructor
//
// The owner holds an exclusive flock on <dir>/.lock (close-on-exec, so no child keeps it). The
// kernel drops a dead process's locks: a `.lock` that can be locked marks a directory no one
// owns. The lock is taken before the file gets that name, so a sweep never finds a live owner's
// unlocked. Directories of other users, and any without a `.lock`, are left alone. Only the
// process that made it removes it: a forked child's copy (destroyed in the child) does not.
#pragma once

#include <sys/types.h>

#include <string>

namespace dtrain::detail {

class OwnedTempDir {
 public:
  // Removes the abandoned directories of `stem` in the temporary directory, then makes this
  // one; throws dtrain::Error when it cannot.
  explicit OwnedTempDir(const std::string& stem);
  ~OwnedTempDir();
  OwnedTempDir(const OwnedTempDir&) = delete;
  OwnedTempDir& operator=(const OwnedTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int lock_fd_ = -1;
  pid_t owner_ = -1;
};

// Removes every <parent>/<stem>* directory of this user whose `.lock` no process holds;
// returns how many. Never throws.
int sweep_abandoned_dirs(const std::string& parent, const std::string& stem);

}  // namespace dtrain::detail
