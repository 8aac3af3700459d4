// Distributor: the driver side (start the launcher, host the call's store, read the outcome)
// and the worker side (dtrain::init: find the function, run it, send the result).
#include "dtrain/distributor.h"

#include <arpa/inet.h>
#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/cuda.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "dtrain/engine_env.h"
#include "dtrain/env.h"
#include "dtrain/process_group.h"
#include "dtrain/store.h"
#include "engines/engine.h"
#include "launch/failure.h"
#include "launch/options_internal.h"
#include "tracking/driver_run.h"

namespace dtrain {

using json = nlohmann::json;

namespace {

constexpr const char* kTaskVariable = engines::kDistributorTaskVariable;

// DTRAIN_DISTRIBUTOR_TASK = HOST:PORT:RUN_ID, split from the right (HOST may be IPv6).
struct TaskSpec {
  std::string host;
  int port = 0;
  std::string id;
  std::string prefix() const { return "/distributor/" + id + "/"; }
};
std::optional<TaskSpec> parse_task(const std::string& spec) {
  auto last = spec.rfind(':');
  if (last == std::string::npos || last == 0) return std::nullopt;
  auto mid = spec.rfind(':', last - 1);
  if (mid == std::string::npos || mid == 0) return std::nullopt;
  TaskSpec t;
  t.host = spec.substr(0, mid);
  t.id = spec.substr(last + 1);
  try {
    t.port = std::stoi(spec.substr(mid + 1, last - mid - 1));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (t.port <= 0 || t.port > 65535 || t.id.empty()) return std::nullopt;
  return t;
}

// The store keys of one attempt (restart) of a call.
std::string attempt_prefix(const std::string& prefix, int attempt) {
  return prefix + "attempt_" + std::to_string(attempt) + "/";
}

std::mutex g_argv_mutex;
std::vector<std::string> g_argv;  // set by init(); empty: init() was never called
bool g_in_worker = false;         // true while a worker runs the user's function

std::string signal_abbrev(int sig) {
  const char* name = ::sigabbrev_np(sig);
  return name ? std::string("SIG") + name : "signal " + std::to_string(sig);
}

std::string demangle(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && out) ? out : name;
  std::free(out);
  return s;
}

// ---- finding code in the loaded objects --------------------------------------------------

std::string build_id_of(const dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
          std::memcmp(name, "GNU", 4) == 0) {
        std::string hex;
        static const char* digits = "0123456789abcdef";
        for (unsigned k = 0; k < note->n_descsz; ++k) {
          auto b = static_cast<unsigned char>(desc[k]);
          hex += digits[b >> 4];
          hex += digits[b & 15];
        }
        return hex;
      }
      p = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return "";
}

struct Search {
  std::uintptr_t address = 0;            // locate: the address to find
  const detail::CodeRef* ref = nullptr;  // resolve: the object to find
  int index = 0;
  bool found = false;
  detail::CodeRef result;
  std::uintptr_t base = 0;
  std::string build_id;
};

int locate_callback(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  const int index = s->index++;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (s->address >= lo && s->address < lo + ph.p_memsz) {
      s->found = true;
      s->result.main_program = index == 0;
      s->result.object = info->dlpi_name ? info->dlpi_name : "";
      s->result.offset = s->address - info->dlpi_addr;
      s->result.build_id = build_id_of(info);
      return 1;
    }
  }
  return 0;
}

int resolve_callback(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  const int index = s->index++;
  const bool match = s->ref->main_program
                         ? index == 0
                         : (info->dlpi_name != nullptr && s->ref->object == info->dlpi_name);
  if (!match) return 0;
  s->found = true;
  s->base = info->dlpi_addr;
  s->build_id = build_id_of(info);
  return 1;
}

json to_json(const detail::CodeRef& r) {
  return {{"main", r.main_program},
          {"object", r.object},
          {"offset", r.offset},
          {"build_id", r.build_id}};
}

detail::CodeRef code_ref_from_json(const json& j) {
  detail::CodeRef r;
  r.main_program = j.at("main").get<bool>();
  r.object = j.at("object").get<std::string>();
  r.offset = j.at("offset").get<std::uintptr_t>();
  r.build_id = j.at("build_id").get<std::string>();
  return r;
}

