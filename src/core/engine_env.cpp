#include "dtrain/engine_env.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "dtrain/error.h"

namespace dtrain {

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

namespace {

std::optional<std::string> get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int to_int(const char* name, const std::string& v, const char* engine) {
  try {
    size_t used = 0;
    long x = std::stol(v, &used);
    if (used == v.size() && x >= 0 && x <= INT32_MAX) return static_cast<int>(x);
  } catch (const std::exception&) {
  }
  throw UsageError(std::string("environment variable ") + name + "='" + v +
                   "' is not a non-negative integer; " + engine +
                   " sets it: unset it, or start the program through " + engine);
}

std::optional<int> get_int(const EnvLookup& env, const char* name, const char* engine) {
  auto v = get(env, name);
  if (!v) return std::nullopt;
  return to_int(name, *v, engine);
}

int require_int(const EnvLookup& env, const char* name, const char* engine) {
  auto v = get_int(env, name, engine);
  if (!v) {
    throw UsageError(std::string("environment variable ") + name + " is not set, but other " +
                     engine + " variables are; start the program through " + engine +
                     " (or set RANK and WORLD_SIZE yourself)");
  }
  return *v;
}

void check_rank(const std::string& engine, int rank, int world, int local_rank, int local_world) {
  if (world < 1 || rank >= world || local_world < 1 || local_rank >= local_world ||
      local_world > world) {
    throw UsageError(
        engine + " variables are inconsistent: rank " + std::to_string(rank) + " of " +
        std::to_string(world) + ", local rank " + std::to_string(local_rank) + " of " +
        std::to_string(local_world) +
        "; need 0 <= rank < world size and 0 <= local rank < local size <= world size");
  }
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
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "this host";
  return buf;
}

void master_from_env(const EnvLookup& env, EngineTask& t) {
  if (auto a = get(env, "MASTER_ADDR"); a && !a->empty()) t.master_addr = *a;
  if (auto p = get(env, "MASTER_PORT"); p && !p->empty()) {
    int port = to_int("MASTER_PORT", *p, "the launcher");
    if (port < 1 || port > 65535) {
      throw UsageError("MASTER_PORT='" + *p +
                       "' is not a port number; set it to 1-65535 or unset it");
    }
    t.master_port = port;
  }
}

std::optional<EngineTask> slurm_task(const EnvLookup& env) {
  auto step = slurm_step(env);
  if (!step || !get(env, "SLURM_PROCID")) return std::nullopt;
  EngineTask t;
  t.engine = "slurm";
  t.rank = require_int(env, "SLURM_PROCID", "Slurm");
  t.world_size = step->ntasks;
  t.local_rank = require_int(env, "SLURM_LOCALID", "Slurm");
  t.node_rank = step->node_rank;
  t.nnodes = step->nnodes;
  t.hosts = step->hosts;
  t.job_id = step->job_id + "." + step->step_id;
  const char* tpn_name =
      get(env, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  if (auto tpn = get(env, tpn_name)) {
    auto counts = expand_tasks_per_node(*tpn);
    if (t.node_rank < static_cast<int>(counts.size())) t.local_world_size = counts[t.node_rank];
  } else {
    t.local_world_size = t.world_size / std::max(1, t.nnodes);
  }
  check_rank("Slurm", t.rank, t.world_size, t.local_rank, t.local_world_size);
  // Block distribution (Slurm's default) puts rank 0 on the step's first node.
  t.master_addr = t.hosts.empty() ? "127.0.0.1" : t.hosts.front();
  if (t.nnodes == 1) t.master_addr = "127.0.0.1";
  t.master_port = derived_port("slurm-" + t.job_id);
  master_from_env(env, t);
  return t;
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

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list) {
  auto bad = [&](const std::string& why) {
    return UsageError("Slurm host list '" + list + "' is malformed (" + why +
                      "); expected names like 'n[1-3,7],login'");
  };
  // Split at commas that are not inside brackets.
  std::vector<std::string> items;
  int depth = 0;
  std::string cur;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw bad("']' without '['");
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) throw bad("'[' without ']'");
  items.push_back(cur);
  std::vector<std::string> out;
  for (const auto& item : items) {
    if (item.empty()) throw bad("an empty name");
    auto open = item.find('[');
    if (open == std::string::npos) {
      out.push_back(item);
      continue;
    }
    auto close = item.find(']', open);
    std::string prefix = item.substr(0, open);
    std::string suffix = item.substr(close + 1);
    if (suffix.find('[') != std::string::npos) throw bad("more than one range in a name");
    std::string ranges = item.substr(open + 1, close - open - 1);
    size_t pos = 0;
    while (pos <= ranges.size()) {
      size_t comma = ranges.find(',', pos);
      std::string r =
          ranges.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      auto dash = r.find('-');
      std::string lo = r.substr(0, dash);
      std::string hi = dash == std::string::npos ? lo : r.substr(dash + 1);
      auto digits = [](const std::string& s) {
        return !s.empty() && s.size() < 10 &&
               s.find_first_not_of("0123456789") == std::string::npos;
      };
      if (!digits(lo) || !digits(hi)) throw bad("'" + r + "' is not a number or a range N-M");
      long a = std::stol(lo), b = std::stol(hi);
      if (b < a) throw bad("range '" + r + "' runs backwards");
      if (b - a > 100000) throw bad("range '" + r + "' is too large");
      for (long v = a; v <= b; ++v) {
        std::string num = std::to_string(v);
        if (num.size() < lo.size()) num = std::string(lo.size() - num.size(), '0') + num;
        out.push_back(prefix + num + suffix);
      }
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  return out;
}

std::vector<int> expand_tasks_per_node(const std::string& spec) {
  auto bad = [&]() {
    return UsageError("Slurm tasks per node '" + spec +
                      "' is malformed; expected a form like '2(x3),1'");
  };
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item =
        spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int count = 0, repeat = 1;
    size_t used = 0;
    try {
      count = std::stoi(item, &used);
      if (used < item.size()) {
        std::string rest = item.substr(used);
        if (rest.size() < 4 || rest.compare(0, 2, "(x") != 0 || rest.back() != ')') throw bad();
        size_t used2 = 0;
        repeat = std::stoi(rest.substr(2, rest.size() - 3), &used2);
        if (used2 != rest.size() - 3) throw bad();
      }
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception&) {
      throw bad();
    }
    if (count < 0 || repeat < 1 || repeat > 100000) throw bad();
    out.insert(out.end(), static_cast<size_t>(repeat), count);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

int derived_port(const std::string& job_id) {
  // FNV-1a: stable across builds and hosts (std::hash is not guaranteed to be).
  uint32_t h = 2166136261u;
  for (unsigned char c : job_id) {
    h ^= c;
    h *= 16777619u;
  }
  return 20000 + static_cast<int>(h % 12000u);
}

std::optional<SlurmStep> slurm_step(const EnvLookup& env) {
  auto job = get(env, "SLURM_JOB_ID");
  if (!job) job = get(env, "SLURM_JOBID");
  auto step_id = get(env, "SLURM_STEP_ID");
  if (!step_id) step_id = get(env, "SLURM_STEPID");
  if (!job || !step_id) return std::nullopt;
  SlurmStep s;
  s.job_id = *job;
  s.step_id = *step_id;
  auto nodelist = get(env, "SLURM_STEP_NODELIST");
  if (!nodelist) nodelist = get(env, "SLURM_JOB_NODELIST");
  if (!nodelist) nodelist = get(env, "SLURM_NODELIST");
  if (nodelist) s.hosts = expand_hostlist(*nodelist);
  const char* e = "Slurm";
  auto nnodes = get_int(env, "SLURM_STEP_NUM_NODES", e);
  if (!nnodes) nnodes = get_int(env, "SLURM_NNODES", e);
  s.nnodes = nnodes.value_or(s.hosts.empty() ? 1 : static_cast<int>(s.hosts.size()));
  auto ntasks = get_int(env, "SLURM_STEP_NUM_TASKS", e);
  if (!ntasks) ntasks = get_int(env, "SLURM_NTASKS", e);
  if (!ntasks) ntasks = get_int(env, "SLURM_NPROCS", e);
  s.ntasks = ntasks.value_or(1);
  s.node_name = get(env, "SLURMD_NODENAME").value_or("");
  int index = -1;
  for (size_t i = 0; i < s.hosts.size(); ++i) {
    if (s.hosts[i] == s.node_name) index = static_cast<int>(i);
  }
  s.node_rank = index >= 0 ? index : get_int(env, "SLURM_NODEID", e).value_or(0);
  if (!s.hosts.empty() && static_cast<int>(s.hosts.size()) != s.nnodes) {
    throw UsageError("Slurm variables are inconsistent: the step's node list has " +
                     std::to_string(s.hosts.size()) +
                     " host(s) but SLURM_STEP_NUM_NODES/SLURM_NNODES says " +
                     std::to_string(s.nnodes));
  }
  if (s.nnodes < 1 || s.node_rank >= s.nnodes) {
    throw UsageError("Slurm variables are inconsistent: node " + std::to_string(s.node_rank) +
                     " of " + std::to_string(s.nnodes) + " nodes");
  }
  return s;
}

std::optional<EngineTask> detect_engine_task(const EnvLookup& env) {
  if (auto t = slurm_task(env)) return t;
  if (auto t = openmpi_task(env)) return t;
  if (auto t = mpich_task(env)) return t;
  return std::nullopt;
}

std::optional<WorkerEnv> engine_worker_env(const EnvLookup& env) {
  auto t = detect_engine_task(env);
  if (!t) return std::nullopt;
  WorkerEnv w;
  w.rank = t->rank;
  w.world_size = t->world_size;
  w.local_rank = t->local_rank;
  w.local_world_size = t->local_world_size;
  w.group_rank = t->node_rank;
  w.group_world_size = std::max(1, t->nnodes);
  w.role_rank = t->rank;
  w.role_world_size = t->world_size;
  w.master_addr = t->master_addr;
  w.master_port = t->master_port;
  w.run_id = t->engine + "-" + t->job_id;
  w.use_agent_store = false;  // no agent: rank 0 hosts the store
  return w;
}

}  // namespace dtrain
