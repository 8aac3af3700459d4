// Engine "slurm": `srun -N nodes --ntasks-per-node=1 dtrain run ...`, one agent per node of a
// Slurm step. `dtrain run` inside a step takes its nodes from the step (adopt); a program
// started by `srun -n N prog` takes its rank from Slurm's variables (task_from_env); the
// Distributor starts the step (agents_command).
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>

#include "engines/common.h"
#include "engines/engine.h"
#include "launch/options_internal.h"

namespace dtrain {

// ---- Slurm's variables (declared in dtrain/engine_env.h) ----------------------------------

using engines::get;
using engines::get_int;

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

namespace engines {

const Engine& slurm_engine();

namespace {

SlurmOptions options_of(const ClusterOptions& c) {
  const SlurmOptions d;
  SlurmOptions s;
  s.nodes = either(c.slurm.nodes, c.nodes, d.nodes, "slurm.nodes", "nodes");
  s.partition = either(c.slurm.partition, c.partition, d.partition, "slurm.partition", "partition");
  s.srun_args = either(c.slurm.srun_args, c.srun_args, d.srun_args, "slurm.srun_args", "srun_args");
  return s;
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

// Under srun, with no sizes or addresses given: one agent per node of the step, node 0 (the
// step's first host) hosts the store. See include/dtrain/engine_env.h.
void apply_slurm_step(LaunchOptions& o, const RunArgs& a, const SlurmStep& s) {
  if (s.ntasks != s.nnodes) {
    throw UsageError(
        "dtrain run under srun needs one task per node (it starts the node's workers itself), "
        "but this step has " +
        std::to_string(s.ntasks) + " tasks on " + std::to_string(s.nnodes) +
        " node(s): use `srun --ntasks-per-node=1 dtrain run --nproc-per-node N ...`, or run the "
        "program directly with `srun -n N prog`, or pass --no-slurm");
  }
  o.engine = slurm_engine().name();
  if (o.min_nodes > 0) {
    // Elastic (--nnodes MIN:MAX --rdzv-backend c10d): the step's nodes join the c10d
    // rendezvous on its first host; ranks are given out per round in join order.
    if (s.nnodes > o.nnodes) {
      throw UsageError("dtrain run --nnodes " + std::to_string(o.min_nodes) + ":" +
                       std::to_string(o.nnodes) + " under srun: this step has " +
                       std::to_string(s.nnodes) + " nodes, more than the maximum; use srun -N " +
                       std::to_string(o.min_nodes) + "-" + std::to_string(o.nnodes));
    }
  } else {
    o.nnodes = s.nnodes;
    o.node_rank = s.node_rank;
    o.rdzv_backend = "static";
  }
  for (const auto& h : s.hosts) o.hosts.push_back({h, o.nproc_per_node});
  if (a.master_addr.empty() && a.rdzv_endpoint.empty() && s.nnodes > 1 && !s.hosts.empty()) {
    o.master_addr = s.hosts.front();
  }
  if (a.master_port.empty() && a.rdzv_endpoint.empty() && s.nnodes > 1) {
    o.master_port = derived_port("slurm-" + s.job_id + "." + s.step_id);
  }
  if (a.rdzv_id == "none") o.rdzv_id = "slurm-" + s.job_id + "." + s.step_id;
}

class Slurm final : public Engine {
 public:
  std::string name() const override { return "slurm"; }

  Placement place(const DistributorOptions& o) const override {
    const SlurmOptions s = options_of(o.cluster);
    if (s.nodes < 1) {
      throw UsageError("ClusterOptions::nodes must be at least 1, got " + std::to_string(s.nodes));
    }
    Placement p;
    p.elastic = detail::plan_elastic(o, s.nodes);
    // Elastic: num_processes is the world size with max_nodes nodes.
    const int nodes = p.elastic.elastic ? p.elastic.max_nodes : s.nodes;
    const std::string field =
        p.elastic.elastic ? "ClusterOptions::max_nodes" : "ClusterOptions::nodes";
    const int n = o.num_processes;
    if (n % nodes != 0) {
      throw UsageError("DistributorOptions::num_processes (" + std::to_string(n) +
                       ") must be a multiple of " + field + " (" + std::to_string(nodes) +
                       "): every node runs the same number of workers");
    }
    p.nproc_per_node = n / nodes;
    return p;
  }

  void check_elastic(const ClusterOptions& c, const std::string& given, int, int) const override {
    const int nodes = options_of(c).nodes;
    if (c.max_nodes != 0 && nodes != 1 && nodes != c.max_nodes) {
      throw UsageError(given + ", nodes = " + std::to_string(nodes) +
                       ": with engine \"slurm\" max_nodes replaces `nodes` (srun -N max_nodes); "
                       "leave nodes at 1 or set it to max_nodes");
    }
  }
  void finish_elastic(const ClusterOptions&, detail::ElasticPlan& plan) const override {
    // With a host list the launcher picks the c10d backend itself; under srun it is a flag.
    plan.run_args.insert(plan.run_args.begin() + 2, {"--rdzv-backend", "c10d"});
    // srun -N MAX, not MIN-MAX: for a range Slurm may give the minimum even when more nodes
    // are free (seen on the test cluster: -N 1-2 ran on one of two idle nodes).
    plan.srun_nodes = std::to_string(plan.max_nodes);
  }

  Command agents_command(const JobRequest& r) const override {
    const SlurmOptions s = options_of(r.options.cluster);
    std::string srun = find_in_path("srun");
    if (srun.empty()) {
      throw UsageError(
          "ClusterOptions::engine \"slurm\" needs Slurm's srun on PATH (Debian: "
          "apt-get install slurm-client), run where it can reach the controller");
    }
    const auto& elastic = r.placement.elastic;
    Command c;
    c.argv = {srun, "-N", elastic.elastic ? elastic.srun_nodes : std::to_string(s.nodes),
              "--ntasks-per-node=1"};
    // Elastic: a lost node must not end the step (srun's default); the others go on.
    if (elastic.elastic) c.argv.push_back("--no-kill");
    if (!s.partition.empty()) c.argv.insert(c.argv.end(), {"-p", s.partition});
    c.argv.insert(c.argv.end(), s.srun_args.begin(), s.srun_args.end());
    c.argv.push_back(r.launcher);
    return c;
  }

  // The partition's CPUs, one process each (sinfo's %C: allocated/idle/other/total; the
  // default partition, marked '*', when none is set); nullopt when sinfo is missing or does
  // not answer within 20 s.
  std::optional<Capacity> capacity(const DistributorOptions& o) const override {
    const SlurmOptions s = options_of(o.cluster);
    const std::string sinfo = find_in_path("sinfo");
    if (sinfo.empty()) return std::nullopt;
    std::string cmd = "timeout 20 " + shell_quote(sinfo) + " -h -o '%P %C'";
    if (!s.partition.empty()) cmd += " -p " + shell_quote(s.partition);
    FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
    if (p == nullptr) return std::nullopt;
    std::optional<Capacity> room;
    char line[512];
    while (std::fgets(line, sizeof line, p) != nullptr) {
      char part[256];
      long allocated = 0, idle = 0, other = 0, total = 0;
      if (std::sscanf(line, "%255s %ld/%ld/%ld/%ld", part, &allocated, &idle, &other, &total) != 5)
        continue;
      const std::string name = part;
      if (!s.partition.empty() || (!name.empty() && name.back() == '*')) {
        room = Capacity{static_cast<int>(total), static_cast<int>(idle)};
        break;
      }
    }
    ::pclose(p);
    return room;
  }

  bool adopt(LaunchOptions& o, const RunArgs& a, const EnvLookup& env) const override {
    if (a.no_slurm) return false;
    const bool sizes_given = !a.nnodes.empty() || !a.node_rank.empty() || !a.master_addr.empty() ||
                             !a.rdzv_endpoint.empty() || a.standalone;
    // An elastic job under srun with no endpoint: the step gives the hosts and the store's.
    const bool elastic_step = o.min_nodes > 0 && o.rdzv_backend == "c10d" && a.node_rank.empty() &&
                              a.master_addr.empty() && a.rdzv_endpoint.empty() && !a.standalone;
    if (sizes_given && !elastic_step) return false;
    auto step = slurm_step(env);
    if (!step) return false;
    apply_slurm_step(o, a, *step);
    return true;
  }

  std::string describe() const override { return "slurm (this srun step; one agent per node)"; }
  // Every node must resolve the master's name to an address other than loopback (unless it
  // is node 0 itself).
  std::optional<HostCheck> check_hosts(const LaunchOptions& o) const override {
    HostCheck check{std::vector<std::string>(o.hosts.size()), ", resolves", true};
    for (size_t i = 0; i < o.hosts.size(); ++i) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      addrinfo* res = nullptr;
      if (::getaddrinfo(o.hosts[i].first.c_str(), nullptr, &hints, &res) != 0) {
        check.why[i] = "its name does not resolve on this node";
      }
      if (res) ::freeaddrinfo(res);
    }
    return check;
  }
  bool shared_console() const override { return true; }

  std::optional<EngineTask> task_from_env(const EnvLookup& env) const override {
    return slurm_task(env);
  }
};

}  // namespace

const Engine& slurm_engine() {
  static const Slurm engine;
  return engine;
}

}  // namespace engines
}  // namespace dtrain
