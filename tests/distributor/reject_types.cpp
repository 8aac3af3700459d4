// Compiled by a test that expects the compiler to refuse it with dtrain's own message
// (tests/distributor.cmake): REJECT_CASE 1 passes an unencodable argument, 2 a lambda with
// captures.
#include "dtrain/distributor.h"

struct Opaque {
  int x;
};

int takes_opaque(Opaque o) { return o.x; }

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  dtrain::Distributor d({.num_processes = 2});
#if REJECT_CASE == 1
  return d.run(takes_opaque, Opaque{1});
#elif REJECT_CASE == 2
  int captured = 3;
  return d.run([captured] { return captured; });
#endif
}
