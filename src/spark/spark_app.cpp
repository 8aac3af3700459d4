// Spark engine: the kept application (one PySpark driver service per process, reused by every
// run() with the same master and settings). See dtrain/spark.h and python/dtrain/spark.py.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "dtrain/error.h"
#include "dtrain/spark.h"
#include "launch/options_internal.h"

extern char** environ;

namespace dtrain::spark {

namespace {

struct App {
  pid_t pid = -1;    // spark-submit (its JVM), the leader of its own process group
  int control = -1;  // the control connection: closing it stops the service
  pid_t owner = -1;  // the process that started it (a forked child that exits leaves it alone)
  std::string dir, socket, key, id;
};

std::mutex g_mutex;
App g_app;

bool exited(pid_t pid, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void stop_locked(App& a) {
  if (a.owner != ::getpid()) {
    a = App{};
    return;
  }
  if (a.control >= 0) ::close(a.control);  // the service cancels its jobs, stops the context, exits
  if (a.pid > 0 && !exited(a.pid, std::chrono::seconds(25))) {
    ::kill(-a.pid, SIGKILL);
    ::kill(a.pid, SIGKILL);
    exited(a.pid, std::chrono::seconds(5));
  }
  if (!a.dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(a.dir, ec);
  }
  a = App{};
}

// At exit: stop the kept application and wait for it (SparkContext.stop ends the executors).
struct AtExit {
  ~AtExit() {
    std::lock_guard<std::mutex> lock(g_mutex);
    stop_locked(g_app);
  }
} g_at_exit;

bool alive(App& a) {
  if (a.pid <= 0) return false;
  if (exited(a.pid, std::chrono::milliseconds(0))) {
    a.pid = -1;
    return false;
  }
  // The service closes the control connection when it stops (idle, or its context failed).
  pollfd p{a.control, POLLIN, 0};
  if (::poll(&p, 1, 0) > 0) return false;
  return std::filesystem::exists(a.socket);  // unlinked first when it stops
}

int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string python_for(const Command& submit) {
  for (const auto& [k, v] : submit.env) {
    if (k == "PYSPARK_PYTHON") return v;
  }
  if (const char* p = std::getenv("PYSPARK_PYTHON"); p && *p) {
    if (std::string(p).find('/') != std::string::npos) return p;
    if (auto found = find_in_path(p); !found.empty()) return found;
  }
  auto found = find_in_path("python3");
  if (found.empty()) {
    throw UsageError(
        "engine \"spark\": no Python for the job client (PYSPARK_PYTHON unset, no "
        "python beside spark-submit, no python3 on PATH)");
  }
  return found;
}

App start(const SubmitOptions& o, const Plan& plan, const std::string& key,
          std::chrono::seconds idle_timeout, std::chrono::seconds start_timeout) {
  Command c = submit_base(o, plan);
  App a;
  a.owner = ::getpid();
  std::string tmpl = (std::filesystem::temp_directory_path() / "dtrain-spark-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw Error("cannot create a temporary directory: " + std::string(std::strerror(errno)));
  }
  a.dir = tmpl;
  a.socket = a.dir + "/driver.sock";
  a.key = key;
  c.argv.insert(c.argv.end(),
                {driver_script(), "--serve", a.socket, "--parent-pid", std::to_string(::getpid()),
                 "--idle-timeout", std::to_string(idle_timeout.count())});
  // Built before fork: the child only makes async-signal-safe calls until exec.
  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s(*e);
    auto eq = s.find('=');
    if (eq != std::string::npos) env_map[s.substr(0, eq)] = s.substr(eq + 1);
  }
  for (const auto& [k, v] : c.env) env_map[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (auto& s : c.argv) argv.push_back(s.data());
  argv.push_back(nullptr);
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = ::fork();
  if (pid < 0) {
    if (devnull >= 0) ::close(devnull);
    throw Error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: a terminal's Ctrl-C reaches this program, which stops it
    if (devnull >= 0) ::dup2(devnull, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (devnull >= 0) ::close(devnull);
  a.pid = pid;
  // Ready: the socket answers the control connection with "READY APP_ID".
  const auto deadline = std::chrono::steady_clock::now() + start_timeout;
  for (;;) {
    if (exited(a.pid, std::chrono::milliseconds(0))) {
      a.pid = -1;
      stop_locked(a);
      throw Error("engine \"spark\": the PySpark driver (" + c.argv[0] + " --master " + o.master +
                  " ... spark.py --serve) exited before its SparkContext was up; its output is "
                  "above, on this program's stdout/stderr");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      stop_locked(a);
      throw TimeoutError("engine \"spark\": the PySpark driver's SparkContext (master " + o.master +
                         ") was not up after " + std::to_string(start_timeout.count()) +
                         " s; it was stopped (its output is above)");
    }
    int fd = std::filesystem::exists(a.socket) ? connect_unix(a.socket) : -1;
    if (fd < 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    const char hello[] = "CONTROL\n";
    std::string line;
    if (::send(fd, hello, sizeof hello - 1, MSG_NOSIGNAL) ==
        static_cast<ssize_t>(sizeof hello - 1)) {
      char ch;
      pollfd p{fd, POLLIN, 0};
      while (line.size() < 512 && ::poll(&p, 1, 10000) > 0 && ::read(fd, &ch, 1) == 1 && ch != '\n')
        line += ch;
    }
    if (line.rfind("READY ", 0) != 0) {
      ::close(fd);
      stop_locked(a);
      throw Error("engine \"spark\": the PySpark driver service did not answer within 10 s (got '" +
                  line +
                  "'); its output is above - check that pyspark and Java work there, or set "
                  "ClusterOptions::spark_keep_app = false to submit each run() on its own");
    }
    a.control = fd;
    a.id = line.substr(6);
    return a;
  }
}

}  // namespace

Command app_job_command(const SubmitOptions& o, const Plan& plan, std::chrono::seconds idle_timeout,
                        std::chrono::seconds start_timeout) {
  Command submit = submit_base(o, plan);  // validates the master and spark-submit
  std::string key;
  for (const auto& part : submit.argv) key += part + '\n';
  for (const auto& [k, v] : submit.env) key += k + "=" + v + '\n';
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_app.key.empty() && (g_app.key != key || !alive(g_app))) stop_locked(g_app);
  if (g_app.key.empty()) g_app = start(o, plan, key, idle_timeout, start_timeout);
  Command c;
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", o.slot_timeout_s);
  c.argv = {python_for(submit),
            "-u",
            driver_script(),
            "--client",
            g_app.socket,
            "--tasks",
            std::to_string(plan.tasks),
            "--slot-timeout",
            timeout,
            "--"};
  return c;
}

std::string app_id() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return alive(g_app) ? g_app.id : std::string();
}

void stop_app() {
  std::lock_guard<std::mutex> lock(g_mutex);
  stop_locked(g_app);
}

}  // namespace dtrain::spark
