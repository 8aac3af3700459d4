// Live processes that carry a Distributor task in their environment (its workers and their
// launcher): what a test checks is empty after Distributor::run returns. Root reads every
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
