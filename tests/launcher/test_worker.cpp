// A worker for the launcher tests, without libtorch (so tests start fast). Each flag is one
// behaviour; they run in order.
//   --print-env              print the contract variables as KEY=VALUE lines
//   --lines N                print N numbered lines to stdout and to stderr
//   --long-line N            print one line of N characters (no newline until the end)
//   --no-newline TEXT        print TEXT to stdout without a trailing newline
//   --sleep S                sleep S seconds
//   --exit-on-rank R CODE    rank R exits with CODE
//   --kill-self-on-rank R SIG  rank R kills itself with signal SIG
//   --error-file-on-rank R MSG  rank R writes a TORCHELASTIC_ERROR_FILE with MSG, then exits 1
//   --spawn-child            fork a child that sleeps 300 s (a grandchild of the agent);
//                            its pid goes to stdout as "child_pid=N"
//   --pid                    print "pid=N"
//   --session                print "session pid=P sid=S pgid=G" (its session and group)
//   --fail-on-restart-below K  exit 3 while TORCHELASTIC_RESTART_COUNT < K
//   --store-barrier          join the agent store (raw protocol) and add/wait: a rendezvous
//                            that proves MASTER_ADDR/PORT and the prefix work
//   --ignore-term            ignore SIGTERM (so only SIGKILL stops it)
//   --print-var NAME         print NAME=VALUE (or NAME=<unset>)
//   --print-affinity         print "affinity=0,1,...": the CPUs this process may run on
//   --touch PATH             create the file PATH (lets a test prove the program never ran)
//   --print-start            print "constructor_pid=A pid=B prepare_pid=C": where the
//                            constructor of a shared library (preload_probe) ran, this process,
//                            and where the fork server ran the program's prepare hook (0: not)
//   --exit-hooks CODE        register an atexit handler and a static object, then exit(CODE):
//                            each prints a line as it runs, as does a destructor function
//   --dlopen PATH            dlopen the library PATH (kept open until exit)
//   --unsynced-cout TEXT     std::ios::sync_with_stdio(false), then TEXT to std::cout, unflushed
//   --read-stdin             read one line of stdin, print "stdin=LINE" ("stdin=<eof>" at EOF)
//   --print-args ...         print "args=" and every argument after it, one per line, each
//                            as "arg=VALUE"; then exit 0 (what follows is not read as flags)
//   --print-proc ...         print "proc_cmdline=A|B|..." (/proc/self/cmdline) and
//                            "proc_env_K=V" for RANK, LOCAL_RANK, DTRAIN_FORKSERVER and
//                            LD_PRELOAD (/proc/self/environ, as ps -e and tools read it); exit 0
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "dtrain/store.h"

pid_t probe_constructor_pid();  // tests/launcher/preload_probe.cpp

namespace {
pid_t g_prepare_pid = 0;  // constant-initialised: the hook runs before the constructors
}

// The fork server's hook (src/launch/forkserver/preload.cpp), exported by tests/launcher.cmake:
// it runs once, in the server, before the workers are forked.
extern "C" __attribute__((visibility("default"), used)) void dtrain_forkserver_prepare() {
  g_prepare_pid = ::getpid();
}

namespace {
bool g_exit_hooks = false;

struct PrintsOnDestruction {
  ~PrintsOnDestruction() { std::printf("static destructor ran\n"); }
};
}  // namespace

// Runs from the program's DT_FINI_ARRAY, after static destructors and atexit handlers.
__attribute__((destructor)) static void destructor_function() {
  if (g_exit_hooks) std::printf("destructor function ran\n");
}

static int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

