// A library test_worker dlopens (--dlopen): its destructor function must run at the worker's
// exit, whichever way the worker started (a fork server skips only what it had loaded).
#include <cstdio>

__attribute__((destructor)) static void dlopen_probe_fini() {
  std::printf("dlopened library destructor ran\n");
  std::fflush(stdout);
}