void* resolve_code(const detail::CodeRef& ref) {
  Search s;
  s.ref = &ref;
  ::dl_iterate_phdr(resolve_callback, &s);
  const std::string what = ref.main_program ? "the program" : "'" + ref.object + "'";
  if (!s.found) {
    throw UsageError("the function to run lives in " + what +
                     ", which this worker has not loaded; the function must be in the "
                     "program or a library it links (not one loaded later with dlopen)");
  }
  if (s.build_id != ref.build_id) {
    throw UsageError("this worker's copy of " + what + " (build id " +
                     (s.build_id.empty() ? "none" : s.build_id) +
                     ") is not the one the driver runs (build id " +
                     (ref.build_id.empty() ? "none" : ref.build_id) +
                     "); was it rebuilt while the driver ran? Restart the driver");
  }
  return reinterpret_cast<void*>(s.base + ref.offset);
}

// ---- the launcher -----------------------------------------------------------------------

bool executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0;
}

std::optional<std::string> find_on_path(const std::string& name) {
  std::string found = find_in_path(name);
  if (found.empty()) return std::nullopt;
  return found;
}

std::string find_launcher(const std::string& configured) {
  if (!configured.empty()) {
    if (!executable(configured)) {
      throw UsageError("DistributorOptions::launcher: '" + configured +
                       "' is not an executable file; point it at the `dtrain` command");
    }
    return configured;
  }
  if (const char* env = std::getenv("DTRAIN_LAUNCHER"); env && *env) {
    if (!executable(env)) {
      throw UsageError(std::string("DTRAIN_LAUNCHER: '") + env +
                       "' is not an executable file; point it at the `dtrain` command or unset it");
    }
    return env;
  }
#ifdef DTRAIN_LAUNCHER_BUILD_PATH
  if (executable(DTRAIN_LAUNCHER_BUILD_PATH)) return DTRAIN_LAUNCHER_BUILD_PATH;
#endif
#ifdef DTRAIN_LAUNCHER_INSTALL_PATH
  if (executable(DTRAIN_LAUNCHER_INSTALL_PATH)) return DTRAIN_LAUNCHER_INSTALL_PATH;
#endif
  if (auto found = find_on_path("dtrain")) return *found;
  throw UsageError(
      "cannot find the `dtrain` launcher (looked at $DTRAIN_LAUNCHER, where dtrain was built "
      "and installed, and PATH); install dtrain or set DTRAIN_LAUNCHER to its path");
}

std::string self_executable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot read /proc/self/exe: " + ec.message());
  std::string s = path.string();
  const std::string deleted = " (deleted)";
  if (s.size() > deleted.size() &&
      s.compare(s.size() - deleted.size(), deleted.size(), deleted) == 0) {
    throw UsageError("this program's binary (" + s.substr(0, s.size() - deleted.size()) +
                     ") was deleted or replaced since it started, so workers cannot re-execute it; "
                     "restart the program");
  }
  return s;
}

std::string unique_id() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "distributor-%d-%d-%08x", static_cast<int>(::getpid()),
                counter.fetch_add(1), rd());
  return buf;
}

struct Job {
  std::vector<std::string> argv;           // the launcher's command line
  std::map<std::string, std::string> env;  // set (or, if value is empty and unset_ true, cleared)
  std::vector<std::string> unset;          // variables the launcher must not inherit
};

struct Outcome {
  bool timed_out = false;
  int exit_code = 0;                       // the launcher's
  std::optional<launch::Failure> failure;  // the root cause the agents agreed on
};

// A temporary directory removed on destruction.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "dtrain-distributor-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw Error("cannot create a temporary directory: " + std::string(std::strerror(errno)));
    }
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

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

