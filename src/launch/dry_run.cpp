// `dtrain run --dry-run`: the plan (engine, nodes, ranks per host, the store's address), with
// each host checked the way its engine reaches it; nothing is started.
#include <unistd.h>

#include <sstream>

#include "core/hostfile.h"
#include "dtrain/launch.h"
#include "engines/engine.h"
#include "launch/options_internal.h"
#include "launch/output.h"

namespace dtrain {

int print_plan(const LaunchOptions& o) {
  const engines::Engine& engine = engines::named(o.engine);
  const std::optional<engines::HostCheck> check = engine.check_hosts(o);
  std::ostringstream s;
  std::vector<std::pair<std::string, int>> hosts = o.hosts;
  if (hosts.empty()) {
    hosts.push_back({this_host_name(), o.nproc_per_node});
  }
  int world = 0;
  for (auto& h : hosts) world += h.second;
  s << "dtrain run --dry-run: the plan (nothing is started)\n";
  s << "  engine     : " << engine.describe() << "\n";
  s << "  nodes      : " << o.nnodes << "\n";
  s << "  world size : " << (check ? world : o.nnodes * o.nproc_per_node) << "\n";
  s << "  master     : " << o.master_addr << ":"
    << (o.master_port == 0  ? std::string("(a free port)")
        : o.master_port < 0 ? std::string("29500, or a free port if it is taken")
                            : std::to_string(o.master_port))
    << " (node 0 hosts the store)\n";
  s << "  rdzv id    : " << o.rdzv_id << "\n";
  if (o.min_nodes > 0) {
    s << "  elastic    : " << o.min_nodes << ":" << o.nnodes
      << " nodes, c10d rendezvous on the store above"
      << " (node ranks given out per round in join order; the ranks below are the full job's)\n";
  }
  if (!o.ifname.empty()) s << "  interface  : " << o.ifname << " (GLOO_SOCKET_IFNAME)\n";
  std::string program = o.program;
  for (const auto& a : o.args) program += " " + a;
  s << "  program    : " << program << "\n";
  if (!check) {
    // This node's own flags: its ranks, if every node runs as many.
    s << "  this node  : node " << o.node_rank << " (" << hosts.front().first << "), ranks "
      << o.node_rank * o.nproc_per_node << "-" << (o.node_rank + 1) * o.nproc_per_node - 1
      << " if every node runs " << o.nproc_per_node << "\n";
    launch::write_all(STDOUT_FILENO, s.str());
    return 0;
  }
  int offset = 0;
  int bad = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const int n = hosts[i].second;
    s << "  node " << i << "     : " << hosts[i].first << ", ranks " << offset << "-"
      << offset + n - 1 << " (" << n << " worker" << (n == 1 ? "" : "s") << ")";
    if (check->marks_this_node && static_cast<int>(i) == o.node_rank) s << " <- this node";
    const std::string why = i < check->why.size() ? check->why[i] : "";
    if (why.empty()) {
      s << check->ok << "\n";
    } else {
      s << ", UNREACHABLE: " << why << "\n";
      ++bad;
    }
    offset += n;
  }
  if (bad) s << "dtrain run --dry-run: " << bad << " host(s) unreachable\n";
  launch::write_all(STDOUT_FILENO, s.str());
  return bad ? 2 : 0;
}

}  // namespace dtrain
