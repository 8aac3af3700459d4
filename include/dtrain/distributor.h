// Distributor: run a C++ training function, or a program, on N processes and get its result
// (TorchDistributor for C++).
//
//     int main(int argc, char** argv) {
//       dtrain::init(argc, argv);   // in a worker: runs the requested function, then exits
//       dtrain::Distributor d({.num_processes = 2});
//       double acc = d.run(train, 1e-3, true);                       // function mode
//       d.run("/path/to/train_binary", {"--lr=0.001"});              // program mode
//     }
//
// How it works. run() starts the `dtrain` launcher (the same agent as `dtrain run`: rank
// prefixed logs, teardown on the first failure, no orphans) with this very binary as the
// worker program. Each worker's dtrain::init() sees the task in its environment, connects to
// a small store the driver hosts for this call, reads the arguments, calls the function and
// sends its result back; the driver decodes rank 0's (or, with run_all, every rank's).
// The function is found in the worker by its offset in the loaded binary, checked against
// the binary's build id: no registration, no fork of a process running libtorch threads.
//
// Rules for the function: a plain function or a lambda without captures (captures cannot
// cross processes: pass them as arguments); its parameters and result must be encodable
// (dtrain/codec.h; checked at compile time). It runs with the worker environment of
// `dtrain run` (RANK, WORLD_SIZE, MASTER_ADDR, ...), so dtrain::init_process_group() just
// works; a default group it leaves behind is destroyed after it returns.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/codec.h"
#include "dtrain/error.h"

namespace dtrain {

// Call first thing in main(). In a process the Distributor started as a worker it runs the
// requested function and exits (it never returns); anywhere else it only records argv and
// returns at once.
void init(int argc, char** argv);

// Where a cluster job (local_mode = false) runs: the engine the cluster already has.
struct ClusterOptions {
  // "ssh": one agent per host of a host file (or list) over ssh, as `dtrain run --hostfile`;
  // "slurm": `srun -N nodes --ntasks-per-node=1 dtrain run ...` (inside or outside an
  // allocation: srun makes one when there is none).
  std::string engine;
  // "mpi": `mpirun -np num_processes ...` (Open MPI or MPICH), no dtrain agent on the nodes.
  // ssh: a host file (`host slots=N` lines) or a list "host1:2,host2:2". Each host runs its
  // slots when they add up to num_processes, else num_processes / hosts each.
  std::string hostfile;
  std::string hosts;
  int ssh_port = 0;                   // 0: ssh's default
  std::string ssh_identity;           // ssh -i
  std::vector<std::string> ssh_args;  // extra ssh arguments (-F cfg, -o K=V, ...)
  std::string remote_dtrain;          // dtrain on the hosts. Default: the launcher's path.
  // slurm: nodes (num_processes must divide evenly), partition, extra srun arguments.
  int nodes = 1;
  std::string partition;
  std::vector<std::string> srun_args;
  // mpi: the MPI launcher (Open MPI's mpirun, MPICH's mpiexec.hydra, ...) and its arguments
  // before the program (hosts, MCA options): `MPI_LAUNCHER -np num_processes MPI_ARGS...`.
  // Workers take their ranks from the MPI launcher's variables (dtrain/engine_env.h).
  std::string mpi_launcher = "mpirun";
  std::vector<std::string> mpi_args;
  // spark: the master URL ("spark://HOST:7077"); one barrier task per
  // spark_processes_per_task workers (0: as TorchDistributor: 1, or with use_gpu the task's
  // spark.task.resource.gpu.amount), each running a dtrain agent (dtrain/spark.h). Extra
  // spark-submit settings as "K=V"; spark-submit's path (default: $SPARK_HOME/bin, PATH);
  // how long to wait for enough free task slots before failing.
  std::string master;
  std::vector<std::string> spark_conf;
  int spark_processes_per_task = 0;
  std::string spark_submit;
  std::chrono::seconds spark_slot_timeout{60};
  // spark: keep the Spark application between run() calls, as a notebook keeps its
  // SparkSession (dtrain/spark.h): the first run() starts it (one spark-submit), later ones
  // with the same master and settings run one barrier stage in it. It stops when the program
  // exits, after spark_app_idle_timeout without a job, or on dtrain::spark::stop_app().
  // false: every run() is a Spark application of its own (spark-submit, then its end).
  bool spark_keep_app = true;
  std::chrono::seconds spark_app_idle_timeout{600};
  // The address the nodes reach this driver at (its store for arguments and results).
  // Default: ssh - the local address that routes to the first host; spark with a loopback
  // master - 127.0.0.1; slurm, mpi and spark - this host's name, resolved (an error if that is a
  // loopback address: set it).
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
  //   mpi, spark: not elastic (a UsageError says so).
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
};

struct DistributorOptions {
  int num_processes = 1;   // workers; must be >= 1. With use_gpu, at most the GPUs present.
  bool local_mode = true;  // true: this machine. false: the cluster engine in `cluster`.
  bool use_gpu = false;    // one CUDA device per worker (CUDA_VISIBLE_DEVICES, LOCAL_RANK).
  // Longest a run may take; then its workers are stopped and run() throws TimeoutError.
  // Default: 24 hours.
  std::chrono::milliseconds timeout{std::chrono::hours(24)};
  std::string log_dir;   // full per-rank logs under LOG_DIR/<run id>/ (dtrain run --log-dir)
  int max_restarts = 0;  // restarts of the whole worker group after a failure
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

// A worker failed: it threw, exited non-zero, or died of a signal. what() says which rank,
// what happened, and ends with the tail of that rank's stderr.
class WorkerError : public Error {
 public:
  struct Details {
    int rank = -1;  // -1: not one worker (the launcher itself failed)
    int local_rank = -1;
    std::string host;
    int exit_code = 1;           // 128 + signal for a signal
    int signal = 0;              // > 0: the worker died of this signal
    std::string exception_type;  // function mode, when the worker threw
    std::string exception_message;
    std::vector<std::string> stderr_tail;
  };
  explicit WorkerError(Details details);
  const Details& details() const { return d_; }
  int rank() const { return d_.rank; }
  int exit_code() const { return d_.exit_code; }
  int signal() const { return d_.signal; }
  const std::string& exception_type() const { return d_.exception_type; }
  const std::string& exception_message() const { return d_.exception_message; }
  const std::vector<std::string>& stderr_tail() const { return d_.stderr_tail; }

