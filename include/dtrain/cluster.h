// ClusterOptions: where a Distributor job with local_mode = false runs - the engine the cluster
// already has, and that engine's settings.
//
//     dtrain::Distributor d({.num_processes = 4, .local_mode = false,
//                            .cluster = {.engine = "ssh", .ssh = {.hosts = "n1:2,n2:2"}}});
//
// Engines (src/engines/, one file each): "ssh" (one dtrain agent per host of a host file or
// list, started over ssh), "slurm" (srun, one agent per node), "mpi" (the MPI launcher starts
// the workers; no agent), "spark" (one agent per barrier task of a Spark application), "ray"
// (one agent per bundle of a Ray placement group).
//
// Each engine's settings are its own struct (ssh, slurm, mpi, spark, ray below). Before those
// structs existed they were flat fields of ClusterOptions (hostfile, ssh_port, nodes,
// mpi_launcher, master, spark_conf, ...); those fields are still read, so code written
// against them compiles and behaves as before. Give a setting once: the struct's field or
// the flat one (both given with different values is a UsageError naming the two).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace dtrain {

// Engine "ssh": one agent per host, as `dtrain run --hostfile`.
struct SshOptions {
  // A host file (`host slots=N` lines) or a list "host1:2,host2:2" (exactly one of them).
  // Each host runs its slots when they add up to num_processes, else num_processes / hosts.
  std::string hostfile;
  std::string hosts;
  int port = 0;                   // ssh -p; 0: ssh's default
  std::string identity;           // ssh -i
  std::vector<std::string> args;  // extra ssh arguments (-F cfg, -o K=V, ...)
  std::string remote_dtrain;      // dtrain on the hosts. Default: the launcher's path.
};

// Engine "slurm": `srun -N nodes --ntasks-per-node=1 dtrain run ...` (inside or outside an
// allocation: srun makes one when there is none).
struct SlurmOptions {
  int nodes = 1;  // num_processes must divide evenly
  std::string partition;
  std::vector<std::string> srun_args;  // extra srun arguments
};

// Engine "mpi": `launcher -np num_processes args... PROGRAM` (Open MPI's mpirun, MPICH's
// mpiexec.hydra, ...), no dtrain agent on the nodes: workers take their ranks from the MPI
// launcher's variables (dtrain/engine_env.h).
struct MpiOptions {
  std::string launcher = "mpirun";
  std::vector<std::string> args;  // before the program: hosts, MCA options, ...
};

// Engine "spark": one barrier task per processes_per_task workers, each running a dtrain agent
// (dtrain/spark.h).
struct SparkOptions {
  std::string master;  // "spark://HOST:7077"
  // Extra spark-submit settings as "K=V".
  std::vector<std::string> conf;
  // Workers per task (0: as TorchDistributor: 1, or with use_gpu the task's
  // spark.task.resource.gpu.amount).
  int processes_per_task = 0;
  std::string submit;  // spark-submit's path. Default: $SPARK_HOME/bin, PATH
  // How long to wait for enough free task slots before failing.
  std::chrono::seconds slot_timeout{60};
  // Keep the Spark application between run() calls, as a notebook keeps its SparkSession
  // (dtrain/spark.h): the first run() starts it (one spark-submit), later ones with the same
  // master and settings run one barrier stage in it. It stops when the program exits, after
  // app_idle_timeout without a job, or on dtrain::spark::stop_app(). false: every run() is a
  // Spark application of its own (spark-submit, then its end).
  bool keep_app = true;
  std::chrono::seconds app_idle_timeout{600};
};

// Engine "ray": a placement group of num_processes / processes_per_bundle bundles on a Ray
// cluster, one dtrain agent per bundle, run as a Ray task holding the bundle's resources, by
// dtrain's Ray driver (python/dtrain/ray.py, Ray's Python API; dtrain/ray.h).
struct RayOptions {
  // The cluster: the head's GCS address "HOST:6379" (this machine a Ray node),
  // "ray://HOST:10001" (Ray Client, from anywhere; pip's ray[client]), or "auto" (the Ray
  // node running on this machine). Default: $RAY_ADDRESS; neither is a UsageError.
  std::string address;
  // Workers per bundle (one agent each, on one node); must divide num_processes. Default 1:
  // Ray Train's one bundle per worker.
  int processes_per_bundle = 1;
  // Ray's placement strategy: "PACK", "SPREAD", "STRICT_PACK" or "STRICT_SPREAD" (one bundle
  // per node: with processes_per_bundle = processes per node, one agent per node).
  std::string strategy = "PACK";
  // Resources each process asks for; a bundle asks for processes_per_bundle times these.
  // num_gpus_per_process < 0: 1 with use_gpu, else 0. Each worker gets OMP_NUM_THREADS =
  // num_cpus_per_process (at least 1) unless `env` sets it.
  double num_cpus_per_process = 1;
  double num_gpus_per_process = -1;
  // How long to wait for the placement group while other jobs hold what it needs; then the
  // job fails (WorkerError) saying what is free. A job the cluster can never hold fails at once.
  std::chrono::seconds placement_timeout{60};
  // The Python with ray. Default: $DTRAIN_RAY_PYTHON, else the `python` beside `ray` on PATH,
  // else python3 on PATH.
  std::string python;
  // Keep one driver connected to the cluster between run() calls, as a notebook keeps its
  // ray.init() (dtrain/ray.h): the first run() connects it, later ones are jobs in it, several
  // at once. It disconnects when this program exits, after driver_idle_timeout without a job,
  // or on dtrain::ray::stop_kept_driver(). false: every run() connects a driver of its own.
  bool keep_driver = true;
  std::chrono::seconds driver_idle_timeout{600};
};

