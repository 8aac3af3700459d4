// The job's store at cluster scale: N ranks' rendezvous against dtrain's StoreServer and, in the
// same run, PyTorch 2.x's own TCPStore server (libuv backend) from the venv.
//
//   store_bench [--ranks 256,1024,4096,8192] [--repeats 3] [--python PATH] [--window 1024]
//
// One process plays every rank over non-blocking connections (epoll), each rank doing what a
// PyTorch 2.x rank does at rendezvous, in TCPStore's v2 protocol:
//   connect; VALIDATE + PING (the 2.x client's handshake);
//   ADD /rdzv/joined 1                      (the rank's order, as the c10d rendezvous does);
//   SET /rank/<r> <64-byte address>;
//   WAIT + MULTI_GET on /rank/<r-1>, /rank/<r+1>, /rank/0   (ring neighbours and rank 0);
//   ADD /barrier/arrived 1, the last one SETs /barrier/done; WAIT /barrier/done (the store
//   barrier every init_process_group ends with).
// At most --window connections are being opened at once (ranks start over a short span, as
// a real job's do; both servers get the same window).
//
// Each server runs in a process of its own, fresh for each run, so its CPU time and memory
// are read from /proc as the user would see them: CPU seconds (utime + stime) and the growth
// of its RSS during the run. Prints a line per run and a table of medians with the ratio
// c10d / dtrain. Never fails on timing; exits non-zero only if a run had errors or a server
// could not start.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/store.h"
#include "store/wire.h"

namespace {

using Clock = std::chrono::steady_clock;
using dtrain::store::wire::Encoder;
using dtrain::store::wire::kValidationMagic;

// v2 request codes (include/dtrain/store.h).
constexpr std::uint8_t kValidate = 0, kSet = 1, kAdd = 4, kWait = 6, kMultiGet = 10, kPing = 13;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// --- the servers, each in its own process -----------------------------------------

struct ServerProcess {
  pid_t pid = -1;
  int stdin_fd = -1;  // closing it tells the server to exit
  std::uint16_t port = 0;
};

// Starts argv with a pipe on stdin (kept) and one on stdout, from which it reads the port.
ServerProcess spawn(const std::vector<std::string>& argv) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    std::exit(2);
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "store_bench: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ServerProcess s;
  s.pid = pid;
  s.stdin_fd = in[1];
  std::string line;
  char c;
  while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(out[0]);
  s.port = static_cast<std::uint16_t>(std::atoi(line.c_str()));
  if (s.port == 0) {
    std::fprintf(stderr, "store_bench: %s did not print its port (got '%s')\n", argv[0].c_str(),
                 line.c_str());
    std::exit(2);
  }
  return s;
}

void stop(ServerProcess& s) {
  ::close(s.stdin_fd);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (::waitpid(s.pid, &status, WNOHANG) == s.pid) return;
    ::usleep(25000);
  }
  ::kill(s.pid, SIGKILL);
  ::waitpid(s.pid, &status, 0);
}

// CPU seconds the process (all its threads) has run so far, from the scheduler's
// nanosecond accounting (/proc/PID/task/*/schedstat): clock ticks (10 ms) are too coarse for
// a rendezvous that takes a few hundred milliseconds.
double cpu_seconds(pid_t pid) {
  std::error_code ec;
  double total = 0;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "schedstat");
    unsigned long long ns = 0;
    if (in >> ns) total += static_cast<double>(ns) / 1e9;
  }
  return total;
}

// VmRSS in MiB.
double rss_mib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

// --- the ranks ------------------------------------------------------------------------

enum class Step { CONNECTING, PING, JOIN, WAIT_PEERS, GET_PEERS, ARRIVE, WAIT_DONE, DONE, FAILED };

struct Rank {
  int fd = -1;
  int index = 0;
  Step step = Step::CONNECTING;
  std::string in;
  std::size_t expect = 0;  // reply bytes the current step needs (MULTI_GET: grows as read)
};

