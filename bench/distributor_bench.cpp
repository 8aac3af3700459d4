// Round trip of a trivial function through the Distributor, against `dtrain run` of the same
// work (join a Gloo group, barrier, leave) in the same binary, interleaved, on N processes.
//   distributor_bench [--nproc N] [--repeats R]
// Prints each timing, the medians and the ratio Distributor / dtrain run.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dtrain/dtrain.h"

namespace {

int trivial() {
  auto pg = dtrain::init_process_group();
  pg->barrier();
  return pg->rank();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// `dtrain run --nproc-per-node N --malloc-hugepages SELF --as-program`, timed to its exit.
double time_dtrain_run(const std::string& launcher, const std::string& self, int nproc) {
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string n = std::to_string(nproc);
    ::execl(launcher.c_str(), launcher.c_str(), "run", "--nproc-per-node", n.c_str(),
            "--malloc-hugepages", self.c_str(), "--as-program", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "dtrain run failed (status %d)\n", status);
    std::exit(1);
  }
  return seconds_since(t0);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  int nproc = 2, repeats = 7;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--as-program") {
      trivial();
      return 0;
    }
    if (a == "--nproc" && i + 1 < argc) nproc = std::atoi(argv[++i]);
    if (a == "--repeats" && i + 1 < argc) repeats = std::atoi(argv[++i]);
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string launcher = DTRAIN_LAUNCHER_BIN;
  dtrain::Distributor d({.num_processes = nproc});
  // Warm the page cache for both paths.
  d.run(trivial);
  time_dtrain_run(launcher, self, nproc);
  std::vector<double> dist, run;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    int rank = d.run(trivial);
    dist.push_back(seconds_since(t0));
    if (rank != 0) return 1;
    run.push_back(time_dtrain_run(launcher, self, nproc));
    std::printf("repeat %d: distributor %.3f s, dtrain run %.3f s\n", r, dist.back(), run.back());
  }
  double md = median(dist), mr = median(run);
  std::printf(
      "{\"nproc\": %d, \"repeats\": %d, \"distributor_s\": %.3f, \"dtrain_run_s\": %.3f, "
      "\"ratio\": %.3f}\n",
      nproc, repeats, md, mr, md / mr);
  return 0;
}
