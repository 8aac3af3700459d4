#include "core/owned_dir.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "dtrain/error.h"

namespace dtrain::detail {

namespace fs = std::filesystem;

int sweep_abandoned_dirs(const std::string& parent, const std::string& stem) {
  std::error_code ec;
  std::vector<fs::path> abandoned;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(stem, 0) != 0) continue;
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
      continue;
    const int fd = ::open((it->path() / ".lock").c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) abandoned.push_back(it->path());
    ::close(fd);
  }
  int removed = 0;
  for (const auto& dir : abandoned) removed += fs::remove_all(dir, ec) > 0 ? 1 : 0;
  return removed;
}

OwnedTempDir::OwnedTempDir(const std::string& stem) {
  std::error_code ec;
  const fs::path parent = fs::temp_directory_path(ec);
  const std::string where = ec ? std::string("/tmp") : parent.string();
  sweep_abandoned_dirs(where, stem);
  std::string tmpl = where + "/" + stem + std::to_string(::getpid()) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw Error("cannot create a temporary directory in " + where + ": " + std::strerror(errno) +
                "; set TMPDIR to a writable directory");
  }
  path_ = tmpl;
  owner_ = ::getpid();
  const std::string fresh = path_ + "/.lock.new";
  lock_fd_ = ::open(fresh.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (lock_fd_ >= 0 && ::flock(lock_fd_, LOCK_EX) == 0) {
    ::rename(fresh.c_str(), (path_ + "/.lock").c_str());
  }
}

OwnedTempDir::~OwnedTempDir() {
  std::error_code ec;
  if (owner_ == ::getpid()) fs::remove_all(path_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

}  // namespace dtrain::detail