 private:
  Details d_;
};

namespace detail {

// What a worker needs to find a function of this binary: the loaded object it lives in
// (by name; the main program is ""), its offset there, and that object's build id.
struct CodeRef {
  bool main_program = true;
  std::string object;
  std::uintptr_t offset = 0;
  std::string build_id;
};
CodeRef locate_code(const void* address);

// Runs in the worker: decodes the arguments, calls the function, encodes its result.
using Trampoline = void (*)(void* fn, Decoder& args, Encoder& result);

template <class T>
concept PlainFunction = std::is_pointer_v<T> && std::is_function_v<std::remove_pointer_t<T>>;

template <class F, class = void>
struct Decays {
  using type = void;
};
template <class F>
struct Decays<F, std::void_t<decltype(+std::declval<F>())>> {
  using type = decltype(+std::declval<F>());
};

template <class R, class... P>
void trampoline(void* fn, Decoder& in, Encoder& out) {
  using Fn = R (*)(P...);
  // Braced initialisation decodes the arguments left to right.
  std::tuple<std::decay_t<P>...> args{in.get<std::decay_t<P>>()...};
  auto call = [&](auto&... a) -> decltype(auto) {
    return reinterpret_cast<Fn>(fn)(std::forward<P>(a)...);
  };
  if constexpr (std::is_void_v<R>) {
    std::apply(call, args);
  } else {
    out.put<std::decay_t<R>>(std::apply(call, args));
  }
}

// The resolved plan for a run: processes and per-job device list (tested with injected
// devices; the Distributor passes the CUDA devices it sees).
struct DevicePlan {
  int num_processes = 1;
  std::string cuda_visible_devices;  // empty: leave CUDA_VISIBLE_DEVICES alone
  std::string warning;               // non-empty: print once
};
// `devices` are the CUDA devices visible here (as CUDA_VISIBLE_DEVICES names them).
// Throws UsageError: num_processes <= 0; use_gpu with no device.
DevicePlan plan_devices(int num_processes, bool local_mode, bool use_gpu,
                        const std::vector<std::string>& devices);

// ClusterOptions::{min_nodes, max_nodes} resolved for an engine (src/distributor/elastic_plan.cpp).
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

class Distributor {
 public:
  // Validates the options (UsageError with what to change); with use_gpu in local mode and
  // fewer GPUs than processes, lowers num_processes to the GPUs present with one warning.
  explicit Distributor(DistributorOptions options = {});

