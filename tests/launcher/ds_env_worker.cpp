// A C++ worker for deepspeed_launcher_test: prints one JSON line with its argv, environment
// and pid, as ds_show_env.py does (also to DS_TEST_OUT/rank<RANK>.json), and exits 0. No
// libtorch.
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
