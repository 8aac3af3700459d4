// A Distributor driver for the cluster tests (tests/cluster/distributor_test.sh): runs
// `where` on a cluster engine with local_mode = false and prints every rank's answer.
//   distributor_driver --engine ssh|slurm|mpi [--hosts LIST] [--hostfile F] [--ssh-port P]
//                      [--ssh-identity K] [--ssh-arg A]... [--nodes N] [--nproc N]
//                      [--fail-rank R] [--crash-rank R] [--ifname IF] [--mpi-launcher L]
//                      [--mpi-arg A]... [--program PATH]
//                      [--min-nodes N --max-nodes N --last-call S --heartbeat S --max-restarts N
//                      --kill-agent-on H]
// --kill-agent-on H: elastic drill - in the first attempt, local rank 0 on host H SIGKILLs its
// node's dtrain agent (the topmost `dtrain run` above it) and itself, before the collective.
// --program runs PATH in program mode (Distributor::run(PATH, {})) and prints "program ok".
// Prints "result rank=R host=H sum=S" per rank, or "WorkerError rank=R type=T message=M"
// (an exception) / "WorkerCrash rank=R signal=S host=H" (exit 1), or "UsageError: ..." (exit 2).
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "dtrain/dtrain.h"

namespace {

// argv of process `pid` ("" entries for a process gone).
std::vector<std::string> cmdline(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> argv;
  for (std::string a; std::getline(in, a, '\0');) argv.push_back(a);
  return argv;
}

int parent_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  auto close = line.rfind(')');  // the name may hold spaces
  if (close == std::string::npos) return 0;
  char state = 0;
  int ppid = 0;
  std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid);
  return ppid;
}

// The topmost `dtrain run` process above this one: the node's agent.
int agent_pid() {
  int agent = 0;
  for (int p = ::getppid(); p > 1; p = parent_of(p)) {
    auto argv = cmdline(p);
    if (argv.size() > 1 && argv[1] == "run" && argv[0].ends_with("dtrain")) agent = p;
  }
  return agent;
}

std::string where(int fail_rank, int crash_rank, std::string kill_agent_on) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const char* local_rank = std::getenv("LOCAL_RANK");
  if (!kill_agent_on.empty() && kill_agent_on == host && restart && std::string(restart) == "0" &&
      local_rank && std::string(local_rank) == "0") {
    const int agent = agent_pid();
    if (agent <= 0) throw std::runtime_error("--kill-agent-on: no dtrain agent above this worker");
    ::kill(agent, SIGKILL);
    std::raise(SIGKILL);
  }
  auto pg = dtrain::init_process_group();
  if (pg->rank() == fail_rank) {
    // Before the collective: the other ranks then fail in it too (their peer is gone), and the
    // driver must still name this rank, the first to fail.
    throw std::runtime_error("failing on purpose on rank " + std::to_string(fail_rank) + " at " +
                             host);
  }
  auto t = torch::full({1}, static_cast<double>(pg->rank() + 1), torch::kFloat64);
  dtrain::all_reduce(t);
  // After the collective: the others finish normally, this rank's crash is the only failure.
  if (pg->rank() == crash_rank) std::raise(SIGSEGV);
  return "rank=" + std::to_string(pg->rank()) + " host=" + host +
         " sum=" + std::to_string(static_cast<int>(t.item<double>()));
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);
  dtrain::DistributorOptions o{.num_processes = 4, .local_mode = false};
  int fail_rank = -1;
  int crash_rank = -1;
  std::string program, kill_agent_on;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--engine")
      o.cluster.engine = value;
    else if (flag == "--hosts")
      o.cluster.hosts = value;
    else if (flag == "--hostfile")
      o.cluster.hostfile = value;
    else if (flag == "--ssh-port")
      o.cluster.ssh_port = std::stoi(value);
    else if (flag == "--ssh-identity")
      o.cluster.ssh_identity = value;
    else if (flag == "--ssh-arg")
      o.cluster.ssh_args.push_back(value);
    else if (flag == "--nodes")
      o.cluster.nodes = std::stoi(value);
    else if (flag == "--nproc")
      o.num_processes = std::stoi(value);
    else if (flag == "--fail-rank")
      fail_rank = std::stoi(value);
    else if (flag == "--crash-rank")
      crash_rank = std::stoi(value);
    else if (flag == "--program")
      program = value;
    else if (flag == "--ifname")
      o.cluster.ifname = value;
    else if (flag == "--mpi-launcher")
      o.cluster.mpi_launcher = value;
    else if (flag == "--mpi-arg")
      o.cluster.mpi_args.push_back(value);
    else if (flag == "--min-nodes")
      o.cluster.min_nodes = std::stoi(value);
    else if (flag == "--max-nodes")
      o.cluster.max_nodes = std::stoi(value);
    else if (flag == "--last-call")
      o.cluster.last_call = std::chrono::milliseconds(std::stoi(value) * 1000);
    else if (flag == "--heartbeat")
      o.cluster.heartbeat_timeout = std::chrono::milliseconds(std::stoi(value) * 1000);
    else if (flag == "--max-restarts")
      o.max_restarts = std::stoi(value);
    else if (flag == "--kill-agent-on")
      kill_agent_on = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    dtrain::Distributor d(o);
    if (!program.empty()) {
      d.run(program, {});
      std::printf("program ok\n");
      return 0;
    }
    auto results = d.run_all(where, fail_rank, crash_rank, kill_agent_on);
    for (const auto& r : results) std::printf("result %s\n", r.c_str());
    return 0;
  } catch (const dtrain::WorkerError& e) {
    if (e.signal() > 0) {
      std::printf("WorkerCrash rank=%d signal=%d host=%s\n", e.rank(), e.signal(),
                  e.details().host.c_str());
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
    std::printf("WorkerError rank=%d type=%s message=%s\n", e.rank(), e.exception_type().c_str(),
                e.exception_message().c_str());
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const dtrain::UsageError& e) {
    std::printf("UsageError: %s\n", e.what());
    return 2;
  }
}
