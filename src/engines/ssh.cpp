// Engine "ssh": one dtrain agent per host of a host file or list, started over ssh by the
// launching dtrain (`dtrain run --hostfile`/`-H`; src/launch/ssh_launch.cpp does the starting).
// The Distributor's ssh jobs run that same launcher with ClusterOptions' hosts.
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "engines/common.h"
#include "engines/engine.h"
#include "launch/options_internal.h"

namespace dtrain::engines {
namespace {

SshOptions options_of(const ClusterOptions& c) {
  const SshOptions d;
  SshOptions s;
  s.hostfile = either(c.ssh.hostfile, c.hostfile, d.hostfile, "ssh.hostfile", "hostfile");
  s.hosts = either(c.ssh.hosts, c.hosts, d.hosts, "ssh.hosts", "hosts");
  s.port = either(c.ssh.port, c.ssh_port, d.port, "ssh.port", "ssh_port");
  s.identity = either(c.ssh.identity, c.ssh_identity, d.identity, "ssh.identity", "ssh_identity");
  s.args = either(c.ssh.args, c.ssh_args, d.args, "ssh.args", "ssh_args");
  s.remote_dtrain = either(c.ssh.remote_dtrain, c.remote_dtrain, d.remote_dtrain,
                           "ssh.remote_dtrain", "remote_dtrain");
  return s;
}

std::vector<std::pair<std::string, int>> hosts_of(const SshOptions& s) {
  return s.hostfile.empty() ? parse_host_list(s.hosts, 1) : parse_hostfile(s.hostfile, 1);
}

class Ssh final : public Engine {
 public:
  std::string name() const override { return "ssh"; }
  std::string listed() const override { return "\"ssh\" (a host file or list)"; }

  Placement place(const DistributorOptions& o) const override {
    const SshOptions s = options_of(o.cluster);
    if (s.hostfile.empty() == s.hosts.empty()) {
      throw UsageError(
          "ClusterOptions: engine \"ssh\" needs exactly one of `hostfile` (a file of "
          "`host slots=N` lines) and `hosts` (\"host1:2,host2:2\")");
    }
    const int n = o.num_processes;
    auto hosts = hosts_of(s);
    int slots = 0;
    for (const auto& h : hosts) slots += h.second;
    const int count = static_cast<int>(hosts.size());
    Placement p;
    if (slots == n) {
      p.nproc_per_node = 0;  // each host its slots
    } else if (n % count == 0) {
      p.nproc_per_node = n / count;
    } else {
      throw UsageError("DistributorOptions::num_processes is " + std::to_string(n) + ", but the " +
                       std::to_string(count) + " host(s) have " + std::to_string(slots) +
                       " slots; set num_processes to " + std::to_string(slots) +
                       " (every slot) or to a multiple of " + std::to_string(count) +
                       " (the same on every host)");
    }
    for (const auto& h : hosts) p.hosts.push_back(h.first.substr(h.first.find('@') + 1));
    p.elastic = detail::plan_elastic(o, count);
    return p;
  }

  void check_elastic(const ClusterOptions&, const std::string& given, int node_count,
                     int max_nodes) const override {
    if (max_nodes != node_count) {
      throw UsageError(given + ": engine \"ssh\" starts one agent on each of the " +
                       std::to_string(node_count) + " host(s), so max_nodes must be " +
                       std::to_string(node_count) +
                       " (or 0 for that); list the hosts the job may use");
    }
  }

  // The local address the kernel uses to reach each host: the first that is not loopback.
  // Only a job whose hosts are all this machine may use loopback.
  std::string driver_address(const DistributorOptions&, const Placement& p) const override {
    std::string loopback;
    bool all_targets_loopback = true;
    for (const auto& host : p.hosts) {
      const Route r = route_to(host);
      if (!r.resolved) {
        all_targets_loopback = false;
        continue;
      }
      all_targets_loopback = all_targets_loopback && r.target_loopback;
      if (r.local.empty()) continue;
      if (!is_loopback_address(r.local)) return r.local;
      loopback = r.local;
    }
    if (!loopback.empty() && all_targets_loopback) return loopback;
    throw UsageError(
        "cannot find an address of this machine that the hosts can reach (the "
        "host names resolve to loopback here, as Debian's 127.0.1.1 entry does); set "
        "ClusterOptions::driver_addr to this machine's address as the hosts see it");
  }

  void add_run_flags(const JobRequest& r, std::vector<std::string>& argv) const override {
    const SshOptions s = options_of(r.options.cluster);
    if (!s.hostfile.empty()) argv.insert(argv.end(), {"--hostfile", s.hostfile});
    if (!s.hosts.empty()) argv.insert(argv.end(), {"-H", s.hosts});
    if (s.port > 0) argv.insert(argv.end(), {"--ssh-port", std::to_string(s.port)});
    if (!s.identity.empty()) argv.insert(argv.end(), {"--ssh-identity", s.identity});
    for (const auto& a : s.args) argv.push_back("--ssh-arg=" + a);
    if (!s.remote_dtrain.empty()) argv.insert(argv.end(), {"--remote-dtrain", s.remote_dtrain});
    // The first host's store listens on a port of this run's own (20000-31999, below Linux's
    // ephemeral ports), not dtrain run's fixed 29500: jobs on the same hosts at once (a Tune
    // search's trials) would collide there.
    if (!r.run_id.empty()) {
      argv.insert(argv.end(), {"--master-port", std::to_string(derived_port("ssh-" + r.run_id))});
    }
  }

