// DistributorOptions: what a Distributor job is (dtrain/distributor.h runs it). Libtorch-free,
// so the launcher's side of the cluster engines (src/engines/) reads the same options.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "dtrain/cluster.h"

namespace dtrain {

struct DistributorOptions {
  int num_processes = 1;   // workers; must be >= 1. With use_gpu, at most the GPUs present.
  bool local_mode = true;  // true: this machine. false: the cluster engine in `cluster`.
  bool use_gpu = false;    // one CUDA device per worker (CUDA_VISIBLE_DEVICES, LOCAL_RANK).
  // Longest a run may take; then its workers are stopped and run() throws TimeoutError.
  // Default: 24 hours.
  std::chrono::milliseconds timeout{std::chrono::hours(24)};
  std::string
      log_dir;  // full per-rank logs under LOG_DIR/<run id>_<random>/ (dtrain run --log-dir)
  int max_restarts = 0;                    // restarts of the whole worker group after a failure
  std::map<std::string, std::string> env;  // extra environment for every worker
  // SIGTERM -> SIGKILL grace when workers are stopped. Default: 5 s.
  std::chrono::milliseconds term_timeout{std::chrono::seconds(5)};
  // Workers' malloc uses transparent huge pages (dtrain run --malloc-hugepages): faster
  // libtorch start-up and large tensors where page faults are costly (VMs). Default: true.
  bool malloc_hugepages = true;
  // The `dtrain` launcher to use. Default: $DTRAIN_LAUNCHER, else the one built or installed
  // with this library, else `dtrain` on PATH.
  std::string launcher;
  ClusterOptions cluster;  // used when local_mode is false
};

namespace detail {

// ClusterOptions::{min_nodes, max_nodes} resolved for an engine (src/engines/elastic_plan.cpp).
struct ElasticPlan {
  bool elastic = false;  // min_nodes < max_nodes
  int min_nodes = 0;
  int max_nodes = 0;
  // `dtrain run` flags for the launcher (ssh: the local one that starts the agents; slurm:
  // each node's agent): --nnodes MIN:MAX [--rdzv-backend c10d] --rdzv-conf last_call_timeout=S
  // [,heartbeat_timeout=S].
  std::vector<std::string> run_args;
  std::string srun_nodes;  // slurm: srun's -N value (MAX)
};
// `node_count`: the nodes the engine has without elasticity (ssh: hosts; slurm: `nodes`).
// Throws UsageError, naming the field and what to change: a negative count, min_nodes > max_nodes,
// max_nodes without min_nodes, either in local mode, an engine that cannot grow or shrink (mpi,
// spark), ssh's max_nodes other than the number of hosts, slurm's `nodes` other than max_nodes.
ElasticPlan plan_elastic(const DistributorOptions& options, int node_count);

}  // namespace detail
}  // namespace dtrain