std::string format_seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// Throws the error that `out` describes (never returns).
[[noreturn]] void throw_failure(const Outcome& out, const DistributorOptions& o,
                                const std::optional<json>& exception) {
  if (out.timed_out) {
    throw TimeoutError("Distributor.run: the job did not finish within " +
                       format_seconds(o.timeout) +
                       " s (DistributorOptions::timeout); its workers were stopped");
  }
  WorkerError::Details d;
  d.exit_code = out.exit_code;
  if (out.failure) {
    const launch::Failure& f = *out.failure;
    d.rank = f.rank;
    d.local_rank = f.local_rank;
    d.host = f.host;
    d.exit_code = f.exit_code;
    d.signal = f.signal;
    d.stderr_tail = f.stderr_tail;
    if (d.rank < 0) {
      d.exception_message = f.reason;
    }
  } else if (auto why = engines::for_job(o).explain_exit(o.cluster, out.exit_code)) {
    d.exception_message = *why;
  } else if (out.exit_code > 128) {
    d.exception_message = "the launcher was stopped by " + signal_abbrev(out.exit_code - 128);
  } else {
    d.exception_message =
        "the launcher exited with code " + std::to_string(out.exit_code) +
        " and no worker reported an exception (its messages are above, on stderr)";
  }
  if (exception) {
    d.exception_type = exception->value("type", "");
    d.exception_message = exception->value("message", "");
  }
  throw WorkerError(std::move(d));
}

}  // namespace

// ---- WorkerError --------------------------------------------------------------------------

namespace {
std::string describe(const WorkerError::Details& d) {
  std::ostringstream s;
  if (d.rank >= 0) {
    s << "rank " << d.rank;
    if (!d.host.empty()) s << " (local rank " << d.local_rank << " on " << d.host << ")";
    s << " failed: ";
    if (!d.exception_type.empty()) {
      s << "it threw " << d.exception_type << ": " << d.exception_message << " (exit code "
        << d.exit_code << ")";
    } else if (d.signal > 0) {
      s << "it died of " << signal_abbrev(d.signal) << " (exit code " << d.exit_code << ")";
    } else if (!d.exception_message.empty()) {
      s << d.exception_message << " (exit code " << d.exit_code << ")";
    } else {
      s << "it exited with code " << d.exit_code;
    }
  } else {
    s << "the job failed: "
      << (d.exception_message.empty() ? "unknown reason" : d.exception_message) << " (exit code "
      << d.exit_code << ")";
  }
  if (d.rank >= 0) {
    if (d.stderr_tail.empty()) {
      s << "\n  its stderr was empty";
    } else {
      s << "\n  last " << d.stderr_tail.size() << " line(s) of rank " << d.rank << "'s stderr:";
      for (const auto& l : d.stderr_tail) s << "\n    " << l;
    }
  }
  return s.str();
}
}  // namespace

WorkerError::WorkerError(Details details) : Error(describe(details)), d_(std::move(details)) {}

// ---- devices ------------------------------------------------------------------------------

namespace detail {

CodeRef locate_code(const void* address) {
  Search s;
  s.address = reinterpret_cast<std::uintptr_t>(address);
  ::dl_iterate_phdr(locate_callback, &s);
  DTRAIN_ASSERT(s.found, "no loaded object contains the function's address");
  return s.result;
}

DevicePlan plan_devices(int num_processes, bool local_mode, bool use_gpu,
                        const std::vector<std::string>& devices) {
  if (num_processes <= 0) {
    throw UsageError("DistributorOptions::num_processes must be at least 1, got " +
                     std::to_string(num_processes));
  }
  DevicePlan plan;
  plan.num_processes = num_processes;
  // On a cluster the GPUs that count are the nodes', not the driver's: nothing to check here.
  if (!use_gpu || !local_mode) return plan;
  if (devices.empty()) {
    throw UsageError(
        "DistributorOptions::use_gpu is true but no CUDA device is visible (this libtorch has no "
        "CUDA, no GPU is present, or CUDA_VISIBLE_DEVICES hides them); set use_gpu = false to "
        "train on the CPU");
  }
  size_t n = static_cast<size_t>(num_processes);
  if (local_mode && n > devices.size()) {
    plan.warning = "num_processes " + std::to_string(num_processes) + " is more than the " +
                   std::to_string(devices.size()) + " GPU(s) here; using " +
                   std::to_string(devices.size()) + " process(es), one per GPU";
    n = devices.size();
    plan.num_processes = static_cast<int>(n);
  }
  for (size_t i = 0; i < n; ++i) plan.cuda_visible_devices += (i ? "," : "") + devices[i];
  return plan;
}

}  // namespace detail

