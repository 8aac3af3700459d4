// A shared library of test_worker that reports where its constructor ran, so the launcher
// tests can tell how a worker started: under the fork server the constructor ran once, in
// the server (another pid); under spawn, in the worker itself.
// Its constructor also misbehaves on request, as a library loading in the server might:
//   PROBE_START_THREAD=1  start a thread that lives for the process (the fork server must
//                         then fall back to fork + exec)
//   PROBE_EXIT=CODE       exit with CODE before main (a program that fails while loading)
//   PROBE_SLEEP=S         sleep S seconds (a slow-loading program)
//   PROBE_SPAWN=COMMAND   run COMMAND with system() (a library that starts a program while
//                         loading: it inherits the fork server's environment)
//   PROBE_CUDA=LIB        dlopen LIB (a CUDA driver), and with PROBE_CUDA_INIT=1 call its cuInit
//                         (a library that initialises CUDA while loading)
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>  // a std::ios_base::Init of its own, as libtorch has: the last one
                     // destroyed flushes std::cout (see --unsynced-cout in test_worker)
#include <thread>

namespace {
pid_t g_constructor_pid = 0;
}

__attribute__((constructor)) static void probe_init() {
  g_constructor_pid = ::getpid();
  if (const char* s = std::getenv("PROBE_SLEEP")) {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(s)));
  }
  if (const char* e = std::getenv("PROBE_EXIT")) ::_exit(std::atoi(e));
  if (const char* c = std::getenv("PROBE_SPAWN")) {
    if (std::system(c) != 0) ::_exit(99);
  }
  if (const char* lib = std::getenv("PROBE_CUDA")) {
    void* driver = ::dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (driver == nullptr) ::_exit(98);
    if (const char* init = std::getenv("PROBE_CUDA_INIT"); init && init[0] == '1') {
      auto cu_init = reinterpret_cast<int (*)(unsigned)>(::dlsym(driver, "cuInit"));
      if (cu_init == nullptr || cu_init(0) != 0) ::_exit(97);
    }
  }
  if (const char* t = std::getenv("PROBE_START_THREAD"); t && t[0] == '1') {
    std::thread([] {
      while (true) std::this_thread::sleep_for(std::chrono::hours(1));
    }).detach();
  }
}

__attribute__((visibility("default"))) pid_t probe_constructor_pid() { return g_constructor_pid; }
