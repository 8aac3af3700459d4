#include "core/shared_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

namespace dtrain::detail {

namespace fs = std::filesystem;

void remove_shared_files(const std::string& prefix) {
  const fs::path p(prefix);
  const std::string stem = p.filename().string() + "-";
  std::error_code ec;
  for (fs::directory_iterator it(p.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().rfind(stem, 0) == 0) fs::remove(it->path(), ec);
  }
  fs::remove(prefix + ".lock", ec);
}

int sweep_shared_files(const std::string& dir, const std::string& stem) {
  std::vector<std::string> locks;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(stem, 0) == 0 && it->path().extension() == ".lock")
      locks.push_back(it->path().string());
  }
  int swept = 0;
  for (const auto& lock : locks) {
    const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {  // nobody uses them
      remove_shared_files(lock.substr(0, lock.size() - 5));
      ++swept;
    }
    ::close(fd);
  }
  return swept;
}

std::string data_cache_stem() { return "dtrain-data-" + std::to_string(::getuid()) + "-"; }

}  // namespace dtrain::detail