// ---- Distributor (driver) -----------------------------------------------------------------

Distributor::Distributor(DistributorOptions options) : options_(std::move(options)) {
  std::vector<std::string> devices;
  if (options_.use_gpu && options_.local_mode) {
    const int count = static_cast<int>(torch::cuda::device_count());
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible && *visible) {
      std::istringstream in(visible);
      for (std::string d; std::getline(in, d, ',') && static_cast<int>(devices.size()) < count;) {
        devices.push_back(d);
      }
    } else {
      for (int i = 0; i < count; ++i) devices.push_back(std::to_string(i));
    }
  }
  auto plan =
      detail::plan_devices(options_.num_processes, options_.local_mode, options_.use_gpu, devices);
  if (!plan.warning.empty()) std::cerr << "dtrain: Distributor: " << plan.warning << std::endl;
  options_.num_processes = plan.num_processes;
  nproc_per_node_ = plan.num_processes;
  cuda_visible_devices_ = plan.cuda_visible_devices;
  // The engine checks its options and places the ranks (local mode: plan_elastic throws when
  // min/max nodes are set).
  const engines::Placement placement = engines::for_job(options_).place(options_);
  nproc_per_node_ = placement.nproc_per_node;
  hosts_ = placement.hosts;
  elastic_ = placement.elastic;
  if (options_.timeout.count() <= 0) {
    throw UsageError("DistributorOptions::timeout must be positive, got " +
                     std::to_string(options_.timeout.count()) + " ms");
  }
  if (options_.max_restarts < 0) {
    throw UsageError("DistributorOptions::max_restarts must be >= 0, got " +
                     std::to_string(options_.max_restarts));
  }
}

std::string Distributor::driver_address() const {
  if (options_.local_mode) return "127.0.0.1";
  if (!options_.cluster.driver_addr.empty()) return options_.cluster.driver_addr;
  return engines::for_job(options_).driver_address(options_, {nproc_per_node_, hosts_, elastic_});
}

namespace {

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
  const engines::JobRequest request{o, placement, find_launcher(o.launcher), task};
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
    job.argv.push_back("--log-dir");
    job.argv.push_back(o.log_dir);
  }
  job.env = o.env;
  for (auto& [k, v] : prefix.env) job.env.emplace(k, v);
  if (!cuda_visible_devices.empty()) job.env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices;
  job.unset.push_back(kTaskVariable);
  return job;
}

// In a worker whose main() did not call init(): tell the driver why, and stop.
[[noreturn]] void fail_uninitialised_worker(const char* task) {
  const std::string message =
      "this program was started as a Distributor worker, but main() reached a Distributor "
      "without calling dtrain::init(argc, argv) first; add `dtrain::init(argc, argv);` as the "
      "first line of main()";
  std::cerr << "dtrain: " << message << std::endl;
  try {
    if (auto t = parse_task(task)) {
      auto client =
          store::StoreClient::connect(t->host, static_cast<std::uint16_t>(t->port),
                                      {std::chrono::seconds(10), std::chrono::seconds(10)});
      auto env = WorkerEnv::from_environ();
      if (!env) env = engine_worker_env();
      const std::string error = json{
          {"rank", env ? env->rank : 0},
          {"type", "dtrain::UsageError"},
          {"message", message}}.dump();
      const std::string p = attempt_prefix(t->prefix(), env ? env->restart_count : 0);
      client->compare_set(p + "first_error", "", error);
    }
  } catch (const std::exception&) {
  }
  std::fflush(nullptr);
  ::_exit(2);
}

}  // namespace