struct ClusterOptions {
  // The engine: "ssh", "slurm", "mpi", "spark" or "ray".
  std::string engine;

  // ---- each engine's settings under their older, flat names (still read; prefer the
  // structs at the end: ssh.hostfile, slurm.nodes, mpi.launcher, spark.master, ...) ----
  std::string hostfile;                              // ssh.hostfile
  std::string hosts;                                 // ssh.hosts
  int ssh_port = 0;                                  // ssh.port
  std::string ssh_identity;                          // ssh.identity
  std::vector<std::string> ssh_args;                 // ssh.args
  std::string remote_dtrain;                         // ssh.remote_dtrain
  int nodes = 1;                                     // slurm.nodes
  std::string partition;                             // slurm.partition
  std::vector<std::string> srun_args;                // slurm.srun_args
  std::string mpi_launcher = "mpirun";               // mpi.launcher
  std::vector<std::string> mpi_args;                 // mpi.args
  std::string master;                                // spark.master
  std::vector<std::string> spark_conf;               // spark.conf
  int spark_processes_per_task = 0;                  // spark.processes_per_task
  std::string spark_submit;                          // spark.submit
  std::chrono::seconds spark_slot_timeout{60};       // spark.slot_timeout
  bool spark_keep_app = true;                        // spark.keep_app
  std::chrono::seconds spark_app_idle_timeout{600};  // spark.app_idle_timeout

  // ---- every engine ----
  // The address the nodes reach this driver at (its store for arguments and results).
  // Default: ssh - the local address that routes to the first host; spark with a loopback
  // master - 127.0.0.1; ray - the local address that routes to the Ray head (this host's name,
  // resolved, with "auto"); slurm, mpi and spark - this host's name, resolved (an error if that
  // is a loopback address: set it).
  std::string driver_addr;
  std::string ifname;  // Gloo's network interface on the nodes (dtrain run --ifname)
  // Elastic membership (`dtrain run --nnodes MIN:MAX`, c10d rendezvous on node 0): the job
  // starts once min_nodes agents are in (after the last call, or as soon as max_nodes are),
  // and when a node is lost the survivors restart at the new world size while at least
  // min_nodes are left (each such restart counts against max_restarts; dtrain/elastic_state.h
  // resumes the training). 0/0 (default) or min_nodes == max_nodes: a fixed-size job.
  //   ssh:   one agent per host; max_nodes is the number of hosts (0: that number). Unreachable
  //          hosts are left out at the start while the first host and min_nodes answer.
  //   slurm: `srun -N MAX --no-kill` (a lost node does not end the step); max_nodes (0:
  //          `nodes`) replaces `nodes`, num_processes is max_nodes x processes per node.
  //   mpi, spark, ray: not elastic (a UsageError says so).
  // num_processes is the largest world size (every node in); run_all() returns the ranks of
  // the world size the job finished at.
  int min_nodes = 0;
  int max_nodes = 0;
  // How long a rendezvous round waits for more nodes once min_nodes are in
  // (--rdzv-conf last_call_timeout). Default: 30 s, torchrun's.
  std::chrono::milliseconds last_call{std::chrono::seconds(30)};
  // How long an agent may go without a heartbeat before the others count its node as lost
  // and restart without it (--rdzv-conf heartbeat_timeout). 0 (default): the agents' own,
  // max(10 s, 50 monitor ticks). Shorter finds a dead node sooner; too short for the network
  // drops live nodes.
  std::chrono::milliseconds heartbeat_timeout{0};

  // ---- each engine's own settings ----
  SshOptions ssh;
  SlurmOptions slurm;
  MpiOptions mpi;
  SparkOptions spark;
  RayOptions ray;
};

}  // namespace dtrain