struct RunResult {
  double seconds = 0;
  // Round trips of the probe: one more client, on a thread of its own, that sends ADD after
  // ADD while the ranks rendezvous - the latency a rank sees, without the queueing inside the
  // load generator (which handles thousands of replies per turn).
  std::vector<double> latency_us;
  int errors = 0;
  std::string first_error;
  double server_cpu = 0;
  double server_rss_growth = 0;
  long long requests = 0;  // sent, replied to or not (VALIDATE, SET)
  bool probe_realtime = false;
};

class Load {
 public:
  Load(std::uint16_t port, int ranks, int window) : port_(port), n_(ranks), window_(window) {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    ranks_.resize(n_);
    address_.assign(64, 'a');
  }
  ~Load() {
    for (auto& r : ranks_) {
      if (r.fd >= 0) ::close(r.fd);
    }
    ::close(epoll_);
  }

  RunResult run(std::chrono::seconds limit) {
    std::atomic<bool> finished{false};
    std::vector<double> probe;
    std::thread prober([&] { probe = probe_latency(finished); });
    auto start = Clock::now();
    auto deadline = start + limit;
    int next = 0;
    std::vector<epoll_event> events(4096);
    while (done_ + failed_ < n_) {
      while (next < n_ && connecting_ < window_) open(next++);
      int k = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 100);
      for (int i = 0; i < k; ++i) {
        Rank& r = ranks_[events[i].data.u32];
        if (r.step == Step::CONNECTING) {
          connected(r);
        } else {
          readable(r);
        }
      }
      if (Clock::now() > deadline) {
        for (auto& r : ranks_) {
          if (r.step != Step::DONE && r.step != Step::FAILED)
            fail(r, "no progress before the limit");
        }
        for (; next < n_; ++next) fail(ranks_[next], "never started: the limit passed");
      }
    }
    result_.seconds = seconds(Clock::now() - start);
    finished = true;
    prober.join();
    result_.requests += static_cast<long long>(probe.size()) + 2;
    result_.probe_realtime = probe_realtime_;
    result_.latency_us = std::move(probe);
    return std::move(result_);
  }

 private:
  // The probe's round trips (blocking socket, v2 handshake, then ADD /probe 1 in a loop)
  // until `finished`; empty if it could not connect.
  std::vector<double> probe_latency(const std::atomic<bool>& finished) {
    std::vector<double> out;
    // Real-time priority where allowed (root): the probe then runs as soon as its reply
    // arrives, so it measures the server's queue, not this 2-process machine's scheduler.
    sched_param rt{};
    rt.sched_priority = 10;
    probe_realtime_ = ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &rt) == 0;
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    auto exchange = [&](const Encoder& e, std::size_t reply) {
      if (::send(fd, e.str().data(), e.str().size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(e.str().size()))
        return false;
      char buf[16];
      std::size_t got = 0;
      while (got < reply) {
        ssize_t n = ::recv(fd, buf + got, reply - got, 0);
        if (n <= 0) return false;
        got += static_cast<std::size_t>(n);
      }
      return true;
    };
    Encoder hello;
    hello.value(kValidate).value(kValidationMagic).value(kPing).value(std::uint32_t{7});
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        exchange(hello, 4)) {
      Encoder add;
      add.value(kAdd).bytes("/probe").value(std::int64_t{1});
      while (!finished) {
        auto t0 = Clock::now();
        if (!exchange(add, 8)) break;
        out.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        ::usleep(2000);  // a steady trickle, not a second load
      }
    }
    ::close(fd);
    return out;
  }

  void open(int i) {
    Rank& r = ranks_[i];
    r.index = i;
    r.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r.fd < 0) return fail(r, std::string("socket: ") + std::strerror(errno));
    int one = 1;
    ::setsockopt(r.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ++connecting_;
    if (::connect(r.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
        errno != EINPROGRESS) {
      return fail(r, std::string("connect: ") + std::strerror(errno));
    }
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u32 = static_cast<std::uint32_t>(i);
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, r.fd, &ev);
  }

  void connected(Rank& r) {
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(r.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return fail(r, std::string("connect: ") + std::strerror(err));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<std::uint32_t>(r.index);
    ::epoll_ctl(epoll_, EPOLL_CTL_MOD, r.fd, &ev);
    Encoder e;
    e.value(kValidate).value(kValidationMagic).value(kPing).value(std::uint32_t(r.index));
    request(r, e, Step::PING, 4, 2);
  }

  std::string key(int rank) const { return "/rank/" + std::to_string((rank + n_) % n_); }

  // `count`: how many requests the bytes hold.
  void request(Rank& r, const Encoder& e, Step step, std::size_t expect, int count = 1) {
    result_.requests += count;
    r.step = step;
    r.expect = expect;
    const std::string& bytes = e.str();
    ssize_t n = ::send(r.fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    // Requests are small: a socket that does not take one whole is a failure here.
    if (n != static_cast<ssize_t>(bytes.size())) {
      fail(r, std::string("send: ") + (n < 0 ? std::strerror(errno) : "short write"));
    }
  }

  void readable(Rank& r) {
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(r.fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        r.in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0) return fail(r, "the server closed the connection");
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return fail(r, std::string("recv: ") + std::strerror(errno));
    }
    while (r.step != Step::DONE && r.step != Step::FAILED && reply_complete(r)) advance(r);
  }

  // MULTI_GET's reply is three strings: its length is known once their lengths arrived.
  bool reply_complete(Rank& r) {
    if (r.step != Step::GET_PEERS) return r.in.size() >= r.expect;
    std::size_t at = 0;
    for (int i = 0; i < 3; ++i) {
      std::uint64_t len = 0;
      if (r.in.size() < at + 8) return false;
      std::memcpy(&len, r.in.data() + at, 8);
      at += 8 + len;
    }
    r.expect = at;
    return r.in.size() >= at;
  }

  void advance(Rank& r) {
    std::string reply = r.in.substr(0, r.expect);
    r.in.erase(0, r.expect);
    auto i64 = [&] {
      std::int64_t v = 0;
      std::memcpy(&v, reply.data(), 8);
      return v;
    };
    switch (r.step) {
      case Step::PING: {
        std::uint32_t nonce = 0;
        std::memcpy(&nonce, reply.data(), 4);
        if (nonce != static_cast<std::uint32_t>(r.index)) return fail(r, "PING: wrong nonce");
        --connecting_;
        Encoder e;
        e.value(kAdd).bytes("/rdzv/joined").value(std::int64_t{1});
        return request(r, e, Step::JOIN, 8);
      }
      case Step::JOIN: {
        if (i64() < 1 || i64() > n_) return fail(r, "ADD: joined count out of range");
        Encoder e;
        e.value(kSet).bytes(key(r.index)).bytes(address_);
        e.value(kWait).keys({key(r.index - 1), key(r.index + 1), key(0)});
        return request(r, e, Step::WAIT_PEERS, 1, 2);
      }
      case Step::WAIT_PEERS: {
        if (reply[0] != 0) return fail(r, "WAIT: not STOP_WAITING");
        Encoder e;
        e.value(kMultiGet).keys({key(r.index - 1), key(r.index + 1), key(0)});
        return request(r, e, Step::GET_PEERS, 24);
      }
      case Step::GET_PEERS: {
        if (r.expect != 3 * (8 + address_.size())) return fail(r, "MULTI_GET: wrong values");
        Encoder e;
        e.value(kAdd).bytes("/barrier/arrived").value(std::int64_t{1});
        return request(r, e, Step::ARRIVE, 8);
      }
      case Step::ARRIVE: {
        Encoder e;
        bool last = i64() == n_;
        if (last) e.value(kSet).bytes("/barrier/done").bytes("1");
        e.value(kWait).keys({"/barrier/done"});
        return request(r, e, Step::WAIT_DONE, 1, last ? 2 : 1);
      }
      case Step::WAIT_DONE:
        if (reply[0] != 0) return fail(r, "WAIT: not STOP_WAITING");
        r.step = Step::DONE;
        ++done_;
        return;
      default:
        return;
    }
  }

  void fail(Rank& r, const std::string& why) {
    if (r.step == Step::DONE || r.step == Step::FAILED) return;
    if (r.step == Step::CONNECTING || r.step == Step::PING) --connecting_;
    r.step = Step::FAILED;
    ++failed_;
    if (result_.errors++ == 0) result_.first_error = "rank " + std::to_string(r.index) + ": " + why;
    if (r.fd >= 0) {
      ::close(r.fd);
      r.fd = -1;
    }
  }

  std::uint16_t port_;
  int n_;
  int window_;
  int epoll_;
  std::vector<Rank> ranks_;
  std::string address_;
  int connecting_ = 0;
  bool probe_realtime_ = false;
  int done_ = 0;
  int failed_ = 0;
  RunResult result_;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

int serve() {
  dtrain::store::StoreServer::Options options;
  options.bind_host = "127.0.0.1";
  auto server = dtrain::store::StoreServer::start(options);
  std::printf("%u\n", server->port());
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  return 0;
}

const char* kC10dServer = R"(
import datetime, sys
import torch, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=600),
                      wait_for_workers=False, use_libuv=True)
