// Engine "ray", its Ray side: the job's placement (bundles of a placement group) and the
// commands of dtrain's Ray driver (python/dtrain/ray.py), one-shot or kept between jobs
// (core/driver_service.h). The engine file (src/engines/ray.cpp) and `dtrain run
// --ray-address` use it. Libtorch-free (dtrain_core).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/ray.h"

namespace dtrain::ray {

// A job's placement group: `bundles` bundles of `per_bundle` processes, each bundle
// {"CPU": per_bundle x cpus, "GPU": per_bundle x gpus}, one dtrain agent per bundle.
struct Plan {
  int bundles = 1;
  int per_bundle = 1;
  double cpus = 1;  // per process
  double gpus = 0;  // per process
  std::string strategy = "PACK";
};
// num_processes split into bundles of processes_per_bundle; gpus_per_process < 0 means "as
// use_gpu says" (1 or 0). Throws UsageError naming the ClusterOptions field: num_processes < 1,
// processes_per_bundle < 1 or not dividing num_processes, negative or all-zero resources, an
// unknown strategy, use_gpu with 0 GPUs per process.
Plan plan(int num_processes, bool use_gpu, int processes_per_bundle, double cpus_per_process,
          double gpus_per_process, const std::string& strategy);

// How the driver reaches the cluster and runs a job.
struct Driver {
  std::string address;  // resolved (address())
  std::string python;   // resolved (python())
  std::chrono::seconds placement_timeout{60};
  std::chrono::milliseconds term_timeout{5000};
  std::string driver_host;  // the address the nodes reach the driver's log socket at ("": Ray's)
};

// `given`, else $RAY_ADDRESS; UsageError when both are empty.
std::string address(const std::string& given);
// The Python with ray: `given`, else $DTRAIN_RAY_PYTHON, else the python beside the `ray`
// command on PATH, else python3 on PATH; UsageError when none is executable.
std::string python(const std::string& given);

// The one-shot driver: `python -u ray.py --address ADDR <plan and driver flags> --`; the
// `dtrain run ...` command follows.
std::vector<std::string> direct_command(const Plan& plan, const Driver& d);
// The same job through this process's kept driver (started, or restarted when it stopped or
// its address or Python differ, waiting at most start_timeout): `python -u ray.py --client
// SOCKET <flags> --`. Throws Error/TimeoutError when the driver does not connect.
std::vector<std::string> kept_command(const Plan& plan, const Driver& d,
                                      std::chrono::seconds idle_timeout,
                                      std::chrono::seconds start_timeout);
// Processes of `cpus`/`gpus` each that the cluster holds in all and holds free now, asked
// of the kept driver (started if needed); nullopt when it cannot tell.
struct Slots {
  int total = 0;
  int free = 0;
};
std::optional<Slots> slots(const Driver& d, double cpus, double gpus,
                           std::chrono::seconds idle_timeout, std::chrono::seconds start_timeout);
// What an exit status of the Ray driver means when no worker reported a failure: the cluster
// cannot hold the job (76); nullopt for others.
std::optional<std::string> explain_exit(int exit_code);

// `dtrain run --ray-address ADDR [--ray-strategy S] [--ray-cpus C] [--ray-gpus G]
// [--ray-placement-timeout S] [--ray-python PY] --nnodes N --nproc-per-node P ... PROGRAM`:
// when argv has --ray-address (before PROGRAM's arguments), execs the one-shot driver with
// the rest as the agents' command (never returns, or throws UsageError); otherwise returns.
void exec_cli_if_requested(int argc, char** argv);

}  // namespace dtrain::ray