  const DistributorOptions& options() const { return options_; }
  int num_processes() const { return options_.num_processes; }

  // Function mode: runs fn(args...) on every worker; returns rank 0's result.
  // Throws WorkerError when a worker fails (the others are stopped), TimeoutError after
  // options().timeout, UsageError for a misuse (init() not called, nested run in a worker).
  template <class F, class... Args>
  requires(!std::is_convertible_v<F, std::string>) auto run(F&& fn, Args&&... args) {
    return call<false>(std::forward<F>(fn), std::forward<Args>(args)...);
  }

  // Function mode: every rank's result, by rank (void functions: returns nothing).
  template <class F, class... Args>
  requires(!std::is_convertible_v<F, std::string>) auto run_all(F&& fn, Args&&... args) {
    return call<true>(std::forward<F>(fn), std::forward<Args>(args)...);
  }

  // Program mode: runs `program args...` on every worker, exactly as `dtrain run` would (a
  // .py through python3). Returns when all succeeded; throws WorkerError with the failing
  // rank, its exit code or signal and its stderr tail otherwise.
  void run(const std::string& program, const std::vector<std::string>& args = {});

  // The address the workers of a cluster job (local_mode = false) reach this driver at:
  // ClusterOptions::driver_addr, else as documented there. "127.0.0.1" in local mode.
  // UsageError when no reachable address can be found (the message says to set it).
  std::string driver_address() const;

 private:
  template <bool All, class F, class... Args>
  auto call(F&& fn, Args&&... args) {
    using Fp = typename detail::Decays<F>::type;
    static_assert(detail::PlainFunction<Fp>,
                  "dtrain::Distributor::run: the training function must be a plain function "
                  "or a lambda without captures (captures cannot cross process boundaries: "
                  "pass those values as arguments)");
    if constexpr (detail::PlainFunction<Fp>) {
      return call_with<All>(+fn, std::forward<Args>(args)...);
    }
  }

  template <bool All, class R, class... P, class... Args>
  auto call_with(R (*fn)(P...), Args&&... args) {
    static_assert(sizeof...(P) == sizeof...(Args),
                  "dtrain::Distributor::run: give exactly as many arguments as the function "
                  "takes");
    if constexpr (sizeof...(P) == sizeof...(Args)) {
      static_assert((std::is_convertible_v<Args&&, std::decay_t<P>> && ...),
                    "dtrain::Distributor::run: an argument does not convert to the type of the "
                    "function's parameter in that position");
      static_assert((Encodable<std::decay_t<P>> && ...),
                    "dtrain::Distributor::run: a parameter type of the function is not "
                    "encodable (see dtrain/codec.h for what is)");
      static_assert(std::is_void_v<R> || Encodable<std::decay_t<R>>,
                    "dtrain::Distributor::run: the function's return type is not encodable "
                    "(see dtrain/codec.h for what is)");
      Encoder encoded;
      (encoded.put<std::decay_t<P>>(static_cast<std::decay_t<P>>(std::forward<Args>(args))), ...);
      auto results = run_function(reinterpret_cast<const void*>(fn),
                                  reinterpret_cast<const void*>(&detail::trampoline<R, P...>),
                                  encoded.take(), All);
      if constexpr (std::is_void_v<R>) {
        return;
      } else if constexpr (All) {
        std::vector<std::decay_t<R>> out;
        out.reserve(results.size());
        for (auto& r : results) out.push_back(decode<std::decay_t<R>>(r));
        return out;
      } else {
        return decode<std::decay_t<R>>(results.at(0));
      }
    }
  }

  // Runs the job; returns the encoded results (rank 0's, or every rank's when all_ranks).
  std::vector<std::string> run_function(const void* fn, const void* trampoline, std::string args,
                                        bool all_ranks);

  void validate_cluster();

  DistributorOptions options_;
  std::string cuda_visible_devices_;
  int nproc_per_node_ = 0;          // 0: each host's slots (ssh host file)
  std::vector<std::string> hosts_;  // ssh: the hosts, node 0 first
  detail::ElasticPlan elastic_;     // ClusterOptions::{min_nodes, max_nodes} resolved
};

}  // namespace dtrain
