// A C++ worker for deepspeed_launcher_test: prints one JSON line with its argv, environment
// and pid, as ds_show_env.py does, and exits 0. No libtorch.
#include <unistd.h>

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
  return 0;
}