  // The hosts' slots (a host list says what each host may run; what else runs there it
  // cannot tell).
  std::optional<Capacity> capacity(const DistributorOptions& o) const override {
    const SshOptions s = options_of(o.cluster);
    if (s.hostfile.empty() == s.hosts.empty()) return std::nullopt;
    int slots = 0;
    for (const auto& h : hosts_of(s)) slots += h.second;
    return Capacity{slots, slots};
  }

  // Each host over ssh, as the launcher reaches it for the job's agents.
  std::optional<std::vector<HostCommand>> host_commands(
      const DistributorOptions& o, const std::string& launcher) const override {
    const SshOptions s = options_of(o.cluster);
    if (s.hostfile.empty() == s.hosts.empty()) return std::nullopt;
    LaunchOptions l;
    l.ssh_port = s.port;
    l.ssh_identity = s.identity;
    l.ssh_args = s.args;
    l.remote_dtrain = s.remote_dtrain.empty() ? launcher : s.remote_dtrain;
    std::vector<HostCommand> out;
    for (const auto& h : hosts_of(s))
      out.push_back({h.first, ssh_command(l, h.first), remote_dtrain(l)});
    return out;
  }

  bool adopt(LaunchOptions& o, const RunArgs& a, const EnvLookup&) const override {
    const bool host_mode = !a.hostfile.empty() || !a.host_list.empty();
    if (!host_mode) {
      if (!a.ssh_port.empty() || !a.ssh_identity.empty() || !a.ssh_args.empty() ||
          !a.remote_dtrain.empty()) {
        throw UsageError(
            "--ssh-port, --ssh-identity, --ssh-arg and --remote-dtrain only apply with "
            "--hostfile or -H (hosts reached over ssh)");
      }
      return false;
    }
    if (!a.hostfile.empty() && !a.host_list.empty()) {
      throw UsageError("--hostfile and -H/--hosts both given: use one of them");
    }
    // --nnodes MIN:MAX with a host list: an elastic job over ssh, one agent per host (the
    // list's size is MAX); the agents join a c10d rendezvous on the first host.
    const bool elastic = o.min_nodes > 0;
    for (auto [flag, given] : {std::pair{"--nnodes", !a.nnodes.empty() && !elastic},
                               std::pair{"--node-rank", !a.node_rank.empty()},
                               std::pair{"--rdzv-endpoint", !a.rdzv_endpoint.empty()},
                               std::pair{"--standalone", a.standalone}}) {
      if (given) {
        throw UsageError(std::string(flag) +
                         " cannot be combined with --hostfile/-H: the host list "
                         "gives the nodes (node K is the K-th host; the first hosts the store)");
      }
    }
    if (o.rdzv_backend != "static" && !elastic) {
      throw UsageError(
          "--rdzv-backend c10d cannot be combined with --hostfile/-H: the host list "
          "gives every node its rank (an elastic job, --nnodes MIN:MAX, uses it by itself)");
    }
    const int slots_default = 1;
    auto hosts = !a.hostfile.empty() ? parse_hostfile(a.hostfile, slots_default)
                                     : parse_host_list(a.host_list, slots_default);
    if (!a.nproc.empty()) {
      for (auto& h : hosts) h.second = o.nproc_per_node;  // --nproc-per-node overrides slots
    }
    o.engine = name();
    o.hosts = hosts;
    if (elastic) {
      if (o.nnodes != static_cast<int>(hosts.size())) {
        throw UsageError(
            "--nnodes " + std::to_string(o.min_nodes) + ":" + std::to_string(o.nnodes) +
            " with --hostfile/-H: the host list has " + std::to_string(hosts.size()) +
            " host(s) and one agent starts on each, so MAX must be " +
            std::to_string(hosts.size()) + "; use --nnodes " +
            std::to_string(std::min<int>(o.min_nodes, static_cast<int>(hosts.size()))) + ":" +
            std::to_string(hosts.size()));
      }
      o.rdzv_backend = "c10d";
    }
    o.nnodes = static_cast<int>(hosts.size());
    if (a.master_addr.empty()) {
      const std::string& first = hosts.front().first;  // "user@host": ssh's login, not the address
      o.master_addr = first.substr(first.find('@') + 1);
    }
    bool distinct = false;
    for (const auto& h : hosts) distinct = distinct || h.first != hosts.front().first;
    if (distinct && is_loopback_host(o.master_addr)) {
      throw UsageError("--master-addr: '" + o.master_addr +
                       "' is this machine's loopback address, which the other hosts cannot reach; "
                       "give an address or name of the first host that every host can reach");
    }
    if (o.rdzv_id == "none") {
      o.rdzv_id =
          "ssh-" + std::to_string(::getpid()) + "-" +
          std::to_string(std::chrono::system_clock::now().time_since_epoch().count() % 1000000007);
    }
    return true;
  }

  std::string describe() const override { return "ssh (one agent per host, started over ssh)"; }
  std::optional<HostCheck> check_hosts(const LaunchOptions& o) const override {
    return HostCheck{check_ssh_hosts(o), ", reachable over ssh", false};
  }
  // The interface is on the hosts, not on the machine that starts them.
  bool ifname_is_local() const override { return false; }
  int launch(LaunchOptions o) const override {
    validate_launch_options(o);
    return run_ssh_launch(o);
  }
};

}  // namespace

const Engine& ssh_engine() {
  static const Ssh engine;
  return engine;
}

}  // namespace dtrain::engines
