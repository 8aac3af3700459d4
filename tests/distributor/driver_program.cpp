// A driver program for the tests that need a whole process (tests/distributor/driver_test.cpp):
//   --no-init        never calls dtrain::init, then runs a function: must be a clear error
//   --sleep-workers  runs a function that prints "worker ready" and sleeps 120 s on 2 workers
//                    (the test SIGKILLs this driver and checks the workers go too)
//   --one            runs a function that returns 1 on 2 workers
#include <cstdio>
#include <cstring>
#include <thread>

#include "dtrain/distributor.h"

namespace {
int sleeper() {
  std::printf("worker ready\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(120));
  return 0;
}
int one() { return 1; }
}  // namespace

int main(int argc, char** argv) {
  const bool no_init = argc > 1 && std::strcmp(argv[1], "--no-init") == 0;
  if (!no_init) dtrain::init(argc, argv);
  try {
    dtrain::Distributor d({.num_processes = 2});
    if (no_init || (argc > 1 && std::strcmp(argv[1], "--one") == 0)) return d.run(one);
    return d.run(sleeper);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "driver: %s\n", e.what());
    return 3;
  }
}
