// A worker for the cluster tests: joins the job's Gloo group through init_process_group()
// (the launcher's contract, or what Slurm / Open MPI / MPICH set), all-reduces rank + 1, and
// prints one line that the tests parse:
//   cluster_worker rank=R world=W local_rank=L local_world=LW host=H master=ADDR:PORT sum=S
//   expected=E
// Flags, in order:
//   --kill-self-on-rank R   after the all-reduce, rank R SIGKILLs itself
//   --sleep S               then every rank sleeps S seconds (so a failure elsewhere stops it)
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "dtrain/engine_env.h"
#include "dtrain/env.h"
#include "dtrain/process_group.h"

int main(int argc, char** argv) {
  auto pg = dtrain::init_process_group();
  auto env = dtrain::WorkerEnv::from_environ();
  if (!env) env = dtrain::engine_worker_env();
  std::vector<at::Tensor> t{torch::full({1}, static_cast<double>(pg->rank() + 1), torch::kFloat64)};
  pg->c10d()->allreduce(t)->wait();
  const int n = pg->world_size();
  const double expected = n * (n + 1) / 2.0;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::printf(
      "cluster_worker rank=%d world=%d local_rank=%d local_world=%d host=%s master=%s:%d sum=%g "
      "expected=%g\n",
      pg->rank(), n, env->local_rank, env->local_world_size, host, env->master_addr.c_str(),
      env->master_port, t[0].item<double>(), expected);
  std::fflush(stdout);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--kill-self-on-rank" && i + 1 < argc) {
      if (std::atoi(argv[++i]) == pg->rank()) {
        std::fprintf(stderr, "cluster_worker rank %d on %s: killing myself with SIGKILL\n",
                     pg->rank(), host);
        std::fflush(stderr);
        ::kill(::getpid(), SIGKILL);
      }
    } else if (a == "--sleep" && i + 1 < argc) {
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(argv[++i])));
    }
  }
  pg->barrier();
  return t[0].item<double>() == expected ? 0 : 1;
}
