// A C++ worker for deepspeed_launcher_test: prints one JSON line with its argv, environment
// and pid, as ds_show_env.py does (also to DS_TEST_OUT/rank<RANK>.json), and exits 0. Also
// where it runs: its CPUs (sched_getaffinity), its memory policy (get_mempolicy: mode and
// nodes) and whether dtrain's fork server library is mapped (it was forked from one). No
// libtorch.
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

extern char** environ;

int main(int argc, char** argv) {
  nlohmann::json out;
  out["argv"] = nlohmann::json::array();
  for (int i = 0; i < argc; ++i) out["argv"].push_back(argv[i]);
  out["env"] = nlohmann::json::object();
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) out["env"][kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  out["pid"] = ::getpid();
  cpu_set_t set;
  CPU_ZERO(&set);
  out["cpus"] = nlohmann::json::array();
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out["cpus"].push_back(c);
  }
  int mode = -1;
  unsigned long mask[16] = {};
  out["mem_nodes"] = nlohmann::json::array();
  if (::syscall(SYS_get_mempolicy, &mode, mask, 8 * sizeof mask, nullptr, 0UL) == 0) {
    for (int n = 0; n < static_cast<int>(8 * sizeof mask); ++n)
      if (mask[n / (8 * sizeof(unsigned long))] & (1UL << (n % (8 * sizeof(unsigned long)))))
        out["mem_nodes"].push_back(n);
  }
  out["mem_policy"] = mode;
  bool forked = false;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    forked = forked || line.find("libdtrain_forkserver") != std::string::npos;
  out["from_fork_server"] = forked;
  std::cout << out.dump() << std::endl;
  // The same line in DS_TEST_OUT/rank<RANK>.json (see ds_show_env.py).
  if (const char* dir = std::getenv("DS_TEST_OUT")) {
    const char* rank = std::getenv("RANK");
    const std::string path = std::string(dir) + "/rank" + (rank ? rank : "x") + ".json";
    std::ofstream(path + ".tmp") << out.dump();
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  return 0;
}
