// The worker environment contract, compatible with torchrun (PyTorch 1.13).
//
// Every worker that dtrain starts gets these variables, so an unchanged PyTorch script
// (init_process_group("gloo") with env://) runs under `dtrain run`, and a dtrain C++ worker
// runs under torchrun. init_process_group() reads them back with WorkerEnv::from_environ().
#pragma once

#include <map>
#include <optional>
#include <string>

namespace dtrain {

struct WorkerEnv {
  int rank = 0;        // RANK: global rank
  int local_rank = 0;  // LOCAL_RANK: rank on this node
  int world_size = 1;  // WORLD_SIZE
  // Read from torchrun's names, else DeepSpeed's launcher's (LOCAL_SIZE, CROSS_RANK, CROSS_SIZE).
  int local_world_size = 1;               // LOCAL_WORLD_SIZE: workers on this node
  int group_rank = 0;                     // GROUP_RANK: this node's rank (the agent's)
  int group_world_size = 1;               // GROUP_WORLD_SIZE: number of nodes
  int role_rank = 0;                      // ROLE_RANK
  int role_world_size = 1;                // ROLE_WORLD_SIZE
  std::string role_name = "default";      // ROLE_NAME
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: where the job's store listens
  int master_port = 29500;                // MASTER_PORT
  int restart_count = 0;                  // TORCHELASTIC_RESTART_COUNT
  int max_restarts = 0;                   // TORCHELASTIC_MAX_RESTARTS
  std::string run_id = "none";            // TORCHELASTIC_RUN_ID
  // TORCHELASTIC_USE_AGENT_STORE: the agent hosts the store; workers are clients under
  // store_prefix() (exactly what PyTorch 1.13's env:// handler does in that mode).
  bool use_agent_store = true;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE: where a failing worker may write JSON

  // The variables to set, by name. OMP_NUM_THREADS is not included (the agent adds it
  // when the parent environment does not set it).
  std::map<std::string, std::string> to_variables() const;

  // Reads the contract from the current process's environment. Returns nullopt when RANK
  // or WORLD_SIZE is absent; throws UsageError when a variable is present but malformed
  // (the message names it and its value).
  static std::optional<WorkerEnv> from_environ();

  // "/worker/attempt_<restart_count>": the store prefix of this attempt's workers.
  std::string store_prefix() const;
};

}  // namespace dtrain
