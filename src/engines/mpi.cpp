// Engine "mpi": the MPI launcher (Open MPI's mpirun, MPICH's mpiexec.hydra) starts the workers
// itself, `LAUNCHER -np N [pass the task variable] ARGS... PROGRAM`; no dtrain agent runs on the
// nodes, so ranks come from the MPI launcher's variables (task_from_env) and the launcher's exit
// code is the job's.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <unistd.h>

#include <cstdio>

#include "core/hostfile.h"
#include "core/paths.h"
#include "engines/common.h"
#include "engines/engine.h"

namespace dtrain::engines {
namespace {

MpiOptions options_of(const ClusterOptions& c) {
  const MpiOptions d;
  MpiOptions m;
  m.launcher = either(c.mpi.launcher, c.mpi_launcher, d.launcher, "mpi.launcher", "mpi_launcher");
  m.args = either(c.mpi.args, c.mpi_args, d.args, "mpi.args", "mpi_args");
  return m;
}

// The first address of an Open MPI URI: "1186660352.0;tcp://192.0.2.2,10.0.0.1:46941;tcp6://..."
std::string first_uri_address(const std::string& uri) {
  auto p = uri.find("tcp://");
  if (p == std::string::npos) return "";
  p += 6;
  auto end = uri.find_first_of(",:;", p);
  return uri.substr(p, end == std::string::npos ? std::string::npos : end - p);
}

bool is_local_address(const std::string& addr) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return true;  // cannot tell: do not block the job
  bool found = false;
  for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof buf) && addr == buf) found = true;
  }
  ::freeifaddrs(list);
  return found;
}

std::string this_host() {
  std::string h = this_host_name();
  return h.empty() ? "this host" : h;
}

std::optional<EngineTask> openmpi_task(const EnvLookup& env) {
  if (!get(env, "OMPI_COMM_WORLD_RANK")) return std::nullopt;
  const char* e = "Open MPI's mpirun";
  EngineTask t;
  t.engine = "openmpi";
  t.rank = require_int(env, "OMPI_COMM_WORLD_RANK", e);
  t.world_size = require_int(env, "OMPI_COMM_WORLD_SIZE", e);
  t.local_rank = get_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", e).value_or(t.rank);
  t.local_world_size = get_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", e).value_or(t.world_size);
  check_rank("Open MPI", t.rank, t.world_size, t.local_rank, t.local_world_size);
  t.nnodes = get_int(env, "OMPI_MCA_orte_num_nodes", e)
                 .value_or(t.local_world_size == t.world_size ? 1 : 0);
  t.job_id = get(env, "OMPI_MCA_ess_base_jobid").value_or(get(env, "PMIX_NAMESPACE").value_or(""));
  t.master_port = derived_port("openmpi-" + t.job_id);
  const bool one_node = t.local_world_size == t.world_size;
  std::string hnp = first_uri_address(get(env, "OMPI_MCA_orte_hnp_uri").value_or(""));
  t.master_addr = one_node ? "127.0.0.1" : hnp;
  master_from_env(env, t);
  if (t.master_addr.empty()) {
    throw UsageError(
        "Open MPI started " + std::to_string(t.world_size) +
        " ranks on several nodes and dtrain cannot tell where rank 0 runs: set MASTER_ADDR to "
        "rank 0's host for every rank (mpirun -x MASTER_ADDR=host0 ...)");
  }
  // Without MASTER_ADDR, rank 0 must run on mpirun's host (Open MPI's default mapping when
  // mpirun runs on the first host of its host list); say so rather than time out.
  if (!one_node && t.rank == 0 && t.master_addr == hnp && !get(env, "MASTER_ADDR") &&
      !is_local_address(hnp)) {
    throw UsageError("Open MPI: rank 0 runs on " + this_host() + ", but mpirun runs on " + hnp +
                     ", which dtrain takes as the master address; start mpirun on rank 0's host, "
                     "or set MASTER_ADDR to rank 0's host (mpirun -x MASTER_ADDR=...)");
  }
  return t;
}

