// Live processes that carry a Distributor task in their environment (its workers and their
// launcher) and were started under this test process: what a test checks is empty after
// Distributor::run returns. "Under this test process": they inherited its DTRAIN_TEST_DRIVER
// (set once, to this process's pid, before main), so another test binary running beside this one
// (ctest -j) does not count, and a worker that escaped to init still does. Root reads every
// process's environment; zombies are not counted.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace dtrain::test {

// Set before main in the driver; a worker (which inherited it) keeps the driver's.
inline const std::string kTestDriverMark = [] {
  ::setenv("DTRAIN_TEST_DRIVER", std::to_string(::getpid()).c_str(), /*overwrite=*/0);
  return std::string("DTRAIN_TEST_DRIVER=") + std::getenv("DTRAIN_TEST_DRIVER") + '\0';
}();

inline std::vector<int> distributor_processes() {
  std::vector<int> pids;
  DIR* d = ::opendir("/proc");
  if (!d) return pids;
  while (dirent* e = ::readdir(d)) {
    int pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == ::getpid()) continue;
    std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(in)), {});
    if (env.find("DTRAIN_DISTRIBUTOR_TASK=") == std::string::npos) continue;
    if (env.find(kTestDriverMark) == std::string::npos) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    auto rp = line.rfind(')');
    if (rp != std::string::npos && rp + 2 < line.size() && line[rp + 2] == 'Z') continue;
    pids.push_back(pid);
  }
  ::closedir(d);
  return pids;
}

}  // namespace dtrain::test