std::vector<std::string> Distributor::run_function(const void* fn, const void* trampoline,
                                                   std::string args, bool all_ranks) {
  if (g_in_worker) {
    throw UsageError(
        "Distributor::run was called inside a Distributor worker; nested runs are "
        "not supported: run the inner work in the same workers instead");
  }
  if (const char* task = std::getenv(kTaskVariable)) fail_uninitialised_worker(task);
  std::vector<std::string> self_args;
  {
    std::lock_guard<std::mutex> lock(g_argv_mutex);
    self_args = g_argv;
  }
  if (self_args.empty()) {
    throw UsageError(
        "call dtrain::init(argc, argv) first thing in main() before Distributor::run with a "
        "function: the workers re-execute this program, and dtrain::init is where they take over");
  }
  const detail::CodeRef fn_ref = detail::locate_code(fn);
  const detail::CodeRef tramp_ref = detail::locate_code(trampoline);

  // The call's own store: arguments out, results and exceptions back.
  const std::string addr = options_.local_mode ? "127.0.0.1" : driver_address();
  auto server = store::StoreServer::start({options_.local_mode ? "127.0.0.1" : "", 0});
  auto client = store::StoreClient::connect("127.0.0.1", server->port(),
                                            {std::chrono::seconds(10), std::chrono::seconds(60)});
  const std::string run_id = unique_id();
  const std::string prefix = "/distributor/" + run_id + "/";
  client->set(
      prefix + "call",
      json{{"fn", to_json(fn_ref)}, {"trampoline", to_json(tramp_ref)}, {"all_ranks", all_ranks}}
          .dump());
  client->set(prefix + "args", args);
  std::string().swap(args);

  TempDir tmp;
  const std::string failure_file = tmp.path + "/failure.json";
  const std::string task = addr + ":" + std::to_string(server->port()) + ":" + run_id;
  const bool agents = engines::for_job(options_).runs_agents();
  Job job = make_job(options_, engines::Placement{nproc_per_node_, hosts_, elastic_}, run_id,
                     failure_file, cuda_visible_devices_, task);
  if (agents) job.argv.push_back("--no-python");
  job.argv.push_back(self_executable());
  job.argv.insert(job.argv.end(), self_args.begin() + 1, self_args.end());
  job.env[kTaskVariable] = task;
  if (!options_.local_mode && agents) {
    // Before PROGRAM: the launcher's own flags, for the agents on the other hosts. The
    // failure file is written on whichever host reports the failure; the root cause also
    // comes back through the call's store.
    auto program = std::find(job.argv.begin(), job.argv.end(), "--no-python");
    program = job.argv.insert(program, "--env=" + std::string(kTaskVariable) + "=" + task) + 1;
    const std::string host = addr.find(':') != std::string::npos ? "[" + addr + "]" : addr;
    job.argv.insert(program, "--failure-store=" + host + ":" + std::to_string(server->port()) +
                                 "/" + prefix + "failure");
  }

  Outcome out = run_launcher(job, failure_file, options_);
  // The attempt whose every rank returned: its results are the call's.
  std::optional<json> finished;
  bool all_returned = false;
  if (client->check({prefix + "finished"})) {
    finished = json::parse(client->get(prefix + "finished"));
    const std::string done = attempt_prefix(prefix, finished->at("attempt").get<int>()) + "done";
    all_returned = client->add(done, 0) >= finished->at("world_size").get<int>();
  }
  if (elastic_.elastic && all_returned && out.exit_code != 0 && !out.timed_out) {
    // An elastic job on Slurm: srun's exit code counts the task of a node lost on the way,
    // while the survivors finished the call (every rank of the last attempt returned).
    out = Outcome{};
  }
  if (!out.failure && client->check({prefix + "failure"})) {
    out.failure = launch::Failure::parse(client->get(prefix + "failure"));
    // An earlier attempt's, when the last one ended otherwise (stopped by a signal).
    if (out.failure && out.failure->exit_code != out.exit_code) out.failure.reset();
  }
  if (out.timed_out || out.exit_code != 0) {
    // The last attempt's first exception (peers that fail after it, e.g. in a collective
    // whose connection it closed, only report second).
    std::optional<json> first;
    // An elastic job's rounds also go up when nodes join or leave (not counted as restarts).
    const int last = options_.max_restarts + (elastic_.elastic ? 2 * elastic_.max_nodes : 0);
    for (int attempt = last; attempt >= 0 && !first; --attempt) {
      const std::string key = attempt_prefix(prefix, attempt) + "first_error";
      if (client->check({key})) first = json::parse(client->get(key));
    }
    std::optional<json> exception;
    int rank = out.failure ? out.failure->rank : -1;
    if (first && rank >= 0 && first->value("rank", -1) != rank && out.failure->signal == 0 &&
        !out.timed_out) {
      // The launcher orders failures by when it saw processes exit, which can put a peer that
      // failed because of the first thrower (its collective lost the connection) ahead of it;
      // the store orders the exceptions themselves (the first compare_set wins). So a first
      // exception that is not itself a lost peer or a timeout is the root cause. A rank killed
      // by a signal threw nothing: the launcher's pick stands then.
      const std::string type = first->value("type", "");
      if (type != "dtrain::NetworkError" && type != "dtrain::TimeoutError") {
        rank = first->value("rank", -1);
        out.failure = launch::Failure{.rank = rank, .exit_code = out.exit_code};
      }
    }
    if (first && (rank < 0 || first->value("rank", -1) == rank)) {
      exception = first;
      // No root cause from the launcher (MPI has no agent): the first rank that threw is it.
      if (rank < 0 && !out.timed_out)
        out.failure = launch::Failure{.rank = first->value("rank", -1), .exit_code = out.exit_code};
    }
    throw_failure(out, options_, exception);
  }
  std::vector<std::string> results;
  // An elastic job may finish at a smaller world size than num_processes.
  const int world = finished ? finished->at("world_size").get<int>() : options_.num_processes;
  const std::string attempt =
      attempt_prefix(prefix, finished ? finished->at("attempt").get<int>() : 0);
  const int n = all_ranks ? world : 1;
  for (int r = 0; r < n; ++r) {
    const std::string key = attempt + "result/" + std::to_string(r);
    if (!client->check({key})) {
      throw WorkerError(WorkerError::Details{
          .rank = r,
          .exit_code = 0,
          .exception_message = "it exited with code 0 without returning a result (did the "
                               "function call exit()?)"});
    }
    results.push_back(client->get(key));
  }
  return results;
}

