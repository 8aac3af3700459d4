#include "launcher/subprocess.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

extern char** environ;

namespace dtrain::test {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// After the child exited, how long we keep reading for EOF. Only a leaked descendant that
// holds the pipe open keeps it from coming at once; we must not hang on that.
constexpr milliseconds kDrainAfterExit{2000};

std::vector<std::string> child_environment(const RunOptions& options) {
  std::set<std::string> drop(options.unset.begin(), options.unset.end());
  for (const auto& kv : options.env) drop.insert(kv.substr(0, kv.find('=')));
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    if (!drop.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
  }
  env.insert(env.end(), options.env.begin(), options.env.end());
  return env;
}

// Reads everything ready on *fd into *into; closes it (sets -1) at EOF.
void read_ready(int* fd, std::string* into) {
  char buf[65536];
  while (*fd >= 0) {
    ssize_t n = ::read(*fd, buf, sizeof buf);
    if (n > 0) {
      into->append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {
      ::close(*fd);
      *fd = -1;
    }
  }
}

std::string tail_of(const std::string& s, size_t n = 4000) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

}  // namespace

Process Process::start(const std::vector<std::string>& argv, const RunOptions& options) {
  if (argv.empty()) throw std::invalid_argument("Process::start needs argv[0]");
  // Everything the child touches is built before fork: it only makes async-signal-safe
  // calls until exec.
  std::vector<std::string> env = child_environment(options);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  Process p;
  p.argv_ = argv;
  p.start_ = Clock::now();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    // If the test binary dies (crash, ctest timeout), the launcher dies with it; its own
    // clean-up (guard) then takes the workers down.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGALRM})
      ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(cargv[0], cargv.data(), cenv.data());
    const char* msg = "subprocess: execve failed\n";
    ssize_t ignored = ::write(STDERR_FILENO, msg, std::strlen(msg));
    (void)ignored;
    ::_exit(127);
  }
  // Set the group from this side too, so it exists before anyone signals -pid.
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  if (devnull >= 0) ::close(devnull);
  for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  p.pid_ = pid;
  p.out_fd_ = out[0];
  p.err_fd_ = err[0];
  return p;
}

Process::Process(Process&& o) noexcept
    : pid_(o.pid_),
      out_fd_(o.out_fd_),
      err_fd_(o.err_fd_),
      out_(std::move(o.out_)),
      err_(std::move(o.err_)),
      exited_(o.exited_),
      exit_code_(o.exit_code_),
      start_(o.start_),
      end_(o.end_),
      argv_(std::move(o.argv_)) {
  o.pid_ = -1;
  o.out_fd_ = -1;
  o.err_fd_ = -1;
  o.exited_ = true;
}

Process::~Process() {
  if (pid_ > 0 && !exited_) kill_group();
  for (int fd : {out_fd_, err_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

std::string Process::command_line() const {
  std::string s;
  for (const auto& a : argv_) s += (s.empty() ? "" : " ") + a;
  return s;
}

void Process::reap(int flags) {
  if (exited_ || pid_ <= 0) return;
  int st = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &st, flags);
  } while (r < 0 && errno == EINTR);
  if (r != pid_) return;
  exited_ = true;
  end_ = Clock::now();
  exit_code_ = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

void Process::pump(milliseconds wait) {
  std::vector<pollfd> fds;
  if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
  if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
  // Exit is noticed by polling waitpid, so never sleep long on pipes alone.
  int ms = static_cast<int>(std::min<int64_t>(wait.count(), 20));
  if (!fds.empty() || !exited_) ::poll(fds.data(), fds.size(), ms);
  read_ready(&out_fd_, &out_);
  read_ready(&err_fd_, &err_);
  reap(WNOHANG);
}

bool Process::wait_for(const std::function<bool(const std::string&, const std::string&)>& pred,
                       milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (pred(out_, err_)) return true;
    if (Clock::now() >= deadline) return false;
    if (exited_ && out_fd_ < 0 && err_fd_ < 0) return pred(out_, err_);
    pump(milliseconds(20));
  }
}

void Process::signal(int sig) const {
  if (pid_ > 0 && !exited_) ::kill(pid_, sig);
}

void Process::kill_group() {
  if (pid_ <= 0 || exited_) return;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  reap(0);
}

RunResult Process::finish(milliseconds timeout) {
  auto results = finish_all({this}, timeout);
  return results.front();
}

void Process::close_output() {
  for (int* fd : {&out_fd_, &err_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

RunResult Process::result() const {
  RunResult r;
  r.exit_code = exit_code_;
  r.out = out_;
  r.err = err_;
  r.elapsed = std::chrono::duration<double>((exited_ ? end_ : Clock::now()) - start_).count();
  return r;
}

std::vector<RunResult> finish_all(const std::vector<Process*>& processes, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::optional<Clock::time_point>> drain_deadline(processes.size());
  while (Clock::now() < deadline) {
    bool all_done = true;
    std::vector<pollfd> fds;
    for (size_t i = 0; i < processes.size(); ++i) {
      Process* p = processes[i];
      if (p->exited_ && !drain_deadline[i]) drain_deadline[i] = Clock::now() + kDrainAfterExit;
      bool open = p->out_fd_ >= 0 || p->err_fd_ >= 0;
      if (p->exited_ && open && Clock::now() >= *drain_deadline[i]) {
        // Only a descendant that outlived the child can hold its pipe this long: report
        // it, and stop reading rather than hang.
        ADD_FAILURE() << "the output of `" << p->command_line()
                      << "` stayed open 2 s after it exited: a descendant survived";
        p->close_output();
        open = false;
      }
      if (!p->exited_ || open) all_done = false;
      if (p->out_fd_ >= 0) fds.push_back({p->out_fd_, POLLIN, 0});
      if (p->err_fd_ >= 0) fds.push_back({p->err_fd_, POLLIN, 0});
    }
    if (all_done) break;
    ::poll(fds.data(), fds.size(), 20);
    for (Process* p : processes) p->pump(milliseconds(0));
  }
  std::vector<RunResult> results;
  for (Process* p : processes) {
    bool timed_out = !p->exited_;
    if (timed_out) {
      p->kill_group();
      ADD_FAILURE() << "timed out after " << timeout.count() << " ms: `" << p->command_line()
                    << "`; killed its process group.\n--- stdout (tail) ---\n"
                    << tail_of(p->out_) << "\n--- stderr (tail) ---\n"
                    << tail_of(p->err_);
    }
    p->pump(milliseconds(0));
    RunResult r = p->result();
    r.timed_out = timed_out;
    results.push_back(std::move(r));
  }
  return results;
}

RunResult run_command(const std::vector<std::string>& argv, const RunOptions& options) {
  Process p = Process::start(argv, options);
  return p.finish(options.timeout);
}

bool process_dead(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return true;
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  char state = stat[close + 2];
  return state == 'Z' || state == 'X';
}

bool wait_dead(const std::vector<pid_t>& pids, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    bool all = std::all_of(pids.begin(), pids.end(), process_dead);
    if (all) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
}

}  // namespace dtrain::test
