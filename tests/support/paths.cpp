#include "support/paths.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

namespace dtrain::test {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "test paths: %s\n", message.c_str());
  std::exit(2);
}

struct Tree {
  std::string build;
  std::map<std::string, std::string> cache;  // NAME -> value of CMakeCache.txt
};

const Tree& tree() {
  static const Tree t = [] {
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) die("cannot read /proc/self/exe: " + ec.message());
    for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
      if (fs::exists(dir / "CMakeCache.txt")) {
        Tree found{dir.string(), {}};
        std::ifstream in(dir / "CMakeCache.txt");
        for (std::string line; std::getline(in, line);) {
          if (line.empty() || line[0] == '#' || line[0] == '/') continue;
          auto colon = line.find(':');
          auto eq = line.find('=', colon == std::string::npos ? 0 : colon);
          if (colon == std::string::npos || eq == std::string::npos) continue;
          found.cache[line.substr(0, colon)] = line.substr(eq + 1);
        }
        return found;
      }
      if (dir == dir.root_path()) break;
    }
    die(exe.string() +
        " is not inside a CMake build tree (no CMakeCache.txt above it); run the tests from "
        "their build tree (ctest in build/ or build-torch2/)");
  }();
  return t;
}

const std::string& cache_value(const char* name) {
  auto it = tree().cache.find(name);
  if (it == tree().cache.end() || it->second.empty()) {
    die(std::string(name) + " is not set in " + tree().build +
        "/CMakeCache.txt; re-run scripts/setup.sh");
  }
  return it->second;
}

const char* intern(std::string s) {
  static std::mutex mu;
  static std::map<std::string, std::string> strings;
  std::lock_guard<std::mutex> lock(mu);
  return strings.emplace(s, s).first->second.c_str();
}

bool torch1() {
#ifdef DTRAIN_TORCH_VERSION
  return DTRAIN_TORCH_VERSION[0] == '1';
#else
  return false;
#endif
}

}  // namespace

const std::string& build_dir() { return tree().build; }

const std::string& source_dir() { return cache_value("CMAKE_HOME_DIRECTORY"); }

const char* built(const char* relative) { return intern(build_dir() + "/" + relative); }

const char* venv_python() { return cache_value("DTRAIN_VENV_PYTHON").c_str(); }

const char* native_python() { return torch1() ? "/usr/bin/python3" : venv_python(); }

const char* native_torchrun() {
  if (torch1()) return "/usr/bin/torchrun";
  return intern((fs::path(venv_python()).parent_path() / "torchrun").string());
}

}  // namespace dtrain::test