int main(int argc, char** argv) {
  const int rank = env_int("RANK");
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "test_worker: %s needs a value\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--print-args") {
      std::printf("args=rank %d\n", rank);
      for (int j = i + 1; j < argc; ++j) std::printf("arg=%s\n", argv[j]);
      std::fflush(stdout);
      return 0;
    }
    if (a == "--print-proc") {
      // What ps and /proc show of this process: its command line ('|' between arguments) and
      // a few variables of its /proc/self/environ.
      auto read_all = [](const char* path) {
        std::string text;
        if (FILE* f = std::fopen(path, "rb")) {
          char buf[4096];
          for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
          std::fclose(f);
        }
        return text;
      };
      std::string line;
      for (const char c : read_all("/proc/self/cmdline")) line += c == '\0' ? '|' : c;
      std::printf("proc_cmdline=%s\n", line.c_str());
      const std::string env = read_all("/proc/self/environ");
      for (const std::string k : {"RANK", "LOCAL_RANK", "DTRAIN_FORKSERVER", "LD_PRELOAD"}) {
        std::string v = "<unset>";
        for (size_t at = 0; at < env.size();) {
          const size_t end = std::min(env.find('\0', at), env.size());
          if (env.compare(at, k.size() + 1, k + "=") == 0)
            v = env.substr(at + k.size() + 1, end - at - k.size() - 1);
          at = end + 1;
        }
        std::printf("proc_env_%s=%s\n", k.c_str(), v.c_str());
      }
      std::fflush(stdout);
      return 0;
    }
    if (a == "--print-env") {
      for (const char* k :
           {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
            "OMP_NUM_THREADS"}) {
        const char* v = std::getenv(k);
        std::printf("%s=%s\n", k, v ? v : "<unset>");
      }
    } else if (a == "--lines") {
      int n = std::stoi(next());
      for (int j = 0; j < n; ++j) {
        std::printf("out %d %d\n", rank, j);
        std::fprintf(stderr, "err %d %d\n", rank, j);
      }
    } else if (a == "--long-line") {
      int n = std::stoi(next());
      std::string s(static_cast<size_t>(n), 'x');
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
      std::printf("|end\n");
    } else if (a == "--no-newline") {
      std::string s = next();
      std::fputs(s.c_str(), stdout);
    } else if (a == "--sleep") {
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::duration<double>(std::stod(next())));
    } else if (a == "--exit-on-rank") {
      int r = std::stoi(next());
      int code = std::stoi(next());
      if (r == rank) {
        std::fprintf(stderr, "rank %d exiting with %d on purpose\n", rank, code);
        std::fflush(stdout);
        std::exit(code);
      }
    } else if (a == "--kill-self-on-rank") {
      int r = std::stoi(next());
      int sig = std::stoi(next());
      if (r == rank) {
        std::fflush(stdout);
        std::fflush(stderr);
        ::kill(::getpid(), sig);
      }
    } else if (a == "--error-file-on-rank") {
      int r = std::stoi(next());
      std::string msg = next();
      if (r == rank) {
        const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
        if (path) {
          FILE* f = std::fopen(path, "w");
          std::fprintf(f, "{\"message\": \"%s\"}\n", msg.c_str());
          std::fclose(f);
        }
        std::exit(1);
      }
    } else if (a == "--spawn-child") {
      pid_t c = ::fork();
      if (c == 0) {
        ::execlp("sleep", "sleep", "300", nullptr);
        ::_exit(127);
      }
      std::printf("child_pid=%d\n", c);
      std::fflush(stdout);
    } else if (a == "--pid") {
      std::printf("pid=%d\n", ::getpid());
      std::fflush(stdout);
    } else if (a == "--session") {
      std::printf("session pid=%d sid=%d pgid=%d\n", ::getpid(), ::getsid(0), ::getpgid(0));
      std::fflush(stdout);
    } else if (a == "--fail-on-restart-below") {
      int k = std::stoi(next());
      if (env_int("TORCHELASTIC_RESTART_COUNT") < k) {
        std::fprintf(stderr, "failing on restart %d\n", env_int("TORCHELASTIC_RESTART_COUNT"));
        return 3;
      }
    } else if (a == "--store-barrier") {
      const char* addr = std::getenv("MASTER_ADDR");
      int port = env_int("MASTER_PORT");
      int world = env_int("WORLD_SIZE");
      std::string prefix =
          "/worker/attempt_" + std::to_string(env_int("TORCHELASTIC_RESTART_COUNT"));
      dtrain::store::StoreClient::Options o;
      o.connect_timeout = std::chrono::seconds(10);
      o.timeout = std::chrono::seconds(20);
      o.token = dtrain::store::job_store_token();
      auto c = dtrain::store::StoreClient::connect(addr, static_cast<uint16_t>(port), o);
      c->set(prefix + "/rank_" + std::to_string(rank), "here");
      std::vector<std::string> keys;
      for (int r = 0; r < world; ++r) keys.push_back(prefix + "/rank_" + std::to_string(r));
      if (!c->wait(keys, std::chrono::seconds(20))) {
        std::fprintf(stderr, "store barrier timed out\n");
        return 4;
      }
      std::printf("store barrier passed on rank %d\n", rank);
    } else if (a == "--ignore-term") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (a == "--print-affinity") {
      cpu_set_t set;
      CPU_ZERO(&set);
      std::string cpus;
      if (::sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE; ++c) {
          if (!CPU_ISSET(c, &set)) continue;
          if (!cpus.empty()) cpus += ',';
          cpus += std::to_string(c);
        }
      }
      std::printf("affinity=%s\n", cpus.c_str());
    } else if (a == "--print-var") {
      std::string name = next();
      const char* v = std::getenv(name.c_str());
      std::printf("%s=%s\n", name.c_str(), v ? v : "<unset>");
    } else if (a == "--touch") {
      std::string path = next();
      FILE* f = std::fopen(path.c_str(), "w");
      if (f == nullptr) {
        std::fprintf(stderr, "test_worker: cannot create %s\n", path.c_str());
        return 65;
      }
      std::fclose(f);
    } else if (a == "--print-start") {
      std::printf("constructor_pid=%d pid=%d prepare_pid=%d\n", probe_constructor_pid(), ::getpid(),
                  g_prepare_pid);
    } else if (a == "--dlopen") {
      std::string path = next();
      if (::dlopen(path.c_str(), RTLD_NOW) == nullptr) {
        std::fprintf(stderr, "test_worker: %s\n", ::dlerror());
        return 66;
      }
    } else if (a == "--read-stdin") {
      char line[256];
      if (std::fgets(line, sizeof line, stdin) == nullptr) {
        std::printf("stdin=<eof>\n");
      } else {
        line[std::strcspn(line, "\n")] = '\0';
        std::printf("stdin=%s\n", line);
      }
      std::fflush(stdout);
    } else if (a == "--unsynced-cout") {
      std::string text = next();
      std::ios::sync_with_stdio(false);
      std::cout << text << '\n';  // stays in cout's own buffer until exit flushes it
    } else if (a == "--exit-hooks") {
      int code = std::stoi(next());
      g_exit_hooks = true;
      std::atexit([] { std::printf("atexit handler ran\n"); });
      static PrintsOnDestruction printer;
      std::printf("exiting with %d\n", code);  // buffered (stdout is a pipe): exit must flush it
      std::exit(code);
    } else {
      std::fprintf(stderr, "test_worker: unknown flag %s\n", a.c_str());
      return 64;
    }
    std::fflush(stdout);
  }
  return 0;
}