std::optional<EngineTask> mpich_task(const EnvLookup& env) {
  if (!get(env, "PMI_RANK")) return std::nullopt;
  const char* e = "MPICH's mpiexec";
  EngineTask t;
  t.engine = "mpich";
  t.rank = require_int(env, "PMI_RANK", e);
  t.world_size = require_int(env, "PMI_SIZE", e);
  t.local_rank = get_int(env, "MPI_LOCALRANKID", e).value_or(t.rank);
  t.local_world_size = get_int(env, "MPI_LOCALNRANKS", e).value_or(t.world_size);
  check_rank("MPICH", t.rank, t.world_size, t.local_rank, t.local_world_size);
  const bool one_node = t.local_world_size == t.world_size;
  t.nnodes = one_node ? 1 : 0;
  // Hydra exports no job id. On one node every rank's parent is the same hydra_pmi_proxy,
  // so its pid names the job; across nodes MASTER_PORT (or 29500) must be shared.
  t.job_id = one_node ? "pmi-proxy-" + std::to_string(::getppid()) : "";
  t.master_port = one_node ? derived_port("mpich-" + t.job_id) : 29500;
  t.master_addr = one_node ? "127.0.0.1" : "";
  master_from_env(env, t);
  if (t.master_addr.empty()) {
    throw UsageError("MPICH started " + std::to_string(t.world_size) +
                     " ranks on several nodes, and Hydra does not say where rank 0 runs: set "
                     "MASTER_ADDR (and MASTER_PORT) for every rank (mpiexec -genv MASTER_ADDR "
                     "host0 -genv MASTER_PORT 29500 ...)");
  }
  return t;
}

class Mpi final : public Engine {
 public:
  std::string name() const override { return "mpi"; }
  bool runs_agents() const override { return false; }
  std::string why_not_elastic() const override {
    return "the MPI launcher starts a fixed set of ranks once and no dtrain agent re-forms the "
           "group";
  }

  // The MPI launcher starts the workers itself: no dtrain agent restarts them or keeps logs.
  Placement place(const DistributorOptions& o) const override {
    Placement p;
    p.nproc_per_node = o.num_processes;
    p.elastic = detail::plan_elastic(o, 1);  // throws when min/max nodes are set
    if (options_of(o.cluster).launcher.empty()) {
      throw UsageError(
          "ClusterOptions::mpi_launcher is empty; give the MPI launcher (mpirun, "
          "mpiexec.hydra, ...)");
    }
    if (o.max_restarts > 0) {
      throw UsageError("DistributorOptions::max_restarts is " + std::to_string(o.max_restarts) +
                       ", but engine \"mpi\" has no dtrain agent to restart workers (the MPI "
                       "launcher starts them once); use engine \"ssh\" or \"slurm\", or 0");
    }
    if (!o.log_dir.empty()) {
      throw UsageError(
          "DistributorOptions::log_dir needs a dtrain agent, which engine \"mpi\" "
          "does not run; use the MPI launcher's own option in ClusterOptions::mpi_args "
          "(Open MPI: --output-filename DIR), or engine \"ssh\" or \"slurm\"");
    }
    return p;
  }

  // Open MPI passes a variable to remote ranks only with -x; MPICH's Hydra passes the whole
  // environment.
  Command workers_command(const JobRequest& r) const override {
    const DistributorOptions& o = r.options;
    const MpiOptions m = options_of(o.cluster);
    std::string launcher = m.launcher;
    if (launcher.find('/') == std::string::npos) {
      launcher = find_in_path(launcher);
      if (launcher.empty()) {
        throw UsageError("ClusterOptions::mpi_launcher '" + m.launcher +
                         "' is not on PATH (Debian: apt-get install openmpi-bin, or mpich)");
      }
    } else if (!is_executable_file(launcher)) {
      throw UsageError("ClusterOptions::mpi_launcher '" + launcher + "' is not an executable file");
    }
    std::string version;
    // Bounded as every wait: a launcher that does not answer within 20 s is taken as not
    // Open MPI's.
    if (FILE* p =
            ::popen(("timeout 20 " + shell_quote(launcher) + " --version 2>&1").c_str(), "r")) {
      char buf[512];
      while (std::fgets(buf, sizeof buf, p)) version += buf;
      ::pclose(p);
    }
    const bool open_mpi = version.find("Open MPI") != std::string::npos ||
                          version.find("OpenRTE") != std::string::npos;
    Command c;
    c.argv = {launcher, "-np", std::to_string(o.num_processes)};
    if (open_mpi) {
      if (!r.task.empty())
        c.argv.insert(c.argv.end(), {"-x", std::string(kDistributorTaskVariable)});
      for (const auto& [k, v] : o.env) c.argv.insert(c.argv.end(), {"-x", k});
    }
    c.argv.insert(c.argv.end(), m.args.begin(), m.args.end());
    c.env = o.env;
    if (!o.cluster.ifname.empty()) c.env["GLOO_SOCKET_IFNAME"] = o.cluster.ifname;
    if (!r.task.empty())
      c.env[kDistributorTaskVariable] = r.task;
    else
      c.unset.push_back(kDistributorTaskVariable);
    return c;
  }

  std::string describe() const override { return "mpi (the MPI launcher starts the workers)"; }

  std::optional<EngineTask> task_from_env(const EnvLookup& env) const override {
    if (auto t = openmpi_task(env)) return t;
    return mpich_task(env);
  }
};

}  // namespace

const Engine& mpi_engine() {
  static const Mpi engine;
  return engine;
}

}  // namespace dtrain::engines
