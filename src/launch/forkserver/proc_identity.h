// What `ps`, `pgrep -f` and /proc show of a worker forked by the fork server.
#pragma once

namespace dtrain::forkserver {

// Makes /proc/self/cmdline show `argv` (argc strings) and /proc/self/environ show `envp`
// (NULL-terminated), as if the process had been exec'd with them: a forked worker otherwise shows
// the fork server's command line (`${local_rank}` unsubstituted, no --local_rank=N) and
// environment (no RANK). Copies the strings into a mapping of their own, which stays. Uses
// only system calls (called in a freshly forked child). Best effort: false, changing nothing,
// where the kernel refuses (no CONFIG_CHECKPOINT_RESTORE, a process that is not dumpable).
[[gnu::visibility("hidden")]] bool show_in_proc(int argc, const char* const* argv,
                                                const char* const* envp);

}  // namespace dtrain::forkserver
