// Engine "local": this machine. `dtrain run` with its own flags (one node, or nodes started by
// hand or a scheduler), and the Distributor with local_mode = true.
#include <algorithm>
#include <thread>

#include "engines/engine.h"
#include "launch/options_internal.h"

namespace dtrain::engines {
namespace {

class Local final : public Engine {
 public:
  std::string name() const override { return "local"; }
  bool is_cluster() const override { return false; }

  Placement place(const DistributorOptions& o) const override {
    Placement p;
    p.nproc_per_node = o.num_processes;
    p.elastic = detail::plan_elastic(o, 1);  // throws when min/max nodes are set
    return p;
  }
  std::string driver_address(const DistributorOptions&, const Placement&) const override {
    return "127.0.0.1";
  }
  void add_run_flags(const JobRequest&, std::vector<std::string>& argv) const override {
    argv.push_back("--no-slurm");  // a driver inside a Slurm step still runs locally
  }
  std::optional<Capacity> capacity(const DistributorOptions&) const override {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return Capacity{cores, cores};
  }

  std::string describe() const override { return "local (this node's flags)"; }
};

}  // namespace

const Engine& local_engine() {
  static const Local engine;
  return engine;
}

}  // namespace dtrain::engines
