#include "core/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "dtrain/error.h"

namespace dtrain {

std::optional<SelfExe> read_self_exe(std::string* why) {
  char buf[PATH_MAX + 1];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) {
    if (why) *why = n < 0 ? std::strerror(errno) : "the path is empty or too long";
    return std::nullopt;
  }
  SelfExe self{std::string(buf, static_cast<size_t>(n)), false};
  static constexpr char kDeleted[] = " (deleted)";
  constexpr size_t kLen = sizeof kDeleted - 1;
  if (self.path.size() > kLen && self.path.compare(self.path.size() - kLen, kLen, kDeleted) == 0) {
    self.path.resize(self.path.size() - kLen);
    self.deleted = true;
  }
  return self;
}

SelfExe self_exe() {
  std::string why;
  auto self = read_self_exe(&why);
  if (!self) throw Error("cannot read /proc/self/exe: " + why);
  return *self;
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (true) {
    size_t colon = p.find(':', pos);
    std::string dir = p.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (dir.empty()) dir.assign(1, '.');  // (not = ".": GCC 12's -Wrestrict false positive)
    std::string candidate = dir + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string::npos) return "";
    pos = colon + 1;
  }
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace dtrain
