// The cluster engines' interface (src/engines/): the registry, each engine's options in its own
// struct (and the older flat fields), capabilities, capacity, and the commands engines build,
// with the real srun and mpirun on PATH.
#include <gtest/gtest.h>

#include <thread>

#include "dtrain/error.h"
#include "engines/engine.h"
#include "launch/options_internal.h"

namespace {

using dtrain::ClusterOptions;
using dtrain::DistributorOptions;
using dtrain::UsageError;
namespace engines = dtrain::engines;

DistributorOptions cluster_job(int processes, ClusterOptions c) {
  DistributorOptions o;
  o.num_processes = processes;
  o.local_mode = false;
  o.cluster = std::move(c);
  return o;
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

TEST(Engines, RegistryNamesEveryEngineOnce) {
  std::vector<std::string> names;
  for (const auto* e : engines::all()) names.push_back(e->name());
  EXPECT_EQ(names, (std::vector<std::string>{"local", "ssh", "slurm", "mpi", "spark", "ray"}));
  EXPECT_EQ(engines::cluster_engine_list(),
            "\"ssh\" (a host file or list), \"slurm\", \"mpi\", \"spark\" or \"ray\" (a Ray "
            "cluster)");
  EXPECT_EQ(engines::cluster_engine_list(false),
            "\"ssh\", \"slurm\", \"mpi\", \"spark\" or \"ray\"");
  EXPECT_EQ(engines::named("slurm").name(), "slurm");
  EXPECT_EQ(engines::for_job(DistributorOptions{}).name(), "local");
  const std::string unknown =
      usage_error([] { engines::for_cluster(ClusterOptions{.engine = "kubernetes"}); });
  EXPECT_NE(unknown.find("got 'kubernetes', expected \"ssh\" (a host file or list)"),
            std::string::npos)
      << unknown;
  // "local" is DistributorOptions::local_mode, not a cluster engine.
  EXPECT_THROW(engines::for_cluster(ClusterOptions{.engine = "local"}), UsageError);
}

TEST(Engines, CapabilitiesAreQuestionsNotNames) {
  for (const auto* e : engines::all()) {
    EXPECT_EQ(e->runs_agents(), e->name() != "mpi") << e->name();
    const bool elastic = e->name() != "mpi" && e->name() != "spark" && e->name() != "ray";
    EXPECT_EQ(e->why_not_elastic().empty(), elastic) << e->name();
    EXPECT_EQ(e->shared_console(),
              e->name() == "slurm" || e->name() == "ray" || e->name() == "spark")
        << e->name();
    EXPECT_FALSE(e->describe().empty()) << e->name();
  }
}

TEST(Engines, EachEnginesStructMeansWhatItsFlatFieldsMean) {
  // slurm.nodes and the older `nodes`: the same placement.
  const auto nested = engines::for_cluster({.engine = "slurm"})
                          .place(cluster_job(4, {.engine = "slurm", .slurm = {.nodes = 2}}));
  const auto flat = engines::for_cluster({.engine = "slurm"})
                        .place(cluster_job(4, {.engine = "slurm", .nodes = 2}));
  EXPECT_EQ(nested.nproc_per_node, 2);
  EXPECT_EQ(flat.nproc_per_node, 2);
  // ssh.hosts and `hosts`.
  const auto ssh = engines::for_cluster({.engine = "ssh"})
                       .place(cluster_job(4, {.engine = "ssh", .ssh = {.hosts = "n1:2,u@n2:2"}}));
  EXPECT_EQ(ssh.hosts, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(ssh.nproc_per_node, 0);  // each host its slots
  // Both spellings, different values: a clear error naming both.
  const std::string both = usage_error([] {
    engines::for_cluster({.engine = "slurm"})
        .place(cluster_job(4, {.engine = "slurm", .nodes = 2, .slurm = {.nodes = 4}}));
  });
  EXPECT_NE(both.find("ClusterOptions::slurm.nodes and ClusterOptions::nodes are both set"),
            std::string::npos)
      << both;
  // Both spellings, the same value: fine.
  EXPECT_NO_THROW(
      engines::for_cluster({.engine = "slurm"})
          .place(cluster_job(4, {.engine = "slurm", .nodes = 2, .slurm = {.nodes = 2}})));
  // spark.processes_per_task sizes the barrier tasks.
  const auto spark =
      engines::for_cluster({.engine = "spark"})
          .place(cluster_job(4, {.engine = "spark",
                                 .spark = {.master = "spark://h:7077", .processes_per_task = 2}}));
  EXPECT_EQ(spark.nproc_per_node, 2);
}

TEST(Engines, CapacityWhereTheEngineCanTell) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto local = engines::for_job(DistributorOptions{}).capacity(DistributorOptions{});
  ASSERT_TRUE(local);
  EXPECT_EQ(local->total_slots, cores);
  EXPECT_EQ(local->free_slots, cores);
  EXPECT_FALSE(local->net_of_jobs);  // the cores: a search's trials do not change the count
  const auto o = cluster_job(3, {.engine = "ssh", .ssh = {.hosts = "n1:2,n2:3"}});
  auto ssh = engines::for_job(o).capacity(o);
  ASSERT_TRUE(ssh);
  EXPECT_EQ(ssh->total_slots, 5);
  EXPECT_FALSE(ssh->net_of_jobs);  // the host file's slots, likewise
  // Slurm asks sinfo; with no controller answering here (the cluster tests start theirs),
  // the engine cannot tell.
  const auto s = cluster_job(2, {.engine = "slurm", .nodes = 2});
  EXPECT_FALSE(engines::for_job(s).capacity(s));
}

TEST(Engines, CommandsFromTheEnginesOwnOptions) {
  // slurm: srun (the real one) up to the launcher.
  const auto s = cluster_job(4, {.engine = "slurm", .slurm = {.nodes = 2, .partition = "gpu"}});
  const auto& slurm = engines::for_job(s);
  const auto sp = slurm.place(s);
  const auto srun = slurm.agents_command({s, sp, "/opt/dtrain", ""});
  ASSERT_GE(srun.argv.size(), 7u);
  EXPECT_EQ(srun.argv[0], dtrain::find_in_path("srun"));
  EXPECT_EQ(
      std::vector<std::string>(srun.argv.begin() + 1, srun.argv.end()),
      (std::vector<std::string>{"-N", "2", "--ntasks-per-node=1", "-p", "gpu", "/opt/dtrain"}));
  // ssh: the launcher's host flags.
  const auto h = cluster_job(
      2, {.engine = "ssh", .ssh = {.hosts = "n1,n2", .port = 2222, .args = {"-F", "cfg"}}});
  std::vector<std::string> flags;
  engines::for_job(h).add_run_flags({h, engines::for_job(h).place(h), "dtrain", ""}, flags);
  EXPECT_EQ(flags, (std::vector<std::string>{"-H", "n1,n2", "--ssh-port", "2222", "--ssh-arg=-F",
                                             "--ssh-arg=cfg"}));
  // mpi: the real mpirun (Open MPI) passes the task variable with -x; no agent.
  const auto m = cluster_job(4, {.engine = "mpi", .mpi = {.args = {"--oversubscribe"}}});
  const auto& mpi = engines::for_job(m);
  const auto mc = mpi.workers_command({m, mpi.place(m), "", "127.0.0.1:1:id"});
  EXPECT_EQ(mc.argv[0], dtrain::find_in_path("mpirun"));
  EXPECT_EQ(std::vector<std::string>(mc.argv.begin() + 1, mc.argv.end()),
            (std::vector<std::string>{"-np", "4", "-x", engines::kDistributorTaskVariable,
                                      "--oversubscribe"}));
  EXPECT_EQ(mc.env.at(engines::kDistributorTaskVariable), "127.0.0.1:1:id");
}

}  // namespace
