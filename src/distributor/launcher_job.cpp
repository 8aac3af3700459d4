// The Distributor's job: the command on its engine (local, or a cluster engine from
// src/engines/) and the launcher process run to its end.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/params.h"
#include "core/paths.h"
#include "distributor/internal.h"
#include "tracking/driver_run.h"

extern char** environ;

namespace dtrain::distributor {
namespace {

std::optional<std::string> find_on_path(const std::string& name) {
  std::string found = find_in_path(name);
  if (found.empty()) return std::nullopt;
  return found;
}

int wait_exit(pid_t pid, int* status, std::chrono::milliseconds timeout) {
  // pidfd: sleep in poll() until the child exits or the deadline passes.
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  // A "forever" timeout (milliseconds::max()) must not overflow the clock: 10 years is enough.
  auto deadline = std::chrono::steady_clock::now() +
                  std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 3650));
  for (;;) {
    pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid) {
      if (fd >= 0) ::close(fd);
      return 1;
    }
    if (r < 0 && errno != EINTR) {
      if (fd >= 0) ::close(fd);
      throw Error(std::string("waitpid: ") + std::strerror(errno));
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      if (fd >= 0) ::close(fd);
      return 0;
    }
    if (fd >= 0) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    } else {
      ::usleep(2000);
    }
  }
}

}  // namespace

std::string find_launcher(const std::string& configured) {
  if (!configured.empty()) {
    if (!is_executable_file(configured)) {
      throw UsageError("DistributorOptions::launcher: '" + configured +
                       "' is not an executable file; point it at the `dtrain` command");
    }
    return configured;
  }
  if (const auto env = param::kLauncher.get_if_set()) {
    if (!is_executable_file(*env)) {
      throw UsageError("DTRAIN_LAUNCHER: '" + *env +
                       "' is not an executable file; point it at the `dtrain` command or unset it");
    }
    return *env;
  }
#ifdef DTRAIN_LAUNCHER_BUILD_PATH
  if (is_executable_file(DTRAIN_LAUNCHER_BUILD_PATH)) return DTRAIN_LAUNCHER_BUILD_PATH;
#endif
#ifdef DTRAIN_LAUNCHER_INSTALL_PATH
  if (is_executable_file(DTRAIN_LAUNCHER_INSTALL_PATH)) return DTRAIN_LAUNCHER_INSTALL_PATH;
#endif
  if (auto found = find_on_path("dtrain")) return *found;
  throw UsageError(
      "cannot find the `dtrain` launcher (looked at $DTRAIN_LAUNCHER, where dtrain was built "
      "and installed, and PATH); install dtrain or set DTRAIN_LAUNCHER to its path");
}

std::string self_executable() {
  const SelfExe self = self_exe();
  if (self.deleted) {
    throw UsageError("this program's binary (" + self.path +
                     ") was deleted or replaced since it started, so workers cannot re-execute it; "
                     "restart the program");
  }
  return self.path;
}

std::string unique_id() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "distributor-%d-%d-%08x", static_cast<int>(::getpid()),
                counter.fetch_add(1), rd());
  return buf;
}

std::string format_seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

