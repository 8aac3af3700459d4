// Pure logic of cluster mode: the engines' variables (dtrain/engine_env.h), `dtrain run`
// under a Slurm step, host files and -H lists, and the arguments of ssh-started agents. The
// real engines run in the scripts beside this file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "dtrain/engine_env.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "launch/options_internal.h"
#include "support/scoped_env.h"

namespace dtrain {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& v) {
  return [v](const char* name) -> const char* {
    auto it = v.find(name);
    return it == v.end() ? nullptr : it->second.c_str();
  };
}

template <typename F>
std::string usage_error(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

TEST(Hostlist, ExpandsRangesListsAndPadding) {
  EXPECT_EQ(expand_hostlist("n[1-2]"), (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(expand_hostlist("n[1-3,7],login"),
            (std::vector<std::string>{"n1", "n2", "n3", "n7", "login"}));
  EXPECT_EQ(expand_hostlist("gpu[08-10]-a"),
            (std::vector<std::string>{"gpu08-a", "gpu09-a", "gpu10-a"}));
  EXPECT_EQ(expand_hostlist("single"), (std::vector<std::string>{"single"}));
  EXPECT_NE(usage_error([] { expand_hostlist("n[1-2"); }).find("'n[1-2' is malformed"),
            std::string::npos);
  EXPECT_NE(usage_error([] { expand_hostlist("n[3-1]"); }).find("runs backwards"),
            std::string::npos);
  EXPECT_NE(usage_error([] { expand_hostlist("n[a-b]"); }).find("not a number"), std::string::npos);
}

TEST(Hostlist, TasksPerNode) {
  EXPECT_EQ(expand_tasks_per_node("2(x2)"), (std::vector<int>{2, 2}));
  EXPECT_EQ(expand_tasks_per_node("3,2(x2),1"), (std::vector<int>{3, 2, 2, 1}));
  EXPECT_NE(usage_error([] { expand_tasks_per_node("2(x"); }).find("'2(x' is malformed"),
            std::string::npos);
}

TEST(DerivedPort, StableAndBelowTheEphemeralRange) {
  EXPECT_EQ(derived_port("slurm-12.0"), derived_port("slurm-12.0"));
  EXPECT_NE(derived_port("slurm-12.0"), derived_port("slurm-13.0"));
  for (int j = 0; j < 1000; ++j) {
    int p = derived_port("job" + std::to_string(j));
    EXPECT_GE(p, 20000);
    EXPECT_LT(p, 32000);
  }
}

Vars slurm_task_vars() {
  // What srun -N2 -n4 gave task 3 on the test cluster (tests/cluster/lib.sh).
  return {{"SLURM_JOB_ID", "7"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", "3"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},
          {"SLURM_STEP_NUM_TASKS", "4"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
          {"SLURMD_NODENAME", "n2"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_NNODES", "2"}};
}

TEST(EngineTask, SlurmTask) {
  auto t = detect_engine_task(lookup(slurm_task_vars()));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->engine, "slurm");
  EXPECT_EQ(t->rank, 3);
  EXPECT_EQ(t->world_size, 4);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->local_world_size, 2);
  EXPECT_EQ(t->node_rank, 1);
  EXPECT_EQ(t->nnodes, 2);
  EXPECT_EQ(t->master_addr, "n1");  // the step's first node, never loopback across nodes
  EXPECT_EQ(t->master_port, derived_port("slurm-7.0"));
  auto w = engine_worker_env(lookup(slurm_task_vars()));
  ASSERT_TRUE(w);
  EXPECT_FALSE(w->use_agent_store);  // no agent: rank 0 hosts the store
  EXPECT_EQ(w->rank, 3);
  EXPECT_EQ(w->group_rank, 1);
}

TEST(EngineTask, MasterVariablesWin) {
  Vars v = slurm_task_vars();
  v["MASTER_ADDR"] = "10.0.0.9";
  v["MASTER_PORT"] = "23456";
  auto t = detect_engine_task(lookup(v));
  EXPECT_EQ(t->master_addr, "10.0.0.9");
  EXPECT_EQ(t->master_port, 23456);
  v["MASTER_PORT"] = "99999";
  EXPECT_NE(usage_error([&] { detect_engine_task(lookup(v)); }).find("MASTER_PORT='99999'"),
            std::string::npos);
}

TEST(EngineTask, SlurmSingleNodeUsesLoopback) {
  Vars v = {{"SLURM_JOB_ID", "8"},         {"SLURM_STEP_ID", "1"},
            {"SLURM_PROCID", "0"},         {"SLURM_LOCALID", "0"},
            {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_NUM_NODES", "1"},
            {"SLURM_STEP_NODELIST", "n1"}, {"SLURM_STEP_TASKS_PER_NODE", "2"},
            {"SLURMD_NODENAME", "n1"}};
  auto t = detect_engine_task(lookup(v));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->master_addr, "127.0.0.1");
  EXPECT_EQ(t->local_world_size, 2);
}

TEST(EngineTask, BatchScriptIsNotAStep) {
  // sbatch's shell has SLURM_JOB_ID and SLURM_PROCID=0 but no step: not a task of a job.
  Vars v = {
      {"SLURM_JOB_ID", "9"}, {"SLURM_PROCID", "0"}, {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "0"}};
  EXPECT_FALSE(detect_engine_task(lookup(v)));
  EXPECT_FALSE(slurm_step(lookup(v)));
}

TEST(EngineTask, OpenMpiOneNode) {
  Vars v = {{"OMPI_COMM_WORLD_RANK", "1"},
            {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
            {"OMPI_MCA_orte_num_nodes", "1"},
            {"OMPI_MCA_ess_base_jobid", "1186660353"},
            {"OMPI_MCA_orte_hnp_uri", "1186660352.0;tcp://192.0.2.2:46941;tcp6://[fd00::2]:50951"}};
  auto t = detect_engine_task(lookup(v));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->engine, "openmpi");
  EXPECT_EQ(t->rank, 1);
  EXPECT_EQ(t->world_size, 4);
  EXPECT_EQ(t->master_addr, "127.0.0.1");
  EXPECT_EQ(t->master_port, derived_port("openmpi-1186660353"));
}

TEST(EngineTask, OpenMpiSeveralNodesUseMpirunsHost) {
  Vars v = {{"OMPI_COMM_WORLD_RANK", "3"},
            {"OMPI_COMM_WORLD_SIZE", "4"},
            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
            {"OMPI_MCA_orte_num_nodes", "2"},
            {"OMPI_MCA_ess_base_jobid", "5"},
            {"OMPI_MCA_orte_hnp_uri", "4.0;tcp://10.200.0.1,10.1.1.1:46941"}};
  auto t = detect_engine_task(lookup(v));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->master_addr, "10.200.0.1");
  EXPECT_EQ(t->nnodes, 2);
  // Rank 0 that is not on mpirun's host: a clear error, not a hang.
  v["OMPI_COMM_WORLD_RANK"] = "0";
  v["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  v["OMPI_MCA_orte_hnp_uri"] = "4.0;tcp://192.0.2.254:46941";
  std::string msg = usage_error([&] { detect_engine_task(lookup(v)); });
  EXPECT_NE(msg.find("mpirun runs on 192.0.2.254"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MASTER_ADDR"), std::string::npos) << msg;
}

TEST(EngineTask, MpichHydra) {
  Vars v = {
      {"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "3"}};
  auto t = detect_engine_task(lookup(v));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->engine, "mpich");
  EXPECT_EQ(t->rank, 2);
  EXPECT_EQ(t->world_size, 3);
  EXPECT_EQ(t->master_addr, "127.0.0.1");
  v["MPI_LOCALNRANKS"] = "1";
  v["MPI_LOCALRANKID"] = "0";
  std::string msg = usage_error([&] { detect_engine_task(lookup(v)); });
  EXPECT_NE(msg.find("set MASTER_ADDR"), std::string::npos) << msg;
  v["PMI_RANK"] = "x";
  msg = usage_error([&] { detect_engine_task(lookup(v)); });
  EXPECT_NE(msg.find("PMI_RANK='x'"), std::string::npos) << msg;
}

TEST(EngineTask, NoEngine) { EXPECT_FALSE(detect_engine_task(lookup({}))); }

LaunchOptions parse_with(const std::vector<std::string>& flags, const Vars& env) {
  RunArgs a;
  std::vector<std::string> rest = {"prog"};
  // Set the RunArgs fields the way the CLI would for the flags these tests use.
  for (size_t i = 0; i < flags.size(); ++i) {
    const std::string& f = flags[i];
    auto next = [&] { return flags.at(++i); };
    if (f == "--nproc-per-node")
      a.nproc = next();
    else if (f == "--nnodes")
      a.nnodes = next();
    else if (f == "--master-addr")
      a.master_addr = next();
    else if (f == "--hostfile")
      a.hostfile = next();
    else if (f == "-H")
      a.host_list = next();
    else if (f == "--no-slurm")
      a.no_slurm = true;
    else if (f == "--rdzv-backend")
      a.rdzv_backend = next();
    else if (f == "--rdzv-conf")
      a.rdzv_conf = next();
    else if (f == "--local-ranks-filter")
      a.local_ranks_filter = next();
    else if (f == "--duplicate-stdout-filters")
      a.duplicate_stdout_filters = next();
    else if (f == "--duplicate-stderr-filters")
      a.duplicate_stderr_filters = next();
    else
      ADD_FAILURE() << "parse_with does not know " << f;
  }
  return run_args_to_options(a, rest, lookup(env));
}

TEST(RunUnderSlurm, OneAgentPerNodeFromTheStep) {
  Vars v = slurm_task_vars();
  v["SLURM_STEP_NUM_TASKS"] = "2";  // srun --ntasks-per-node=1 on 2 nodes
  v["SLURM_PROCID"] = "1";
  v["SLURM_LOCALID"] = "0";
  LaunchOptions o = parse_with({"--nproc-per-node", "2"}, v);
  EXPECT_EQ(o.engine, "slurm");
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "n1");
  EXPECT_EQ(o.master_port, derived_port("slurm-7.0"));
  EXPECT_EQ(o.rdzv_id, "slurm-7.0");
  ASSERT_EQ(o.hosts.size(), 2u);
  EXPECT_EQ(o.hosts[1].first, "n2");
  // Flags win; --no-slurm ignores Slurm.
  EXPECT_EQ(parse_with({"--nnodes", "1"}, v).engine, "local");
  EXPECT_EQ(parse_with({"--no-slurm"}, v).nnodes, 1);
}

TEST(RunUnderSlurm, SeveralTasksPerNodeIsAClearError) {
  std::string msg = usage_error([] { parse_with({"--nproc-per-node", "2"}, slurm_task_vars()); });
  EXPECT_NE(msg.find("one task per node"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 tasks on 2 node(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--ntasks-per-node=1"), std::string::npos) << msg;
}

// An agent a Ray task started: python/dtrain/ray.py sets DTRAIN_RAY_NODE to
// NODE_RANK:FIRST_LOCAL_RANK:LOCAL_WORLD_SIZE (Ray Train's numbering of the bundles on a node).
TEST(RunUnderRay, TheTasksVariableGivesTheHostsNumbering) {
  LaunchOptions o =
      parse_with({"--nproc-per-node", "2", "--nnodes", "3"}, {{"DTRAIN_RAY_NODE", "1:2:4"}});
  EXPECT_EQ(o.engine, "ray");
  EXPECT_EQ(o.host_rank, 1);
  EXPECT_EQ(o.first_local_rank, 2);
  EXPECT_EQ(o.host_world_size, 4);
  // Without it the same flags are a plain local launch.
  EXPECT_EQ(parse_with({"--nproc-per-node", "2", "--nnodes", "3"}, {}).engine, "local");
}

TEST(RunUnderRay, ABadVariableSaysWhatWasExpected) {
  for (const char* bad : {"1:2", "1", "", "::"}) {
    const std::string msg = usage_error([&] {
      parse_with({"--nproc-per-node", "1", "--nnodes", "2"}, {{"DTRAIN_RAY_NODE", bad}});
    });
    EXPECT_NE(msg.find("DTRAIN_RAY_NODE"), std::string::npos) << bad << ": " << msg;
  }
  std::string msg = usage_error([] {
    parse_with({"--nproc-per-node", "1", "--nnodes", "2"}, {{"DTRAIN_RAY_NODE", "1:2"}});
  });
  EXPECT_NE(msg.find("expected NODE_RANK:FIRST_LOCAL_RANK:LOCAL_WORLD_SIZE"), std::string::npos)
      << msg;
  msg = usage_error([] {
    parse_with({"--nproc-per-node", "1", "--nnodes", "2"}, {{"DTRAIN_RAY_NODE", "x:0:1"}});
  });
  EXPECT_NE(msg.find("'x' is not a non-negative integer"), std::string::npos) << msg;
  msg = usage_error([] {
    parse_with({"--nproc-per-node", "2", "--nnodes", "2"}, {{"DTRAIN_RAY_NODE", "0:3:4"}});
  });
  EXPECT_NE(msg.find("LOCAL_WORLD_SIZE 4 cannot hold local ranks 3..4 (--nproc-per-node 2)"),
            std::string::npos)
      << msg;
}

class HostFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("engine_env_test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& text) {
    std::string p = (dir_ / "hosts").string();
    std::ofstream(p) << text;
    return p;
  }
  std::filesystem::path dir_;
};

TEST_F(HostFile, SlotsCommentsAndBlankLines) {
  auto h =
      parse_hostfile(write("# the job's hosts\nn1 slots=2\n\n  n2   slots=3  # big one\nn3\n"), 1);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0], (std::pair<std::string, int>{"n1", 2}));
  EXPECT_EQ(h[1], (std::pair<std::string, int>{"n2", 3}));
  EXPECT_EQ(h[2], (std::pair<std::string, int>{"n3", 1}));
}

TEST_F(HostFile, BadFilesNameTheLine) {
  std::string p = write("n1 slots=2\nn2 slots=two\n");
  std::string msg = usage_error([&] { parse_hostfile(p, 1); });
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("slots must be a positive integer"), std::string::npos) << msg;
  msg = usage_error([&] { parse_hostfile(write("n1 slots=0\n"), 1); });
  EXPECT_NE(msg.find("got '0'"), std::string::npos) << msg;
  msg = usage_error([&] { parse_hostfile(write("n1 cpus=4\n"), 1); });
  EXPECT_NE(msg.find("unexpected 'cpus=4'"), std::string::npos) << msg;
  msg = usage_error([&] { parse_hostfile(write("# nothing\n\n"), 1); });
  EXPECT_NE(msg.find("no hosts"), std::string::npos) << msg;
  msg = usage_error([&] { parse_hostfile(write("n1\nn1 slots=2\n"), 1); });
  EXPECT_NE(msg.find("'n1' appears twice"), std::string::npos) << msg;
  msg = usage_error([&] { parse_hostfile(write("n1;rm slots=1\n"), 1); });
  EXPECT_NE(msg.find("not a host name"), std::string::npos) << msg;
  msg = usage_error([&] { parse_hostfile((dir_ / "missing").string(), 1); });
  EXPECT_NE(msg.find("cannot read"), std::string::npos) << msg;
}

TEST(HostList, Forms) {
  auto h = parse_host_list("n1:2,n2:2,n3", 1);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[1], (std::pair<std::string, int>{"n2", 2}));
  EXPECT_EQ(h[2], (std::pair<std::string, int>{"n3", 1}));
  std::string msg = usage_error([] { parse_host_list("n1:x", 1); });
  EXPECT_NE(msg.find("slots must be a positive integer"), std::string::npos) << msg;
  msg = usage_error([] { parse_host_list("n1,,n2", 1); });
  EXPECT_NE(msg.find("is not host or host:slots"), std::string::npos) << msg;
}

TEST(HostList, PlanAndAgentArguments) {
  LaunchOptions o = parse_with({"-H", "n1:2,n2:3"}, {});
  EXPECT_EQ(o.engine, "ssh");
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.master_addr, "n1");
  o.program = "/bin/true";
  validate_launch_options(o);
  EXPECT_EQ(o.master_port, 29500);
  auto a = agent_args(o, 1);
  auto has = [&](const std::string& flag, const std::string& value) {
    for (size_t i = 0; i + 1 < a.size(); ++i) {
      if (a[i] == flag && a[i + 1] == value) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("--node-rank", "1"));
  EXPECT_TRUE(has("--nproc-per-node", "3"));
  EXPECT_TRUE(has("--master-addr", "n1"));
  EXPECT_TRUE(has("--nnodes", "2"));
  EXPECT_EQ(a.back(), "/bin/true");
  // --nproc-per-node overrides the slots; loopback masters across hosts are refused.
  EXPECT_EQ(parse_with({"-H", "n1:2,n2:3", "--nproc-per-node", "1"}, {}).hosts[1].second, 1);
  std::string msg = usage_error([] {
    parse_with({"-H", "n1,n2", "--master-addr", "127.0.0.1"}, {});
  });
  EXPECT_NE(msg.find("loopback"), std::string::npos) << msg;
  EXPECT_EQ(parse_with({"-H", "alice@n1:2,n2"}, {}).master_addr, "n1");  // ssh login stripped
  msg = usage_error([] { parse_with({"-H", "n1", "--nnodes", "2"}, {}); });
  EXPECT_NE(msg.find("--nnodes cannot be combined"), std::string::npos) << msg;
}

// What the other hosts' agents are told of the console and the filtered logs is what this
// host's command line said (the round trip through agent_args and the remote parse).
TEST(HostList, AgentsGetTheConsoleFilterAndTheDuplicateFilters) {
  dtrain::test::ScopedEnv env;
  env.set("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}/${rank}]");
  LaunchOptions o =
      parse_with({"-H", "n1:2,n2:2", "--local-ranks-filter", "1,0", "--duplicate-stdout-filters",
                  "loss,,x,acc", "--duplicate-stderr-filters", "Error"},
                 {});
  o.program = "/bin/true";
  validate_launch_options(o);
  auto a = agent_args(o, 1);
  ASSERT_EQ(a.front(), "run");
  LaunchOptions remote = parse_run_args(std::vector<std::string>(a.begin() + 1, a.end()));
  EXPECT_EQ(remote.local_ranks_filter, (std::set<int>{0, 1}));
  EXPECT_EQ(remote.duplicate_stdout_filters, (std::vector<std::string>{"loss,x", "acc"}));
  EXPECT_EQ(remote.duplicate_stderr_filters, (std::vector<std::string>{"Error"}));
  // The line prefix template too, over what the other host's environment says.
  env.set("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${local_rank}>");
  remote = parse_run_args(std::vector<std::string>(a.begin() + 1, a.end()));
  EXPECT_EQ(remote.log_line_prefix_template, "[${role_name}/${rank}]");
}

bool has_pair(const std::vector<std::string>& a, const std::string& flag,
              const std::string& value) {
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    if (a[i] == flag && a[i + 1] == value) return true;
  }
  return false;
}
bool has_flag(const std::vector<std::string>& a, const std::string& flag) {
  return std::find(a.begin(), a.end(), flag) != a.end();
}

// Elastic over ssh (issue #15): one agent per host, all with the same c10d flags.
TEST(HostList, ElasticAgentArguments) {
  LaunchOptions o =
      parse_with({"-H", "n1:2,n2:3", "--nnodes", "1:2", "--rdzv-conf", "last_call_timeout=3"}, {});
  EXPECT_EQ(o.engine, "ssh");
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.rdzv_backend, "c10d");
  o.program = "/bin/true";
  validate_launch_options(o);
  for (int k : {0, 1}) {
    auto a = agent_args(o, k);
    EXPECT_TRUE(has_pair(a, "--nnodes", "1:2"));
    EXPECT_TRUE(has_pair(a, "--rdzv-backend", "c10d"));
    EXPECT_TRUE(has_pair(a, "--rdzv-endpoint", "n1:29500"));
    EXPECT_TRUE(has_pair(a, "--rdzv-conf", "last_call_timeout=3"));
    EXPECT_TRUE(has_pair(a, "--nproc-per-node", k == 0 ? "2" : "3"));
    EXPECT_FALSE(has_flag(a, "--node-rank"));  // given out per round
    EXPECT_FALSE(has_flag(a, "--master-addr"));
    EXPECT_EQ(a.back(), "/bin/true");
  }
  // MAX is the host count (one agent per host); N:N stays a static job.
  std::string msg = usage_error([] { parse_with({"-H", "n1,n2", "--nnodes", "1:3"}, {}); });
  EXPECT_NE(msg.find("the host list has 2 host(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--nnodes 1:2"), std::string::npos) << msg;
  msg = usage_error([] { parse_with({"-H", "n1,n2", "--nnodes", "2"}, {}); });
  EXPECT_NE(msg.find("--nnodes cannot be combined"), std::string::npos) << msg;
  msg = usage_error([] { parse_with({"-H", "n1,n2", "--nnodes", "3:2"}, {}); });
  EXPECT_NE(msg.find("1 <= MIN <= MAX"), std::string::npos) << msg;
}

// Elastic under srun: the step's first host holds the c10d store; no static node ranks.
TEST(RunUnderSlurm, ElasticStepJoinsTheC10dRendezvous) {
  Vars v = slurm_task_vars();
  v["SLURM_STEP_NUM_TASKS"] = "2";
  v["SLURM_PROCID"] = "1";
  v["SLURM_LOCALID"] = "0";
  LaunchOptions o =
      parse_with({"--nproc-per-node", "2", "--nnodes", "1:3", "--rdzv-backend", "c10d"}, v);
  EXPECT_EQ(o.engine, "slurm");
  EXPECT_EQ(o.min_nodes, 1);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.rdzv_backend, "c10d");
  EXPECT_EQ(o.master_addr, "n1");
  EXPECT_EQ(o.master_port, derived_port("slurm-7.0"));
  EXPECT_EQ(o.rdzv_id, "slurm-7.0");
  o.program = "/bin/true";
  validate_launch_options(o);  // accepted: engine slurm may be elastic
  EXPECT_LT(o.node_rank, 0);   // given out per round
  // A step with more nodes than MAX: the srun -N range to use.
  v["SLURM_STEP_NUM_NODES"] = "3";
  v["SLURM_STEP_NUM_TASKS"] = "3";
  v["SLURM_STEP_NODELIST"] = "n[1-3]";
  v["SLURM_STEP_TASKS_PER_NODE"] = "1(x3)";
  std::string msg = usage_error([&] {
    parse_with({"--nnodes", "1:2", "--rdzv-backend", "c10d"}, v);
  });
  EXPECT_NE(msg.find("this step has 3 nodes, more than the maximum; use srun -N 1-2"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace dtrain
