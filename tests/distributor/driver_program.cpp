// A driver program for the tests that need a whole process (tests/distributor/driver_test.cpp):
//   --no-init        never calls dtrain::init, then runs a function: must be a clear error
//   --sleep-workers  runs a function that prints "worker ready" and sleeps 120 s on 2 workers
//                    (the test SIGKILLs this driver and checks the workers go too)
//   --one            runs a function that returns 1 on 2 workers
//   --argv ARGS...   runs a function on 2 workers that returns the arguments their main() got;
//                    exits 0 when every worker's are the driver's own, else prints them, exits 4
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/distributor.h"

namespace {
int sleeper() {
  std::printf("worker ready\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(120));
  return 0;
}
int one() { return 1; }
std::vector<std::string> g_args;  // main()'s arguments, taken before dtrain::init
std::vector<std::string> own_args() { return g_args; }
}  // namespace

int main(int argc, char** argv) {
  const bool no_init = argc > 1 && std::strcmp(argv[1], "--no-init") == 0;
  g_args.assign(argv + 1, argv + argc);
  if (!no_init) dtrain::init(argc, argv);
  try {
    dtrain::Distributor d({.num_processes = 2});
    if (argc > 1 && std::strcmp(argv[1], "--argv") == 0) {
      int differ = 0;
      for (const auto& got : d.run_all(own_args)) {
        if (got == g_args) continue;
        ++differ;
        std::fprintf(stderr, "a worker's arguments:");
        for (const auto& a : got) std::fprintf(stderr, " [%s]", a.c_str());
        std::fprintf(stderr, "\n");
      }
      return differ == 0 ? 0 : 4;
    }
    if (no_init || (argc > 1 && std::strcmp(argv[1], "--one") == 0)) return d.run(one);
    return d.run(sleeper);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "driver: %s\n", e.what());
    return 3;
  }
}
