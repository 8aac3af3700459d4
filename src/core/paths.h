// Paths and executables, one meaning each (used by the launcher, the engines, the Distributor,
// Horovod's driver and Tune):
//
//     if (auto self = read_self_exe(); self && !self->deleted) ... self->path ...
//     std::string srun = find_in_path("srun");          // "" when there is none
//     if (!is_executable_file(p)) throw UsageError(...);
//     cmd += shell_quote(arg);                          // one word for a remote shell
//
// Thread-safe (no state). Never throw except self_exe(), which says why it could not read.
#pragma once

#include <optional>
#include <string>

namespace dtrain {

// This process's executable as /proc/self/exe names it. When the file was deleted or replaced
// since the process started, the kernel appends " (deleted)": `path` is without it and
// `deleted` says so (the path then names another file, or none).
struct SelfExe {
  std::string path;
  bool deleted = false;
};
// nullopt when /proc/self/exe cannot be read; `why` (if given) gets the reason.
std::optional<SelfExe> read_self_exe(std::string* why = nullptr);
// The same; throws Error("cannot read /proc/self/exe: <reason>") when it cannot be read.
SelfExe self_exe();

// A regular file (symbolic links followed) that this process may execute. A directory with
// its x bit is not one; neither is "".
bool is_executable_file(const std::string& path);

// The first NAME in $PATH that is_executable_file (empty PATH entries mean "."; no PATH:
// /usr/local/bin:/usr/bin:/bin), or "" when there is none. NAME is looked up as given: callers
// pass a bare command name.
std::string find_in_path(const std::string& name);

// `s` as one word for a POSIX shell (a remote shell over ssh): single-quoted, each ' written
// as '\''.
std::string shell_quote(const std::string& s);

}  // namespace dtrain