void Distributor::run(const std::string& program, const std::vector<std::string>& args) {
  if (std::getenv(kTaskVariable) && !g_in_worker)
    fail_uninitialised_worker(std::getenv(kTaskVariable));
  if (program.empty())
    throw UsageError("Distributor::run: the program is empty; give a path or a name on PATH");
  TempDir tmp;
  const std::string failure_file = tmp.path + "/failure.json";
  const bool agents = engines::for_job(options_).runs_agents();
  Job job = make_job(options_, engines::Placement{nproc_per_node_, hosts_, elastic_}, unique_id(),
                     failure_file, cuda_visible_devices_, "");
  if (program[0] == '-') {
    throw UsageError("Distributor::run('" + program +
                     "'): a program name cannot start with '-'; "
                     "use ./" +
                     program);
  }
  if (!agents && program.size() > 3 && program.ends_with(".py")) {
    // What the launcher does for a .py: the MPI launcher would execute the script itself.
    const char* python = std::getenv("DTRAIN_PYTHON");
    job.argv.insert(job.argv.end(), {python && *python ? python : "python3", "-u"});
  }
  job.argv.push_back(program);
  job.argv.insert(job.argv.end(), args.begin(), args.end());
  Outcome out = run_launcher(job, failure_file, options_);
  if (out.exit_code == 2 && !out.failure && !out.timed_out && agents) {
    throw UsageError("Distributor::run('" + program +
                     "'): the launcher rejected the job (exit code 2; its message is above on "
                     "stderr): is the program path right and executable?");
  }
  if (out.timed_out || out.exit_code != 0) throw_failure(out, options_, std::nullopt);
}

// ---- the worker side ------------------------------------------------------------------------