Outcome run_launcher(const Job& job, const std::string& failure_file, const DistributorOptions& o) {
  // Everything the child needs is built before fork(): between fork and exec it only makes
  // async-signal-safe calls (this process may run libtorch's threads).
  std::vector<std::string> env_strings;
  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s(*e);
    auto eq = s.find('=');
    if (eq == std::string::npos) continue;
    env_map[s.substr(0, eq)] = s.substr(eq + 1);
  }
  for (const auto& name : job.unset) env_map.erase(name);
  // PET_<OPTION> stands in for `dtrain run`'s options, as for torchrun's (Kubeflow's
  // PyTorchJob sets them for the launcher of its pod); the Distributor chose every option of
  // its job itself.
  std::erase_if(env_map, [](const auto& kv) { return kv.first.rfind("PET_", 0) == 0; });
  for (const auto& [k, v] : job.env) env_map[k] = v;
  tracking::DriverRun driver_run(env_map);  // MLflow: the driver's run; rank 0's run nests under it
  for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = job.argv;
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(exec_pipe[0]);
    ::close(exec_pipe[1]);
    throw Error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // The launcher must not outlive the driver: SIGTERM makes it stop its workers.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    int err = errno;
    ssize_t ignored = ::write(exec_pipe[1], &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  }
  ::close(exec_pipe[1]);
  int err = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (n == sizeof err) {
    int status;
    ::waitpid(pid, &status, 0);
    throw Error("cannot start the dtrain launcher " + job.argv[0] + ": " + std::strerror(err));
  }

  Outcome out;
  int status = 0;
  if (!wait_exit(pid, &status, o.timeout)) {
    out.timed_out = true;
    ::kill(pid, SIGTERM);  // the launcher stops its workers (SIGTERM, then SIGKILL) and exits
    if (!wait_exit(pid, &status, o.term_timeout + std::chrono::seconds(10))) {
      ::kill(pid, SIGKILL);  // its guard process still kills every worker
      ::waitpid(pid, &status, 0);
    }
  }
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  out.failure = launch::Failure::read_file(failure_file);
  // Written for each failed attempt: an earlier attempt's, when the last one ended otherwise
  // (the launcher was stopped by a signal).
  if (out.failure && out.failure->exit_code != out.exit_code) out.failure.reset();
  driver_run.end(out.exit_code, out.timed_out);
  return out;
}

// The command of a job. An engine with agents runs `dtrain run` on each node: its own command
// up to the launcher (srun ..., spark-submit ...), the flags every job gets, then its own flags;
// an engine without agents (mpi) starts the workers itself. `task`: function mode's
// DTRAIN_DISTRIBUTOR_TASK, "" for a program.
Job make_job(const DistributorOptions& o, const engines::Placement& placement,
             const std::string& run_id, const std::string& failure_file,
             const std::string& cuda_visible_devices, const std::string& task) {
  const engines::Engine& engine = engines::for_job(o);
  if (!engine.runs_agents()) {
    engines::Command c = engine.workers_command({o, placement, "", task});
    return Job{std::move(c.argv), std::move(c.env), std::move(c.unset)};
  }
  const engines::JobRequest request{o, placement, find_launcher(o.launcher), task, run_id};
  engines::Command prefix = engine.agents_command(request);
  Job job;
  job.argv = std::move(prefix.argv);
  job.argv.push_back("run");
  const detail::ElasticPlan& elastic = placement.elastic;
  job.argv.insert(job.argv.end(), elastic.run_args.begin(), elastic.run_args.end());
  if (placement.nproc_per_node > 0) {
    job.argv.insert(job.argv.end(), {"--nproc-per-node", std::to_string(placement.nproc_per_node)});
  }
  job.argv.insert(job.argv.end(), {"--rdzv-id", run_id, "--failure-file", failure_file,
                                   "--max-restarts", std::to_string(o.max_restarts),
                                   "--term-timeout", format_seconds(o.term_timeout)});
  engine.add_run_flags(request, job.argv);
  if (!o.local_mode) {
    const ClusterOptions& c = o.cluster;
    if (!c.ifname.empty()) job.argv.insert(job.argv.end(), {"--ifname", c.ifname});
    // Remote agents get only what --env passes on.
    for (const auto& [k, v] : o.env) job.argv.push_back("--env=" + k + "=" + v);
  }
  if (o.malloc_hugepages) job.argv.push_back("--malloc-hugepages");
  if (!o.log_dir.empty()) {
    // Every rank's full output (DistributorOptions::log_dir): `dtrain run`, as torchrun, writes
    // only the streams --redirects or --tee names to the log files.
    for (const std::string& a :
         {std::string("--log-dir"), o.log_dir, std::string("--tee"), std::string("3")})
      job.argv.push_back(a);
  }
  job.env = o.env;
  for (auto& [k, v] : prefix.env) job.env.emplace(k, v);
  // One thread per process unless set, whatever the count: `dtrain run` (as torchrun) leaves a
  // single worker libtorch's default, but a Distributor's jobs (a search's trials) share the
  // host's cores as Ray Tune's trials share them.
  if (!job.env.count("OMP_NUM_THREADS") && !std::getenv("OMP_NUM_THREADS"))
    job.env.emplace("OMP_NUM_THREADS", "1");
  if (!cuda_visible_devices.empty()) job.env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices;
  job.unset.push_back(kTaskVariable);
  return job;
}

}  // namespace dtrain::distributor