assert store.libuvBackend, "this PyTorch did not start the libuv TCPStore server"
print(store.port, flush=True)
sys.stdin.read()
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {256, 1024, 4096, 8192};
  int repeats = 3;
  int window = 1024;
  std::uint16_t against = 0;
  const char* home = std::getenv("HOME");
  std::string python = std::getenv("DTRAIN_VENV_PYTHON")
                           ? std::getenv("DTRAIN_VENV_PYTHON")
                           : std::string(home ? home : "") + "/.cache/dtrain/venv/bin/python";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "store_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--serve") return serve();
    if (a == "--against") {  // load only, against a server already running on this port
      against = static_cast<std::uint16_t>(std::stoi(next()));
      continue;
    }
    if (a == "--ranks") {
      sizes.clear();
      std::stringstream list(next());
      for (std::string s; std::getline(list, s, ',');) sizes.push_back(std::stoi(s));
    } else if (a == "--repeats") {
      repeats = std::stoi(next());
    } else if (a == "--window") {
      window = std::stoi(next());
    } else if (a == "--python") {
      python = next();
    } else {
      std::fprintf(stderr,
                   "usage: store_bench [--ranks 256,1024,4096,8192] [--repeats 3] "
                   "[--window 1024] [--python PATH]\n");
      return 2;
    }
  }
  // Every rank is a socket here and one in the server: raise the soft fd limit to the hard
  // one (the servers inherit it).
  rlimit fds{};
  ::getrlimit(RLIMIT_NOFILE, &fds);
  fds.rlim_cur = fds.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &fds);
  int largest = *std::max_element(sizes.begin(), sizes.end());
  if (fds.rlim_cur < static_cast<rlim_t>(largest) + 64) {
    std::fprintf(stderr, "store_bench: the open-file limit (%llu) is below %d ranks; raise it\n",
                 static_cast<unsigned long long>(fds.rlim_cur), largest);
    return 2;
  }
  if (against != 0) {
    for (int n : sizes) {
      RunResult r = Load(against, n, window).run(std::chrono::seconds(300));
      std::printf("N=%d against port %u: %.3f s, p50 %.0f us, p99 %.0f us, errors %d %s\n", n,
                  against, r.seconds, percentile(r.latency_us, 0.5), percentile(r.latency_us, 0.99),
                  r.errors, r.first_error.c_str());
    }
    return 0;
  }
  char self[4096];
  ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[len > 0 ? len : 0] = '\0';
  char host[256] = "";
  ::gethostname(host, sizeof(host));
  std::printf("store_bench on %s (%ld CPUs), load average at start: ", host,
              ::sysconf(_SC_NPROCESSORS_ONLN));
  {
    std::ifstream la("/proc/loadavg");
    std::string l1;
    la >> l1;
    std::printf("%s; window %d; %d repeats\n", l1.c_str(), window, repeats);
  }

  struct Kind {
    const char* name;
    std::vector<std::string> argv;
  };
  std::vector<Kind> kinds = {{"dtrain", {self, "--serve"}},
                             {"c10d-libuv", {python, "-c", kC10dServer}}};
  std::map<std::pair<int, std::string>, std::vector<RunResult>> results;
  int errors = 0;
  for (int n : sizes) {
    for (int rep = 0; rep < repeats; ++rep) {
      for (const auto& kind : kinds) {  // interleaved: both see the same machine
        ServerProcess server = spawn(kind.argv);
        double cpu0 = cpu_seconds(server.pid), rss0 = rss_mib(server.pid);
        RunResult r = Load(server.port, n, window).run(std::chrono::seconds(300));
        r.server_cpu = cpu_seconds(server.pid) - cpu0;
        r.server_rss_growth = rss_mib(server.pid) - rss0;
        stop(server);
        std::printf(
            "N=%-5d %-10s run %d: %.3f s, p50 %.0f us, p99 %.0f us, server CPU %.3f s "
            "(%.1f us per request), RSS +%.1f MiB, errors %d%s%s\n",
            n, kind.name, rep + 1, r.seconds, percentile(r.latency_us, 0.5),
            percentile(r.latency_us, 0.99), r.server_cpu,
            1e6 * r.server_cpu / static_cast<double>(std::max(1LL, r.requests)),
            r.server_rss_growth, r.errors, r.errors ? " - first: " : "", r.first_error.c_str());
        std::fflush(stdout);
        errors += r.errors;
        results[{n, kind.name}].push_back(std::move(r));
      }
    }
  }

  std::printf(
      "\nMedians of %d runs (time to complete the rendezvous; round trips of a probe client "
      "meanwhile; server CPU and RSS growth per run):\n",
      repeats);
  std::printf("%6s | %-10s | %8s | %8s | %8s | %9s | %10s | %9s | %6s\n", "N", "server", "time s",
              "p50 us", "p99 us", "CPU s", "CPU us/req", "RSS MiB", "errors");
  for (int n : sizes) {
    std::map<std::string, double> time, cpu;
    for (const auto& kind : kinds) {
      auto& runs = results[{n, kind.name}];
      std::vector<double> t, c, p50, p99, rss, per;
      int errs = 0;
      for (const auto& r : runs) {
        t.push_back(r.seconds);
        c.push_back(r.server_cpu);
        p50.push_back(percentile(r.latency_us, 0.5));
        p99.push_back(percentile(r.latency_us, 0.99));
        rss.push_back(r.server_rss_growth);
        per.push_back(1e6 * r.server_cpu / static_cast<double>(std::max(1LL, r.requests)));
        errs += r.errors;
      }
      time[kind.name] = median(t);
      cpu[kind.name] = median(c);
      std::printf("%6d | %-10s | %8.3f | %8.0f | %8.0f | %9.3f | %10.2f | %9.1f | %6d\n", n,
                  kind.name, median(t), median(p50), median(p99), median(c), median(per),
                  median(rss), errs);
    }
    std::printf("%6d | c10d/dtrain: time x%.2f, server CPU x%.2f\n", n,
                time["c10d-libuv"] / time["dtrain"],
                cpu["dtrain"] > 0 ? cpu["c10d-libuv"] / cpu["dtrain"] : 0.0);
  }
  bool realtime = true;
  for (const auto& [key, runs] : results)
    for (const auto& r : runs) realtime = realtime && r.probe_realtime;
  std::printf("The probe ran at %s.\n",
              realtime ? "real-time priority (SCHED_FIFO)"
                       : "normal priority (no permission for SCHED_FIFO): its round trips include "
                         "waiting for a CPU behind the load generator");
  return errors == 0 ? 0 : 1;
}