namespace {

int worker_main(const std::string& spec) {
  auto task = parse_task(spec);
  if (!task) {
    std::cerr << "dtrain: " << kTaskVariable << "='" << spec
              << "' is malformed (expected HOST:PORT:ID); it is set by the Distributor only"
              << std::endl;
    return 2;
  }
  const std::string prefix = task->prefix();
  auto env = WorkerEnv::from_environ();
  if (!env) env = engine_worker_env();  // started by mpirun/srun directly
  const int rank = env ? env->rank : 0;
  const std::string attempt = attempt_prefix(prefix, env ? env->restart_count : 0);
  auto client = store::StoreClient::connect(task->host, static_cast<std::uint16_t>(task->port),
                                            {std::chrono::seconds(60), std::chrono::seconds(60)});
  auto report = [&](const std::string& type, const std::string& message) {
    std::cerr << "dtrain: rank " << rank << ": the function threw " << type << ": " << message
              << std::endl;
    try {
      // The first report of this attempt wins; compare_set answers, so it has been applied
      // before this process exits.
      client->compare_set(attempt + "first_error", "",
                          json{{"rank", rank}, {"type", type}, {"message", message}}.dump());
    } catch (const std::exception&) {
    }
  };

  const json call = json::parse(client->get(prefix + "call"));
  void* fn = nullptr;
  detail::Trampoline trampoline = nullptr;
  try {
    fn = resolve_code(code_ref_from_json(call.at("fn")));
    trampoline = reinterpret_cast<detail::Trampoline>(
        resolve_code(code_ref_from_json(call.at("trampoline"))));
  } catch (const UsageError& e) {
    report("dtrain::UsageError", e.what());
    return 2;
  }
  const bool all_ranks = call.at("all_ranks").get<bool>();
  std::string args = client->get(prefix + "args");
  Encoder result;
  g_in_worker = true;
  try {
    Decoder in(args);
    trampoline(fn, in, result);
  } catch (const std::exception& e) {
    const std::string type = demangle(typeid(e).name());
    // dtrain::tune::report()'s TrialStopped: the Tuner ended this run (a scheduler's STOP, or
    // PBT's PAUSE to free the slot). Not a failure: exit 0 without a result, so the launcher
    // prints no root cause; the Tuner knows why the run ended.
    if (type == "dtrain::tune::TrialStopped") return 0;
    report(type, e.what());
    return 1;
  } catch (...) {
    auto* type = abi::__cxa_current_exception_type();
    report(type ? demangle(type->name()) : "an unknown exception", "(not a std::exception)");
    return 1;
  }
  std::string().swap(args);
  // A group the function left behind: leave it cleanly (peers are done too).
  try {
    destroy_process_group();
  } catch (const std::exception&) {
  }
  // Results are kept per attempt (an elastic job's last attempt may have fewer ranks than
  // an earlier one, whose results must not mix in). Rank 0 names the attempt it finished in
  // and its world size; attempts run one after another, so the last one written is the last's.
  if (rank == 0 || all_ranks) {
    const std::string key = attempt + "result/" + std::to_string(rank);
    client->set(key, result.take());
    if (rank == 0) {
      client->set(prefix + "finished", json{{"attempt", env ? env->restart_count : 0},
                                            {"world_size", env ? env->world_size : 1}}
                                           .dump());
    }
  }
  // ADD answers, so everything set before it on this connection has been applied before we
  // exit (and before the driver looks).
  client->add(attempt + "done", 1);
  return 0;
}

}  // namespace

void init(int argc, char** argv) {
  {
    std::lock_guard<std::mutex> lock(g_argv_mutex);
    g_argv.assign(argv, argv + argc);
    if (g_argv.empty()) g_argv.emplace_back("program");
  }
  const char* value = std::getenv(kTaskVariable);
  if (value == nullptr) return;
  // Not inherited by anything the function starts (which could take itself for a worker).
  const std::string task = value;
  ::unsetenv(kTaskVariable);
  int code = 1;
  try {
    code = worker_main(task);
  } catch (const std::exception& e) {
    std::cerr << "dtrain: Distributor worker: " << e.what() << std::endl;
    code = 1;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // Skip static destructors: libtorch's at exit can race its own threads; the work is done.
  ::_exit(code);
}

}  // namespace dtrain
