// Files the processes of a host share under one lock (the data reader's shared cache,
// dtrain/data_reader.h): every user of the files <prefix>-* holds a shared flock on
// <prefix>.lock, and whoever finds the lock free for itself alone removes them. The kernel
// drops a dead process's locks, so files whose lock nobody holds are no one's: the last user
// of a job that ended without clean-up (killed, aborted) is its launcher, which sweeps them.
//
//     remove_shared_files(prefix);                       // the last user, holding the lock
//     sweep_shared_files("/dev/shm", data_cache_stem()); // dtrain run, after its workers
//
// Thread-safe (no state). Never throw: a file that cannot be removed stays.
#pragma once

#include <string>

namespace dtrain::detail {

// Removes <prefix>-* and <prefix>.lock.
void remove_shared_files(const std::string& prefix);

// For every <dir>/<stem>*.lock that no process holds a lock on: removes its files (as
// remove_shared_files). Returns how many locks were swept.
int sweep_shared_files(const std::string& dir, const std::string& stem);

// The stem of the data reader's shared cache files of this user: "dtrain-data-<uid>-".
std::string data_cache_stem();

}  // namespace dtrain::detail
