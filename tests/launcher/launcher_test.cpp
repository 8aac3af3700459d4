// `dtrain run` end to end: the real binary, real worker processes (test_worker, no libtorch),
// real signals, multi-node jobs as several agents on loopback.
//
// Every test runs under a hard time limit (SIGALRM kills what it started and fails it), and
// its fixture kills every process it started or saw (agents by process group, workers and
// grandchildren by the pids they printed), so a failing test leaves nothing running.
// Timing bounds are loose on purpose: the suite runs on a loaded 2-core machine. Lower
// bounds are safe (slowness only makes them hold more easily); upper bounds are several
// times the expected time.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dtrain/store.h"
#include "launcher/subprocess.h"
#include "support/free_port.h"
#include "support/paths.h"

namespace dtrain::test {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using Clock = std::chrono::steady_clock;

const std::string kDtrain = DTRAIN_BIN;
const std::string kWorker = TEST_WORKER_BIN;

// Longest any one test may take; its own waits are all shorter, so reaching this means a hang.
constexpr unsigned kHardLimitSeconds = 90;

// ---------------------------------------------------------------------------------------
// Output parsing

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct RankLine {
  int rank;
  std::string text;
};

// The lines of `s` that carry a "[<role><rank>]:" prefix, with the prefix taken off.
std::vector<RankLine> rank_lines(const std::string& s, const std::string& role = "default") {
  std::vector<RankLine> out;
  const std::string open = "[" + role;
  for (const auto& line : split_lines(s)) {
    if (line.rfind(open, 0) != 0) continue;
    size_t close = line.find("]:");
    if (close == std::string::npos) continue;
    std::string digits = line.substr(open.size(), close - open.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out.push_back({std::stoi(digits), line.substr(close + 2)});
  }
  return out;
}

// KEY=VALUE lines per rank (from --print-env / --print-var).
std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out,
                                                              const std::string& role = "default") {
  std::map<int, std::map<std::string, std::string>> env;
  for (const auto& [rank, text] : rank_lines(out, role)) {
    auto eq = text.find('=');
    if (eq != std::string::npos) env[rank][text.substr(0, eq)] = text.substr(eq + 1);
  }
  return env;
}

// rank -> the pid its worker printed with --pid ("pid=N").
std::map<int, pid_t> worker_pids(const std::string& out) {
  std::map<int, pid_t> pids;
  for (const auto& [rank, text] : rank_lines(out)) {
    if (text.rfind("pid=", 0) == 0) pids[rank] = std::stoi(text.substr(4));
  }
  return pids;
}

// The grandchildren started with --spawn-child ("child_pid=N").
std::vector<pid_t> child_pids(const std::string& out) {
  std::vector<pid_t> pids;
  for (const auto& [rank, text] : rank_lines(out)) {
    if (text.rfind("child_pid=", 0) == 0) pids.push_back(std::stoi(text.substr(10)));
  }
  return pids;
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + 1))
    ++n;
  return n;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The worker's own output for --lines N on rank r (what the log files must hold verbatim).
std::string numbered_lines(const std::string& tag, int rank, int n) {
  std::string s;
  for (int j = 0; j < n; ++j)
    s += tag + " " + std::to_string(rank) + " " + std::to_string(j) + "\n";
  return s;
}

// ---------------------------------------------------------------------------------------
// Ports

// A port that was free a moment ago (bound to port 0, then released). Another process could
// take it before the agent binds it; tolerable for tests, and every multi-node test asks
// for its own.
int free_port() { return dtrain::test::free_port(INADDR_ANY); }

// A port held (bound and listening on every IPv4 address) for as long as this object lives.
class HeldPort {
 public:
  HeldPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof addr;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(fd_, 1) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error(std::string("cannot hold a port: ") + std::strerror(errno));
    }
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// ---------------------------------------------------------------------------------------
// Hard time limit

// Process groups of the agents the running test started, for the SIGALRM handler (which may
// only make async-signal-safe calls, so no containers).
constexpr int kMaxGroups = 64;
volatile pid_t g_groups[kMaxGroups];
volatile sig_atomic_t g_group_count = 0;

extern "C" void on_hard_limit(int) {
  for (int i = 0; i < g_group_count; ++i) ::kill(-g_groups[i], SIGKILL);
  const char msg[] = "\nlauncher_test: the test ran past its hard time limit; killed its agents\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  ::_exit(124);
}

// ---------------------------------------------------------------------------------------
// The fixture

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "launcher_test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    tmp_ = tmpl;
    g_group_count = 0;
    struct sigaction sa {};
    sa.sa_handler = on_hard_limit;
    ::sigaction(SIGALRM, &sa, nullptr);
    ::alarm(kHardLimitSeconds);
  }

  void TearDown() override {
    ::alarm(0);
    // Agents first (their guards then kill what they started), then anything we saw a
    // pid of that is still running: this must hold even when the launcher under test is
    // broken.
    for (auto& p : processes_) {
      remember_pids(p->out());
      p->kill_group();
    }
    std::vector<pid_t> leftovers;
    for (pid_t pid : seen_pids_) {
      if (!process_dead(pid) && is_ours(pid)) {
        ::kill(-pid, SIGKILL);  // workers lead their own group; harmless for grandchildren
        ::kill(pid, SIGKILL);
        leftovers.push_back(pid);
      }
    }
    wait_dead(leftovers, 5s);
    g_group_count = 0;
    std::error_code ec;
    std::filesystem::remove_all(tmp_, ec);
  }

  // Starts `dtrain run ARGS...` in the background.
  Process& start(const Args& args, RunOptions options = {}) {
    Args argv{kDtrain, "run"};
    // The suite runs twice: as is, and with every worker started by the fork server.
    const char* method = std::getenv("DTRAIN_TEST_START_METHOD");
    if (method && std::find(args.begin(), args.end(), "--start-method") == args.end()) {
      argv.insert(argv.end(), {"--start-method", method});
    }
    argv.insert(argv.end(), args.begin(), args.end());
    // The parent's OMP_NUM_THREADS would change what workers see; a test that wants one
    // passes it in options.env, which wins over this.
    options.unset.push_back("OMP_NUM_THREADS");
    processes_.push_back(std::make_unique<Process>(Process::start(argv, options)));
    Process& p = *processes_.back();
    if (g_group_count < kMaxGroups) {
      g_groups[g_group_count] = p.pid();
      g_group_count = g_group_count + 1;
    }
    return p;
  }

  // Runs `dtrain run ARGS...` to completion.
  RunResult run(const Args& args, std::chrono::milliseconds timeout = 30s,
                RunOptions options = {}) {
    Process& p = start(args, std::move(options));
    RunResult r = p.finish(timeout);
    remember_pids(r.out);
    return r;
  }

  std::vector<RunResult> finish(const std::vector<Process*>& ps,
                                std::chrono::milliseconds timeout) {
    auto rs = finish_all(ps, timeout);
    for (auto& r : rs) remember_pids(r.out);
    return rs;
  }

  // Pumps `p` until `needle` occurs `n` times on its stdout; fails the test otherwise.
  bool wait_for_count(Process& p, const std::string& needle, size_t n,
                      std::chrono::milliseconds timeout = 20s) {
    bool ok = p.wait_for(
        [&](const std::string& out, const std::string&) { return count(out, needle) >= n; },
        timeout);
    remember_pids(p.out());
    if (!ok) {
      ADD_FAILURE() << "waited " << timeout.count() << " ms for " << n << " x '" << needle
                    << "' from `" << p.command_line() << "`\n--- stdout ---\n"
                    << p.out() << "\n--- stderr ---\n"
                    << p.err();
    }
    return ok;
  }

  void remember_pids(const std::string& out) {
    for (auto& [rank, pid] : worker_pids(out)) seen_pids_.insert(pid);
    for (pid_t pid : child_pids(out)) seen_pids_.insert(pid);
  }

  // Guards against pid reuse: only kill what is recognisably a test worker or its child.
  static bool is_ours(pid_t pid) {
    std::string cmdline = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    return contains(cmdline, "test_worker") || cmdline.rfind(std::string("sleep\0", 6), 0) == 0;
  }

  std::string path(const std::string& name) const { return tmp_ + "/" + name; }

  std::string tmp_;
  std::vector<std::unique_ptr<Process>> processes_;
  std::set<pid_t> seen_pids_;
};

// ---------------------------------------------------------------------------------------
// The worker environment contract

TEST_F(LauncherTest, EnvContractOnTwoProcs) {
  // A parent launcher's contract must not leak into ours.
  RunOptions parent_env;
  parent_env.env = {"RANK=99", "WORLD_SIZE=99", "MASTER_PORT=1", "TORCHELASTIC_RUN_ID=leaked"};
  RunResult r = run({"--nproc-per-node", "2", kWorker, "--print-env"}, 30s, parent_env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 2u) << r.out;
  std::set<std::string> error_files;
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    auto& e = env[rank];
    const std::string rs = std::to_string(rank);
    EXPECT_EQ(e["RANK"], rs);
    EXPECT_EQ(e["LOCAL_RANK"], rs);
    EXPECT_EQ(e["WORLD_SIZE"], "2");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(e["ROLE_RANK"], rs);
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], "2");
    EXPECT_EQ(e["ROLE_NAME"], "default");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "none");
    EXPECT_EQ(e["TORCHELASTIC_USE_AGENT_STORE"], "True");
    EXPECT_EQ(e["OMP_NUM_THREADS"], "1");
    const std::string& ef = e["TORCHELASTIC_ERROR_FILE"];
    EXPECT_TRUE(ef.size() > 1 && ef[0] == '/') << ef;
    EXPECT_TRUE(ef.ends_with("/attempt_0/" + std::to_string(rank) + "/error.json")) << ef;
    error_files.insert(ef);
    const std::string& port = e["MASTER_PORT"];
    ASSERT_FALSE(port.empty());
    EXPECT_EQ(port.find_first_not_of("0123456789"), std::string::npos) << port;
    int p = std::atoi(port.c_str());
    EXPECT_TRUE(p > 1 && p < 65536) << port;
  }
  EXPECT_EQ(env[0]["MASTER_PORT"], env[1]["MASTER_PORT"]);
  EXPECT_EQ(error_files.size(), 2u) << "each rank needs its own error file";
}

TEST_F(LauncherTest, EnvFollowsRoleRunIdRestartsAndEnvFlags) {
  RunResult r = run({"--nproc_per_node", "2", "--role", "trainer", "--rdzv_id", "job7",
                     "--max_restarts", "3", "--env", "EXTRA=hello world", "--env",
                     "OMP_NUM_THREADS=8", kWorker, "--print-env", "--print-var", "EXTRA"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out, "trainer");
  ASSERT_EQ(env.size(), 2u) << r.out;
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(env[rank]["ROLE_NAME"], "trainer");
    EXPECT_EQ(env[rank]["TORCHELASTIC_RUN_ID"], "job7");
    EXPECT_EQ(env[rank]["TORCHELASTIC_MAX_RESTARTS"], "3");
    EXPECT_EQ(env[rank]["EXTRA"], "hello world");
    EXPECT_EQ(env[rank]["OMP_NUM_THREADS"], "8");
  }
  EXPECT_TRUE(rank_lines(r.out, "default").empty()) << "the prefix must use the role name";
}

TEST_F(LauncherTest, OmpNumThreadsFromTheParentIsKept) {
  RunOptions parent_env;
  parent_env.env = {"OMP_NUM_THREADS=4"};  // wins over start()'s unset
  RunResult r = run({kWorker, "--print-env"}, 30s, parent_env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(env_by_rank(r.out)[0]["OMP_NUM_THREADS"], "4");
}

TEST_F(LauncherTest, MallocHugepagesAddsTheTunableAndKeepsTheParents) {
  RunResult r = run({"--malloc-hugepages", kWorker, "--print-var", "GLIBC_TUNABLES"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(env_by_rank(r.out)[0]["GLIBC_TUNABLES"], "glibc.malloc.hugetlb=1");
  RunOptions parent_env;
  parent_env.env = {"GLIBC_TUNABLES=glibc.malloc.arena_max=2"};
  r = run({"--malloc-hugepages", "--max-restarts", "1", kWorker, "--print-var", "GLIBC_TUNABLES",
           "--fail-on-restart-below", "1"},
          30s, parent_env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Both attempts print it; the restart must not append the tunable a second time.
  EXPECT_EQ(env_by_rank(r.out)[0]["GLIBC_TUNABLES"],
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  EXPECT_EQ(r.out.find("hugetlb=1:glibc.malloc.hugetlb=1"), std::string::npos) << r.out;
  // Without the flag the parent's value passes through untouched.
  r = run({kWorker, "--print-var", "GLIBC_TUNABLES"}, 30s, parent_env);
  EXPECT_EQ(env_by_rank(r.out)[0]["GLIBC_TUNABLES"], "glibc.malloc.arena_max=2");
}

TEST_F(LauncherTest, StoreBarrierAcrossThreeProcs) {
  RunResult r = run({"--nproc-per-node", "3", kWorker, "--store-barrier"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[default" + std::to_string(rank) + "]:store barrier passed on rank " +
                       std::to_string(rank) + "\n";
    EXPECT_EQ(count(r.out, line), 1u) << r.out;
  }
}

// ---------------------------------------------------------------------------------------
// Output fan-in

TEST_F(LauncherTest, PrefixesAndPerRankOrderOnTheRightStream) {
  constexpr int kLines = 200;
  RunResult r = run({"--nproc-per-node", "3", kWorker, "--lines", std::to_string(kLines)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (auto [stream, tag] :
       {std::pair{&r.out, std::string("out")}, std::pair{&r.err, std::string("err")}}) {
    SCOPED_TRACE(tag);
    std::map<int, std::vector<int>> seen;
    for (const auto& line : split_lines(*stream)) {
      auto parsed = rank_lines(line + "\n");
      ASSERT_EQ(parsed.size(), 1u) << "a line without a rank prefix (or cut): '" << line << "'";
      const auto& [rank, text] = parsed[0];
      std::istringstream fields(text);
      std::string word;
      int line_rank = -1, index = -1;
      fields >> word >> line_rank >> index;
      ASSERT_EQ(word, tag) << "a line on the wrong stream: '" << line << "'";
      ASSERT_EQ(line_rank, rank) << "a line under another rank's prefix: '" << line << "'";
      seen[rank].push_back(index);
    }
    ASSERT_EQ(seen.size(), 3u);
    std::vector<int> expected(kLines);
    for (int j = 0; j < kLines; ++j) expected[j] = j;
    for (auto& [rank, indices] : seen) EXPECT_EQ(indices, expected) << "rank " << rank;
  }
}

TEST_F(LauncherTest, OneMegabyteLineArrivesUncut) {
  constexpr size_t kLength = 1 << 20;
  RunResult r = run({"--nproc-per-node", "2", kWorker, "--long-line", std::to_string(kLength)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = split_lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << "the long lines were split or interleaved";
  std::set<int> ranks;
  for (const auto& [rank, text] : rank_lines(r.out)) {
    ranks.insert(rank);
    EXPECT_EQ(text.size(), kLength + 4) << "rank " << rank;
    EXPECT_EQ(text.find_first_not_of('x'), kLength) << "rank " << rank;
    EXPECT_TRUE(text.ends_with("|end")) << "rank " << rank;
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
}

TEST_F(LauncherTest, FinalLineWithoutNewlineArrives) {
  RunResult r =
      run({"--nproc-per-node", "2", kWorker, "--lines", "1", "--no-newline", "last words"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = split_lines(r.out);
  for (int rank : {0, 1}) {
    std::string expected = "[default" + std::to_string(rank) + "]:last words";
    EXPECT_EQ(std::count(lines.begin(), lines.end(), expected), 1) << r.out;
  }
  EXPECT_TRUE(r.out.ends_with("\n")) << "the console line must be completed";
}

// The run directories a launch made under `log_dir`: torchrun's <run id>_<8 of [a-z0-9_]>.
std::vector<std::string> run_dirs(const std::string& log_dir, const std::string& run_id) {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(log_dir, ec)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(std::regex_match(name, std::regex(run_id + "_[a-z0-9_]{8}"))) << name;
    dirs.push_back(e.path().string());
  }
  return dirs;
}

TEST_F(LauncherTest, LogDirFilesAreUnprefixedAndComplete) {
  const std::string dir = path("logs");
  // --tee 3: every stream to its file (--log-dir alone writes none, as torchrun).
  RunResult r = run({"--log-dir", dir, "--tee", "3", "--rdzv-id", "logjob", "--nproc-per-node", "2",
                     kWorker, "--lines", "100", "--no-newline", "tail without newline"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto runs = run_dirs(dir, "logjob");
  ASSERT_EQ(runs.size(), 1u);
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string rank_dir = runs[0] + "/attempt_0/" + std::to_string(rank);
    EXPECT_EQ(read_file(rank_dir + "/stdout.log"),
              numbered_lines("out", rank, 100) + "tail without newline");
    EXPECT_EQ(read_file(rank_dir + "/stderr.log"), numbered_lines("err", rank, 100));
  }
  // The console still gets everything.
  EXPECT_EQ(rank_lines(r.out).size(), 2u * 101);
  EXPECT_EQ(rank_lines(r.err).size(), 2u * 100);
  // A second job in the same directory, with the same run id, gets a run directory of its own.
  ASSERT_EQ(run({"--log-dir", dir, "--rdzv-id", "logjob", kWorker, "--lines", "1"}).exit_code, 0);
  EXPECT_EQ(run_dirs(dir, "logjob").size(), 2u);
}

TEST_F(LauncherTest, Redirects3KeepsTheConsoleClean) {
  const std::string dir = path("logs");
  RunResult r = run(
      {"--redirects", "3", "--log-dir", dir, "--nproc-per-node", "2", kWorker, "--lines", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(rank_lines(r.err).empty()) << r.err;
  const auto runs = run_dirs(dir, "none");
  ASSERT_EQ(runs.size(), 1u);
  for (int rank : {0, 1}) {
    const std::string rank_dir = runs[0] + "/attempt_0/" + std::to_string(rank);
    EXPECT_EQ(read_file(rank_dir + "/stdout.log"), numbered_lines("out", rank, 100));
    EXPECT_EQ(read_file(rank_dir + "/stderr.log"), numbered_lines("err", rank, 100));
  }
}

// torchrun keeps redirected streams in a temporary directory when no --log-dir is given;
// dtrain keeps them too, and says where: nothing the user asked for is lost.
TEST_F(LauncherTest, RedirectsWithoutALogDirKeepTheOutputAndSayWhere) {
  RunResult r = run({"--redirects", "1", "--nproc-per-node", "2", kWorker, "--lines", "3"}, 30s,
                    {.env = {"TMPDIR=" + tmp_}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  const std::string said =
      "dtrain: no --log-dir: the logs of the redirected and teed streams and "
      "filtered lines are in ";
  const auto at = r.err.find(said);
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string run_dir =
      r.err.substr(at + said.size(), r.err.find('\n', at) - at - said.size());
  EXPECT_EQ(run_dir.rfind(tmp_ + "/dtrain-logs-", 0), 0u) << run_dir;
  for (int rank : {0, 1})
    EXPECT_EQ(read_file(run_dir + "/attempt_0/" + std::to_string(rank) + "/stdout.log"),
              numbered_lines("out", rank, 3));
  // Nothing redirected: nothing kept (the error files' directory is removed at exit).
  r = run({kWorker, "--lines", "1"}, 30s, {.env = {"TMPDIR=" + tmp_}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find(said), std::string::npos) << r.err;
}

// torchrun's --duplicate-stdout/stderr-filters, --local-ranks-filter and
// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (LauncherInterop.LogDirAndFilteredLinesAsUnderTorchrun
// holds the same against the venv's torchrun).
TEST_F(LauncherTest, FilteredLinesGoToTheAttemptsFilteredLogs) {
  const std::string dir = path("logs");
  RunResult r =
      run({"--log-dir", dir, "--tee", "3", "--nproc-per-node", "2", "--local-ranks-filter", "1",
           "--duplicate-stdout-filters", "out 1 2,,x,out 1 4", "--duplicate-stderr-filters", "1 0",
           kWorker, "--lines", "5"},
          30s, {.env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=<$role_name|${rank}|$$>"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string shown;
  for (const auto& line : split_lines(numbered_lines("out", 1, 5)))
    shown += "<default|1|$>" + line + "\n";
  EXPECT_EQ(r.out, shown);
  const auto runs = run_dirs(dir, "none");
  ASSERT_EQ(runs.size(), 1u);
  // Only what reached the console of the teed streams (rank 1's), prefixed; "a,,b" is the
  // filter "a,b".
  EXPECT_EQ(read_file(runs[0] + "/attempt_0/filtered_stdout.log"), "<default|1|$>out 1 4\n");
  EXPECT_EQ(read_file(runs[0] + "/attempt_0/filtered_stderr.log"), "<default|1|$>err 1 0\n");
  // Rank 0's output, kept off the console, is still in its files.
  EXPECT_EQ(read_file(runs[0] + "/attempt_0/0/stdout.log"), numbered_lines("out", 0, 5));
}

TEST_F(LauncherTest, RedirectsPerLocalRank) {
  const std::string dir = path("logs");
  // Rank 0: stdout to the file only; rank 1: stderr to the file only.
  RunResult r =
      run({"-r", "0:1,1:2", "--log-dir", dir, "--nproc-per-node", "2", kWorker, "--lines", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<int> out_ranks, err_ranks;
  for (auto& l : rank_lines(r.out)) out_ranks.insert(l.rank);
  for (auto& l : rank_lines(r.err)) err_ranks.insert(l.rank);
  EXPECT_EQ(out_ranks, (std::set<int>{1}));
  EXPECT_EQ(err_ranks, (std::set<int>{0}));
  const auto runs = run_dirs(dir, "none");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(read_file(runs[0] + "/attempt_0/0/stdout.log"), numbered_lines("out", 0, 5));
  EXPECT_EQ(read_file(runs[0] + "/attempt_0/1/stderr.log"), numbered_lines("err", 1, 5));
}

// ---------------------------------------------------------------------------------------
// Failures and the root-cause summary

TEST_F(LauncherTest, FailingWorkerSetsExitCodeAndSummary) {
  RunResult r =
      run({"--nproc-per-node", "3", kWorker, "--exit-on-rank", "1", "7", "--sleep", "30"});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_LT(r.elapsed, 5.0) << "the others sleep 30 s: they must be stopped, not waited for";
  EXPECT_TRUE(contains(r.err, "dtrain: job failed; root cause")) << r.err;
  EXPECT_TRUE(contains(r.err, "  rank       : 1 (local rank 1)\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "  exit code  : 7\n")) << r.err;
  EXPECT_TRUE(contains(
      r.err, "  last 1 line(s) of rank 1's stderr:\n    rank 1 exiting with 7 on purpose\n"))
      << r.err;
  // The worker's own line also reached the console, prefixed.
  EXPECT_TRUE(contains(r.err, "[default1]:rank 1 exiting with 7 on purpose\n")) << r.err;
}

TEST_F(LauncherTest, FailureStoreGetsTheRootCause) {
  // What the Distributor uses in cluster mode: the root cause in its own store.
  auto server = store::StoreServer::start({"127.0.0.1", 0});
  const std::string port = std::to_string(server->port());
  RunResult r =
      run({"--nproc-per-node", "2", "--failure-store", "127.0.0.1:" + port + "/job/failure",
           kWorker, "--kill-self-on-rank", "1", "11", "--sleep", "30"});
  EXPECT_EQ(r.exit_code, 139) << r.err;
  auto client = store::StoreClient::connect("127.0.0.1", server->port(), {5s, 5s});
  ASSERT_TRUE(client->check({"job/failure"})) << r.err;
  auto f = nlohmann::json::parse(client->get("job/failure"));
  EXPECT_EQ(f.value("rank", -1), 1) << f.dump();
  EXPECT_EQ(f.value("signal", 0), 11) << f.dump();
  EXPECT_EQ(f.value("exit_code", 0), 139) << f.dump();
  EXPECT_FALSE(f.value("host", "").empty()) << f.dump();
}

TEST_F(LauncherTest, WorkerKilledBySignal) {
  RunResult r =
      run({"--nproc-per-node", "2", kWorker, "--kill-self-on-rank", "1", "9", "--sleep", "30"});
  EXPECT_EQ(r.exit_code, 137) << r.err;
  EXPECT_LT(r.elapsed, 5.0);
  EXPECT_TRUE(contains(r.err, "  rank       : 1 (local rank 1)\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "  signal     : SIGKILL (9), exit code 137\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "  stderr     : (empty)\n")) << r.err;
}

TEST_F(LauncherTest, ExternalKillOfOneWorker) {
  Process& agent = start({"--nproc-per-node", "3", kWorker, "--pid", "--sleep", "30"});
  ASSERT_TRUE(wait_for_count(agent, "]:pid=", 3));
  auto pids = worker_pids(agent.out());
  ASSERT_EQ(pids.size(), 3u);
  const auto killed_at = Clock::now();
  ASSERT_EQ(::kill(pids[2], SIGKILL), 0);
  RunResult r = finish({&agent}, 20s)[0];
  const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  EXPECT_EQ(r.exit_code, 137) << r.err;
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(contains(r.err, "  rank       : 2 (local rank 2)\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "  pid        : " + std::to_string(pids[2]) + "\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "  signal     : SIGKILL (9), exit code 137\n")) << r.err;
  EXPECT_TRUE(wait_dead({pids[0], pids[1]}, 2s)) << "the other workers must be stopped";
}

TEST_F(LauncherTest, ErrorFileContentsInSummary) {
  RunResult r = run({"--nproc-per-node", "2", kWorker, "--print-env", "--error-file-on-rank", "0",
                     "disk on fire", "--sleep", "30"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::string error_file = env_by_rank(r.out)[0]["TORCHELASTIC_ERROR_FILE"];
  ASSERT_FALSE(error_file.empty()) << r.out;
  EXPECT_TRUE(contains(r.err, "  rank       : 0 (local rank 0)\n")) << r.err;
  // The file holds {"message": "disk on fire"}; the summary shows its message, indented.
  EXPECT_TRUE(contains(r.err, "  error file : " + error_file + "\n    disk on fire\n")) << r.err;
}

TEST_F(LauncherTest, StderrTailIsTheLast20Lines) {
  RunResult r = run({kWorker, "--lines", "50", "--exit-on-rank", "0", "5"});
  EXPECT_EQ(r.exit_code, 5) << r.err;
  auto lines = split_lines(r.err);
  auto header = std::find(lines.begin(), lines.end(), "  last 20 line(s) of rank 0's stderr:");
  ASSERT_NE(header, lines.end()) << r.err;
  std::vector<std::string> tail(header + 1, lines.end());
  std::vector<std::string> expected;
  for (int j = 31; j < 50; ++j) expected.push_back("    err 0 " + std::to_string(j));
  expected.push_back("    rank 0 exiting with 5 on purpose");
  // Exactly these lines, and the summary ends there.
  EXPECT_EQ(tail, expected) << r.err;
}

TEST_F(LauncherTest, WorkerIgnoringSigtermIsKilledAfterTermTimeout) {
  Process& agent = start({"--nproc-per-node", "2", "--term-timeout", "0.5", kWorker,
                          "--ignore-term", "--pid", "--sleep", "30"});
  // "pid=" is printed after --ignore-term took effect on both ranks.
  ASSERT_TRUE(wait_for_count(agent, "]:pid=", 2));
  auto pids = worker_pids(agent.out());
  const auto killed_at = Clock::now();
  ASSERT_EQ(::kill(pids[0], SIGKILL), 0);
  RunResult r = finish({&agent}, 20s)[0];
  const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  EXPECT_EQ(r.exit_code, 137) << r.err;
  EXPECT_TRUE(contains(r.err, "  rank       : 0 (local rank 0)\n")) << r.err;
  // Rank 1 shrugged off SIGTERM: the agent waited the grace period, then SIGKILLed it -
  // well before the 5 s default or the 30 s sleep.
  EXPECT_GE(seconds, 0.45);
  EXPECT_LT(seconds, 4.0);
  EXPECT_TRUE(wait_dead({pids[1]}, 2s));
}

TEST_F(LauncherTest, MaxRestartsRecovers) {
  RunResult r = run({"--nproc-per-node", "2", "--max-restarts", "2", kWorker,
                     "--fail-on-restart-below", "2", "--print-env"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 2u) << r.out;
  for (int rank : {0, 1}) {
    EXPECT_EQ(env[rank]["TORCHELASTIC_RESTART_COUNT"], "2") << "rank " << rank;
    EXPECT_EQ(env[rank]["TORCHELASTIC_MAX_RESTARTS"], "2") << "rank " << rank;
  }
  EXPECT_TRUE(contains(r.err, "restarting all workers (restart 1 of 2)")) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting all workers (restart 2 of 2)")) << r.err;
  EXPECT_TRUE(contains(r.err, "failing on restart 0")) << r.err;
  EXPECT_TRUE(contains(r.err, "failing on restart 1")) << r.err;
}

TEST_F(LauncherTest, MaxRestartsExhausted) {
  RunResult r = run({"--nproc-per-node", "2", "--max-restarts", "1", kWorker,
                     "--fail-on-restart-below", "2", "--print-env"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "restarting all workers (restart 1 of 1)")) << r.err;
  EXPECT_FALSE(contains(r.err, "restart 2")) << r.err;
  EXPECT_EQ(count(r.err, "  exit code  : 3\n"), 2u) << "one summary per failed attempt:\n" << r.err;
  EXPECT_TRUE(rank_lines(r.out).empty()) << "no attempt got past the failure:\n" << r.out;
}

// ---------------------------------------------------------------------------------------
// Signals to the agent

struct AgentSignal {
  int sig;
  int exit_code;
  std::string name;
};

// Test lists show the name, not a byte dump.
void PrintTo(const AgentSignal& s, std::ostream* os) { *os << s.name; }

class AgentSignalTest : public LauncherTest, public ::testing::WithParamInterface<AgentSignal> {};

TEST_P(AgentSignalTest, ForwardedAndEverythingDies) {
  const AgentSignal& s = GetParam();
  Process& agent =
      start({"--nproc-per-node", "2", kWorker, "--spawn-child", "--pid", "--sleep", "30"});
  ASSERT_TRUE(wait_for_count(agent, "]:pid=", 2));
  std::vector<pid_t> pids = child_pids(agent.out());
  ASSERT_EQ(pids.size(), 2u);
  for (auto& [rank, pid] : worker_pids(agent.out())) pids.push_back(pid);
  const auto signalled_at = Clock::now();
  agent.signal(s.sig);
  RunResult r = finish({&agent}, 20s)[0];
  const double seconds = std::chrono::duration<double>(Clock::now() - signalled_at).count();
  EXPECT_EQ(r.exit_code, s.exit_code) << r.err;
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(contains(r.err, "got " + s.name + ", stopping workers")) << r.err;
  // The agent never returns while a worker lives; grandchildren go with their groups.
  EXPECT_TRUE(wait_dead(pids, 2s)) << "a worker or grandchild survived the agent";
}

// While the agent waits for the other nodes (no worker exists yet), a signal ends it at once,
// as torchrun: once the signals waited, blocked, until --rdzv-timeout ran out.
TEST_P(AgentSignalTest, DuringTheRendezvousEndsTheAgentAtOnce) {
  const AgentSignal& s = GetParam();
  const int port = free_port();
  Process& agent = start({"--nnodes", "2", "--node-rank", "0", "--master-port",
                          std::to_string(port), "--rdzv-timeout", "60", kWorker, "--pid"});
  // Node 0 hosts the store (it answers once the agent is past its set-up), then waits for node 1.
  const auto deadline = Clock::now() + 20s;
  bool listening = false;
  while (!listening && Clock::now() < deadline) {
    try {
      store::StoreClient::connect("127.0.0.1", static_cast<std::uint16_t>(port), {1s, 1s});
      listening = true;
    } catch (const dtrain::Error&) {
      std::this_thread::sleep_for(50ms);
    }
  }
  ASSERT_TRUE(listening) << "node 0's agent never hosted the store\n" << agent.err();
  std::this_thread::sleep_for(300ms);  // into the rendezvous wait
  const auto signalled_at = Clock::now();
  agent.signal(s.sig);
  RunResult r = finish({&agent}, 20s)[0];
  const double seconds = std::chrono::duration<double>(Clock::now() - signalled_at).count();
  EXPECT_EQ(r.exit_code, s.exit_code) << r.err;
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(contains(r.err, "while waiting for the other nodes (rendezvous); stopping")) << r.err;
  EXPECT_FALSE(contains(r.out, "pid=")) << "no worker started:\n" << r.out;
}

INSTANTIATE_TEST_SUITE_P(Signals, AgentSignalTest,
                         ::testing::Values(AgentSignal{SIGINT, 130, "SIGINT"},
                                           AgentSignal{SIGTERM, 143, "SIGTERM"},
                                           AgentSignal{SIGHUP, 129, "SIGHUP"},
                                           AgentSignal{SIGQUIT, 131, "SIGQUIT"}),
                         [](const auto& info) { return info.param.name; });

TEST_F(LauncherTest, SigkillOfTheAgentTakesEverythingDown) {
  Process& agent = start({"--nproc-per-node", "2", kWorker, "--spawn-child", "--print-var",
                          "TORCHELASTIC_ERROR_FILE", "--pid", "--sleep", "30"});
  ASSERT_TRUE(wait_for_count(agent, "]:pid=", 2));
  // The agent's own temporary directory (<dir>/attempt_0/<local rank>/error.json).
  const std::string var = "]:TORCHELASTIC_ERROR_FILE=";
  const auto at = agent.out().find(var);
  ASSERT_NE(at, std::string::npos) << agent.out();
  const std::string error_file =
      agent.out().substr(at + var.size(), agent.out().find('\n', at) - at - var.size());
  const std::filesystem::path run_dir =
      std::filesystem::path(error_file).parent_path().parent_path().parent_path();
  ASSERT_TRUE(std::filesystem::is_directory(run_dir / "attempt_0")) << error_file;
  std::vector<pid_t> pids = child_pids(agent.out());
  ASSERT_EQ(pids.size(), 2u);
  for (auto& [rank, pid] : worker_pids(agent.out())) pids.push_back(pid);
  agent.signal(SIGKILL);
  RunResult r = finish({&agent}, 10s)[0];
  EXPECT_EQ(r.exit_code, 137);
  // Workers die by PDEATHSIG, grandchildren by the guard killing their groups.
  EXPECT_TRUE(wait_dead(pids, 2s)) << "a worker or grandchild outlived the SIGKILLed agent";
  // The guard removes the directory the agent could not.
  for (int i = 0; i < 100 && std::filesystem::exists(run_dir); ++i)
    std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(std::filesystem::exists(run_dir)) << run_dir << " outlived the SIGKILLed agent";
}

TEST_F(LauncherTest, EachWorkerLeadsItsOwnSession) {
  // As torchrun 2.x starts workers (start_new_session): each its own session and group, none
  // the agent's (or this test's). The suite runs this under the fork server too.
  RunResult r = run({"--nproc-per-node", "2", kWorker, "--session"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<pid_t> sessions;
  for (const auto& l : rank_lines(r.out)) {
    int pid = 0, sid = 0, pgid = 0;
    if (std::sscanf(l.text.c_str(), "session pid=%d sid=%d pgid=%d", &pid, &sid, &pgid) != 3)
      continue;
    EXPECT_EQ(sid, pid) << "rank " << l.rank << " does not lead its session";
    EXPECT_EQ(pgid, pid) << "rank " << l.rank << " does not lead its process group";
    EXPECT_NE(sid, ::getsid(0)) << "rank " << l.rank << " is in the launching session";
    sessions.insert(sid);
  }
  EXPECT_EQ(sessions.size(), 2u) << r.out;
}

// When the guard dies with its agent (a job step's processes killed whole), the run directory
// stays; the next agent on the host removes it, and only it: an unlocked `.lock` marks a
// directory whose owner is dead. One still locked (its agent alive) and one without a `.lock`
// (not the agent's kind) are left alone.
TEST_F(LauncherTest, AnAgentRemovesTheRunDirectoriesOfDeadAgents) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path();
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(free_port());
  const fs::path dead = tmp / ("dtrain-run-" + tag + "dead");
  const fs::path alive = tmp / ("dtrain-run-" + tag + "alive");
  const fs::path other = tmp / ("dtrain-run-" + tag + "other");
  for (const auto& d : {dead, alive, other}) fs::create_directories(d / "attempt_0" / "rank_0");
  std::ofstream(dead / ".lock").close();  // its owner's lock went with it
  std::ofstream(dead / "attempt_0" / "rank_0" / "error.json") << "{}";
  // Locked before it gets its name, as an agent takes its own: another test's agent sweeping
  // /tmp now must not find it unlocked.
  const int held = ::open((alive / ".lock.new").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  fs::rename(alive / ".lock.new", alive / ".lock");
  RunResult r = run({"--nproc-per-node", "1", kWorker});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Under ctest -j2 another test's agent may be the one that found it (and may still be
  // removing it when ours has ended): give that one a moment.
  for (auto until = Clock::now() + 5s; fs::exists(dead) && Clock::now() < until;)
    std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(fs::exists(dead)) << "a dead agent's run directory was left";
  EXPECT_TRUE(fs::exists(alive / "attempt_0")) << "a live agent's run directory was removed";
  EXPECT_TRUE(fs::exists(other / "attempt_0")) << "a directory without a .lock was removed";
  ::close(held);
  for (const auto& d : {dead, alive, other}) fs::remove_all(d);
}

TEST_F(LauncherTest, NoGrandchildSurvivesASuccessfulRun) {
  RunResult r = run({"--nproc-per-node", "2", kWorker, "--spawn-child", "--pid"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto children = child_pids(r.out);
  ASSERT_EQ(children.size(), 2u) << r.out;
  EXPECT_TRUE(wait_dead(children, 2s)) << "a `sleep 300` started by a worker outlived the job";
}

// ---------------------------------------------------------------------------------------
// The fork server (--start-method forkserver; the whole suite also runs under it)

struct Start {
  pid_t constructor_pid = 0;  // where test_worker's shared library was initialised
  pid_t pid = 0;              // the worker
  pid_t prepare_pid = 0;      // where the fork server ran the program's prepare hook (0: never)
};

// "[default<r>]:constructor_pid=A pid=B prepare_pid=C" lines by rank.
std::map<int, Start> starts(const std::string& out) {
  std::map<int, Start> m;
  for (const auto& l : rank_lines(out)) {
    Start s;
    if (std::sscanf(l.text.c_str(), "constructor_pid=%d pid=%d prepare_pid=%d", &s.constructor_pid,
                    &s.pid, &s.prepare_pid) == 3) {
      m[l.rank] = s;
    }
  }
  return m;
}

// `--role=` and `--signals-to-handle=`: torchrun 2.11 runs with the empty string (ROLE_NAME='',
// lines prefixed "[0]:", TORCHELASTIC_SIGNALS_TO_HANDLE=''), and so does dtrain; the next
// argument stays PROGRAM.
TEST_F(LauncherTest, EmptyRoleAndSignalListRunAsUnderTorchrun) {
  RunResult r = run({"--role=", "--signals-to-handle=", "--nproc-per-node", "2", kWorker,
                     "--print-var", "ROLE_NAME", "--print-var", "TORCHELASTIC_SIGNALS_TO_HANDLE"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* rank : {"0", "1"}) {
    EXPECT_EQ(count(r.out, std::string("[") + rank + "]:ROLE_NAME=\n"), 1u) << r.out;
    EXPECT_EQ(count(r.out, std::string("[") + rank + "]:TORCHELASTIC_SIGNALS_TO_HANDLE=\n"), 1u)
        << r.out;
  }
}

TEST_F(LauncherTest, ForkServerWorkersShareOneLoadAndGetTheirOwnEnvironment) {
  RunResult r =
      run({"--start-method", "forkserver", "--nproc-per-node", "3", kWorker, "--print-start",
           "--print-env", "--print-var", "LD_PRELOAD", "--print-var", "DTRAIN_FORKSERVER"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto s = starts(r.out);
  ASSERT_EQ(s.size(), 3u) << r.out;
  for (auto& [rank, st] : s) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_NE(st.constructor_pid, st.pid) << "the library was initialised in the worker itself";
    EXPECT_EQ(st.constructor_pid, s[0].constructor_pid) << "one fork server loads for all workers";
    EXPECT_EQ(st.prepare_pid, st.constructor_pid)
        << "the program's dtrain_forkserver_prepare ran in the server, once for every worker";
  }
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 3u);
  for (int rank : {0, 1, 2}) {
    EXPECT_EQ(env[rank]["RANK"], std::to_string(rank));
    EXPECT_EQ(env[rank]["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env[rank]["OMP_NUM_THREADS"], "1");
    EXPECT_TRUE(env[rank]["TORCHELASTIC_ERROR_FILE"].ends_with(
        "/attempt_0/" + std::to_string(rank) + "/error.json"));
  }
  // Nothing of the fork server's own set-up reaches the program.
  EXPECT_EQ(count(r.out, "]:LD_PRELOAD=<unset>\n"), 3u) << r.out;
  EXPECT_EQ(count(r.out, "]:DTRAIN_FORKSERVER=<unset>\n"), 3u) << r.out;
}

// ps, pgrep -f and /proc show a forked worker as they show a spawned one: its own command line,
// `${local_rank}` substituted as torchrun does, and its own environment (RANK), not the fork
// server's.
TEST_F(LauncherTest, ForkedWorkersShowTheirOwnCommandLineAndEnvironmentInProc) {
  for (const char* method : {"forkserver", "spawn"}) {
    SCOPED_TRACE(method);
    RunResult r = run({"--start-method", method, "--nproc-per-node", "2", kWorker, "--print-proc",
                       "out_${local_rank}.txt", "--rank=$local_rank"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const std::string rank : {"0", "1"}) {
      const std::string p = "[default" + rank + "]:";
      EXPECT_EQ(count(r.out, p + "proc_cmdline=" + kWorker + "|--print-proc|out_" + rank +
                                 ".txt|--rank=" + rank + "|\n"),
                1u)
          << r.out;
      EXPECT_EQ(count(r.out, p + "proc_env_RANK=" + rank + "\n"), 1u) << r.out;
      EXPECT_EQ(count(r.out, p + "proc_env_LOCAL_RANK=" + rank + "\n"), 1u) << r.out;
      EXPECT_EQ(count(r.out, p + "proc_env_DTRAIN_FORKSERVER=<unset>\n"), 1u) << r.out;
      EXPECT_EQ(count(r.out, p + "proc_env_LD_PRELOAD=<unset>\n"), 1u) << r.out;
    }
  }
}

TEST_F(LauncherTest, ForkServerKeepsTheUsersLdPreload) {
  RunOptions o;
  o.env = {std::string("LD_PRELOAD=") + PRELOAD_PROBE_LIB};
  RunResult r = run({"--start-method", "forkserver", "--nproc-per-node", "2", kWorker,
                     "--print-start", "--print-var", "LD_PRELOAD"},
                    30s, o);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, std::string("]:LD_PRELOAD=") + PRELOAD_PROBE_LIB + "\n"), 2u) << r.out;
  for (auto& [rank, st] : starts(r.out)) EXPECT_NE(st.constructor_pid, st.pid);
}

TEST_F(LauncherTest, SpawnAndAutoForAProgramWithoutLibtorchStartEachWorkerAfresh) {
  for (const char* method : {"spawn", "auto"}) {
    SCOPED_TRACE(method);
    RunResult r =
        run({"--start-method", method, "--nproc-per-node", "2", kWorker, "--print-start"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto s = starts(r.out);
    ASSERT_EQ(s.size(), 2u) << r.out;
    for (auto& [rank, st] : s) {
      EXPECT_EQ(st.constructor_pid, st.pid);
      EXPECT_EQ(st.prepare_pid, 0) << "no fork server: nothing calls the prepare hook";
    }
  }
}

TEST_F(LauncherTest, ForkServerFallsBackToExecWhenALibraryStartedAThread) {
  // fork() copies only the calling thread: the server must not fork a half-copied process.
  RunOptions o;
  o.env = {"PROBE_START_THREAD=1"};
  RunResult r = run({"--start-method", "forkserver", "--nproc-per-node", "2", kWorker,
                     "--print-start", "--print-env"},
                    30s, o);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto s = starts(r.out);
  ASSERT_EQ(s.size(), 2u) << r.out;
  for (auto& [rank, st] : s)
    EXPECT_EQ(st.constructor_pid, st.pid) << "rank " << rank << " was forked";
  auto env = env_by_rank(r.out);
  EXPECT_EQ(env[1]["RANK"], "1");
  EXPECT_TRUE(contains(r.err, "keeps a thread running after loading")) << r.err;
}

TEST_F(LauncherTest, ForkServerFallsBackToExecWhenCudaWasInitialisedWhileLoading) {
  // A child forked after cuInit cannot use CUDA. FAKE_LIBCUDA_LIB stands in for the driver
  // (soname libcuda.so.1: this machine may have none); a library of the program loads it.
  for (const bool init : {true, false}) {
    SCOPED_TRACE(init ? "initialised" : "loaded only");
    RunOptions o;
    o.env = {std::string("PROBE_CUDA=") + FAKE_LIBCUDA_LIB,
             std::string("PROBE_CUDA_INIT=") + (init ? "1" : "0")};
    RunResult r =
        run({"--start-method", "forkserver", "--nproc-per-node", "2", kWorker, "--print-start"},
            30s, o);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto s = starts(r.out);
    ASSERT_EQ(s.size(), 2u) << r.out;
    for (auto& [rank, st] : s) {
      if (init) {
        EXPECT_EQ(st.constructor_pid, st.pid) << "rank " << rank << " was forked after cuInit";
      } else {
        EXPECT_NE(st.constructor_pid, st.pid) << "rank " << rank << ": loading alone is no reason";
      }
    }
    EXPECT_EQ(contains(r.err, "initialises CUDA's driver while loading"), init) << r.err;
  }
}

// The CPUs this (test) process may run on.
std::set<int> my_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::set<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.insert(c);
  }
  return cpus;
}

// "0,1,8" -> {0, 1, 8}.
std::set<int> cpu_set_of(const std::string& list) {
  std::set<int> cpus;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) cpus.insert(std::stoi(item));
  return cpus;
}

// DeepSpeed's --bind_cores_to_rank: every local rank on its own cores (2 ranks need 2 physical
// cores, as the CI machine has), its OMP_NUM_THREADS the cores it got. The suite runs this
// under the fork server too, where the forked child binds itself.
TEST_F(LauncherTest, BindCoresToRankGivesEachRankItsOwnCores) {
  RunResult r = run({"--bind-cores-to-rank", "--nproc-per-node", "2", kWorker, "--print-affinity",
                     "--print-var", "DTRAIN_BIND_CPUS", "--print-var", "OMP_NUM_THREADS"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<int, std::set<int>> affinity;
  std::map<int, std::string> bound, omp;
  for (const auto& l : rank_lines(r.out)) {
    if (l.text.rfind("affinity=", 0) == 0) affinity[l.rank] = cpu_set_of(l.text.substr(9));
    if (l.text.rfind("DTRAIN_BIND_CPUS=", 0) == 0) bound[l.rank] = l.text.substr(17);
    if (l.text.rfind("OMP_NUM_THREADS=", 0) == 0) omp[l.rank] = l.text.substr(16);
  }
  ASSERT_EQ(affinity.size(), 2u) << r.out;
  const std::set<int> mine = my_cpus();
  for (int rank : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_FALSE(affinity[rank].empty());
    EXPECT_EQ(affinity[rank], cpu_set_of(bound[rank])) << "bound to what DTRAIN_BIND_CPUS says";
    for (int c : affinity[rank]) EXPECT_TRUE(mine.count(c)) << "CPU " << c << " is not this node's";
    EXPECT_GE(std::stoi(omp[rank]), 1);
    EXPECT_LE(static_cast<size_t>(std::stoi(omp[rank])), affinity[rank].size())
        << "one thread per physical core of the rank's";
  }
  for (int c : affinity[0]) EXPECT_FALSE(affinity[1].count(c)) << "CPU " << c << " is shared";
  EXPECT_EQ(omp[0], omp[1]);
}

// --bind-core-list: the listed CPUs, shared out in order (here all of them to one rank); a
// user's OMP_NUM_THREADS wins over the count.
TEST_F(LauncherTest, BindCoreListSharesOutTheListedCpus) {
  const int last = *my_cpus().rbegin();
  RunOptions o;
  o.env = {"OMP_NUM_THREADS=3"};
  RunResult r =
      run({"--bind-cores-to-rank", "--bind-core-list", std::to_string(last), "--nproc-per-node",
           "1", kWorker, "--print-affinity", "--print-var", "OMP_NUM_THREADS"},
          30s, o);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "]:affinity=" + std::to_string(last) + "\n"), 1u) << r.out;
  EXPECT_EQ(count(r.out, "]:OMP_NUM_THREADS=3\n"), 1u) << r.out;
  // Without the user's value: one thread per CPU of the list.
  r = run({"--bind-cores-to-rank", "--bind-core-list", std::to_string(last), "--nproc-per-node",
           "1", kWorker, "--print-var", "OMP_NUM_THREADS"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "]:OMP_NUM_THREADS=1\n"), 1u) << r.out;
}

TEST_F(LauncherTest, AProgramStartedWhileLoadingRunsOnceAndDoesNotServe) {
  // It inherits the server's environment (LD_PRELOAD, DTRAIN_FORKSERVER) and must just run.
  RunOptions o;
  o.env = {"PROBE_SPAWN=echo started while loading"};
  RunResult r = run(
      {"--start-method", "forkserver", "--nproc-per-node", "2", kWorker, "--print-env"}, 30s, o);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "started while loading\n"), 1u) << r.out;
  auto env = env_by_rank(r.out);
  EXPECT_EQ(env[0]["RANK"], "0");
  EXPECT_EQ(env[1]["RANK"], "1");
  // One left running in the background holds the server's pipes: the job still ends with
  // its workers, with their exit code.
  o.env = {"PROBE_SPAWN=sleep 20 &"};
  r = run({"--start-method", "forkserver", "--nproc-per-node", "2", kWorker, "--exit-on-rank", "0",
           "5"},
          30s, o);
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_LT(r.elapsed, 10.0);
  // ... and when the server dies while loading, its end is seen without the pipe's EOF.
  o.env = {"PROBE_SPAWN=sleep 20 & kill -KILL $PPID"};
  r = run(
      {"--start-method", "forkserver", "--nproc-per-node", "2", kWorker, "--touch", path("ran")},
      30s, o);
  EXPECT_EQ(r.exit_code, 137) << r.err;
  EXPECT_LT(r.elapsed, 10.0);
  EXPECT_TRUE(contains(r.err, "the fork server (pid ")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("ran")));
}

TEST_F(LauncherTest, ForkServerStandbyLoadsTheRestartBeforeItIsNeeded) {
  // Each load of the program (a fork server's) appends "before|after PID" to `loads`: whether
  // attempt 0's workers had begun to fail by then, and the loading process.
  RunOptions o;
  o.env = {"PROBE_SPAWN=(test -e " + path("failing") +
           " && echo after $PPID || echo before $PPID) >> " + path("loads")};
  RunResult r = run({"--start-method", "forkserver", "--nproc-per-node", "2", "--max-restarts", "1",
                     kWorker, "--sleep", "0.5", "--touch", path("failing"),
                     "--fail-on-restart-below", "1", "--print-start", "--print-env"},
                    30s, o);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(path("loads"));
  std::vector<std::pair<std::string, pid_t>> loads;
  std::string when;
  pid_t pid;
  while (in >> when >> pid) loads.emplace_back(when, pid);
  // The restart's server was loaded while attempt 0 ran (no third one: no restart is left).
  ASSERT_EQ(loads.size(), 2u) << r.err;
  EXPECT_EQ(loads[0].first, "before");
  EXPECT_EQ(loads[1].first, "before")
      << "the restart's workers came from a server loaded after the failure";
  auto s = starts(r.out);
  auto env = env_by_rank(r.out);
  ASSERT_EQ(s.size(), 2u) << r.out;
  for (int rank : {0, 1}) {
    EXPECT_EQ(s[rank].constructor_pid, loads[1].second) << "rank " << rank;
    EXPECT_EQ(env[rank]["TORCHELASTIC_RESTART_COUNT"], "1");
    EXPECT_EQ(env[rank]["RANK"], std::to_string(rank));
  }
  // A standby that is never used (the job succeeds first) is gone with the job.
  std::filesystem::remove(path("loads"));
  r = run({"--start-method", "forkserver", "--nproc-per-node", "2", "--max-restarts", "1", kWorker,
           "--sleep", "0.5"},
          30s, o);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream again(path("loads"));
  loads.clear();
  while (again >> when >> pid) loads.emplace_back(when, pid);
  ASSERT_EQ(loads.size(), 2u) << r.err;
  EXPECT_TRUE(wait_dead({loads[1].second}, 2s)) << "the unused standby outlived the job";
}

TEST_F(LauncherTest, UnsyncedCoutOfAForkedWorkerIsFlushedAtExit) {
  for (const char* method : {"spawn", "forkserver"}) {
    SCOPED_TRACE(method);
    RunResult r = run({"--start-method", method, "--nproc-per-node", "2", kWorker,
                       "--unsynced-cout", "buffered"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(count(r.out, "]:buffered\n"), 2u) << r.out;
  }
}

// A worker's progress bar (a carriage return, the bar, no newline yet) is on the console while
// the worker runs, as under torchrun, whose workers write to the terminal themselves.
TEST_F(LauncherTest, AProgressBarIsOnTheConsoleBeforeItsLineEnds) {
  Process& p = start({"--nproc-per-node", "1", kWorker, "--no-newline", "\r 50%", "--sleep", "0.3",
                      "--no-newline", "\r100%", "--sleep", "60"});
  ASSERT_TRUE(wait_for_count(p, "[default0]: 50%\r[default0]:100%", 1));
  ::kill(p.pid(), SIGTERM);
  RunResult r = p.finish(30s);
  EXPECT_EQ(r.exit_code, 143) << r.err;
  // The line the worker never ended is ended on the console when it stops.
  EXPECT_NE(r.out.find("[default0]: 50%\r[default0]:100%\n"), std::string::npos) << r.out;
}

// A prompt (a partial line that stays partial, as pdb's "(Pdb) ") is on the console before
// its line ends, as under torchrun, whose workers write to the terminal; both start methods.
TEST_F(LauncherTest, APromptIsOnTheConsoleBeforeItsLineEnds) {
  for (const char* method : {"spawn", "forkserver"}) {
    SCOPED_TRACE(method);
    Process& p = start({"--start-method", method, "--nproc-per-node", "1", kWorker, "--no-newline",
                        "(Pdb) ", "--sleep", "60"});
    ASSERT_TRUE(wait_for_count(p, "[default0]:(Pdb) ", 1));
    ::kill(p.pid(), SIGTERM);
    RunResult r = p.finish(30s);
    EXPECT_EQ(r.exit_code, 143) << r.err;
    EXPECT_NE(r.out.find("[default0]:(Pdb) \n"), std::string::npos) << r.out;
  }
}

// Workers read dtrain's stdin, as torchrun's read torchrun's (a debugger at one rank, input
// piped in); dtrain's own stdin here is a file, through /bin/sh.
TEST_F(LauncherTest, WorkersReadTheLaunchersStdin) {
  const std::string input = path("stdin.txt");
  { std::ofstream(input) << "hello from stdin\n"; }
  for (const char* method : {"spawn", "forkserver"}) {
    SCOPED_TRACE(method);
    RunResult r = Process::start({"/bin/sh", "-c", "exec 0<\"$1\"; shift; exec \"$@\"", "sh", input,
                                  kDtrain, "run", "--start-method", method, "--nproc-per-node", "1",
                                  kWorker, "--read-stdin"})
                      .finish(30s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("[default0]:stdin=hello from stdin\n"), std::string::npos) << r.out;
  }
}

TEST_F(LauncherTest, ExitHooksAndBufferedOutputOfForkedWorkersRun) {
  for (const char* method : {"spawn", "forkserver"}) {
    SCOPED_TRACE(method);
    RunResult ok =
        run({"--start-method", method, "--nproc-per-node", "2", kWorker, "--exit-hooks", "0"});
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    for (int rank : {0, 1}) {
      const std::string p = "[default" + std::to_string(rank) + "]:";
      EXPECT_TRUE(contains(ok.out, p + "exiting with 0\n" + p + "static destructor ran\n" + p +
                                       "atexit handler ran\n" + p + "destructor function ran\n"))
          << ok.out;
    }
    RunResult dl = run(
        {"--start-method", method, "--nproc-per-node", "2", kWorker, "--dlopen", DLOPEN_PROBE_LIB});
    EXPECT_EQ(dl.exit_code, 0) << dl.err;
    EXPECT_EQ(count(dl.out, "]:dlopened library destructor ran\n"), 2u) << dl.out;
    RunResult bad = run({"--start-method", method, kWorker, "--exit-hooks", "5"});
    EXPECT_EQ(bad.exit_code, 5) << bad.err;
    EXPECT_TRUE(contains(bad.out, "[default0]:destructor function ran\n")) << bad.out;
    EXPECT_TRUE(contains(bad.err, "  exit code  : 5\n")) << bad.err;
  }
}

TEST_F(LauncherTest, ForkServerThatFailsWhileLoadingFailsTheJob) {
  RunOptions o;
  o.env = {"PROBE_EXIT=9"};
  RunResult r = run(
      {"--start-method", "forkserver", "--nproc-per-node", "2", kWorker, "--touch", path("ran")},
      30s, o);
  EXPECT_EQ(r.exit_code, 9) << r.err;
  EXPECT_LT(r.elapsed, 5.0);
  EXPECT_TRUE(contains(r.err, "  rank       : 0 (local rank 0)\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "  exit code  : 9\n")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("ran"))) << "a worker ran main()";
}

// The agent's children that run test_worker (the fork server while it loads).
std::vector<pid_t> test_worker_children(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_file("/proc/" + name + "/stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    // argv[0]: the agent's guard has test_worker among its arguments too.
    if (ppid == parent && read_file("/proc/" + name + "/cmdline").starts_with(kWorker + '\0')) {
      out.push_back(std::atoi(name.c_str()));
    }
  }
  return out;
}

TEST_F(LauncherTest, SignalsWhileTheForkServerLoadsStopIt) {
  for (int sig : {SIGTERM, SIGKILL}) {
    SCOPED_TRACE(sig);
    RunOptions o;
    o.env = {"PROBE_SLEEP=60"};
    Process& agent = start({"--start-method", "forkserver", "--nproc-per-node", "2", kWorker}, o);
    std::vector<pid_t> server;
    for (int i = 0; i < 100 && server.empty(); ++i) {
      std::this_thread::sleep_for(50ms);
      server = test_worker_children(agent.pid());
    }
    ASSERT_EQ(server.size(), 1u) << "no fork server under the agent";
    agent.signal(sig);
    RunResult r = finish({&agent}, 10s)[0];
    EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
    EXPECT_LT(r.elapsed, 5.0);
    EXPECT_TRUE(wait_dead(server, 2s)) << "the fork server outlived the agent";
  }
}

// ---------------------------------------------------------------------------------------
// Multi-node jobs: several agents on loopback

// Arguments of one agent of a static multi-node job.
Args static_node(int nnodes, int node_rank, int nproc, int port, const std::string& id,
                 Args program) {
  Args a{"--nnodes",         std::to_string(nnodes),
         "--node-rank",      std::to_string(node_rank),
         "--nproc-per-node", std::to_string(nproc),
         "--master-port",    std::to_string(port),
         "--rdzv-id",        id,
         "--rdzv-timeout",   "30"};
  a.insert(a.end(), program.begin(), program.end());
  return a;
}

// Checks one agent's workers: global ranks offset..offset+nproc-1, laid out by node.
void expect_node_layout(const RunResult& r, int node_rank, int nnodes, int offset, int nproc,
                        int world, int port) {
  SCOPED_TRACE("node " + std::to_string(node_rank));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  std::set<int> ranks;
  for (auto& [rank, e] : env) ranks.insert(rank);
  std::set<int> expected;
  for (int i = 0; i < nproc; ++i) expected.insert(offset + i);
  EXPECT_EQ(ranks, expected) << r.out;
  for (int rank : expected) {
    auto& e = env[rank];
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(e["RANK"], std::to_string(rank));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(rank - offset));
    EXPECT_EQ(e["WORLD_SIZE"], std::to_string(world));
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], std::to_string(nproc));
    EXPECT_EQ(e["GROUP_RANK"], std::to_string(node_rank));
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], std::to_string(nnodes));
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["MASTER_PORT"], std::to_string(port));
    EXPECT_TRUE(contains(r.out, "]:store barrier passed on rank " + std::to_string(rank) + "\n"))
        << r.out;
  }
}

TEST_F(LauncherTest, TwoAgentsStatic) {
  const int port = free_port();
  const Args program{kWorker, "--print-env", "--store-barrier"};
  Process& n0 = start(static_node(2, 0, 2, port, "static2", program));
  Process& n1 = start(static_node(2, 1, 2, port, "static2", program));
  auto rs = finish({&n0, &n1}, 40s);
  expect_node_layout(rs[0], 0, 2, 0, 2, 4, port);
  expect_node_layout(rs[1], 1, 2, 2, 2, 4, port);
}

TEST_F(LauncherTest, ThreeAgentsStaticWithUnevenNodes) {
  const int port = free_port();
  const Args program{kWorker, "--print-env", "--store-barrier"};
  // Started in reverse: ranks follow node ranks, not start order.
  Process& n2 = start(static_node(3, 2, 2, port, "static3", program));
  Process& n1 = start(static_node(3, 1, 1, port, "static3", program));
  Process& n0 = start(static_node(3, 0, 2, port, "static3", program));
  auto rs = finish({&n0, &n1, &n2}, 40s);
  expect_node_layout(rs[0], 0, 3, 0, 2, 5, port);
  expect_node_layout(rs[1], 1, 3, 2, 1, 5, port);
  expect_node_layout(rs[2], 2, 3, 3, 2, 5, port);
}

TEST_F(LauncherTest, ThreeAgentsC10d) {
  const int port = free_port();
  std::vector<Process*> agents;
  for (int i = 0; i < 3; ++i) {
    agents.push_back(&start({"--nnodes", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                             "127.0.0.1:" + std::to_string(port), "--rdzv-id", "c10d3",
                             "--rdzv-timeout", "30", kWorker, "--print-env", "--store-barrier"}));
  }
  auto rs = finish(agents, 40s);
  std::set<int> node_ranks;
  for (auto& r : rs) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    auto env = env_by_rank(r.out);
    ASSERT_EQ(env.size(), 1u) << r.out;
    auto& [rank, e] = *env.begin();
    int node = std::atoi(e["GROUP_RANK"].c_str());
    node_ranks.insert(node);
    EXPECT_EQ(rank, node) << "one worker per node: global rank = node rank";
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "3");
    EXPECT_EQ(e["MASTER_PORT"], std::to_string(port));
    EXPECT_TRUE(contains(r.out, "store barrier passed on rank " + std::to_string(rank))) << r.out;
  }
  EXPECT_EQ(node_ranks, (std::set<int>{0, 1, 2}));
}

TEST_F(LauncherTest, FailureOnNode1StopsBothAgents) {
  const int port = free_port();
  // Global rank 3 is node 1's local rank 1.
  const Args program{kWorker, "--exit-on-rank", "3", "9", "--sleep", "30"};
  Process& n0 = start(static_node(2, 0, 2, port, "fail2", program));
  Process& n1 = start(static_node(2, 1, 2, port, "fail2", program));
  auto rs = finish({&n0, &n1}, 40s);
  for (int node : {0, 1}) {
    SCOPED_TRACE("agent of node " + std::to_string(node));
    const RunResult& r = rs[node];
    EXPECT_EQ(r.exit_code, 9) << r.err;
    EXPECT_LT(r.elapsed, 15.0) << "the healthy node must not wait for its 30 s sleepers";
    EXPECT_TRUE(contains(r.err, "dtrain: job failed; root cause")) << r.err;
    EXPECT_TRUE(contains(r.err, "  node rank  : 1\n")) << r.err;
    EXPECT_TRUE(contains(r.err, "  rank       : 3 (local rank 1)\n")) << r.err;
    EXPECT_TRUE(contains(r.err, "  exit code  : 9\n")) << r.err;
    EXPECT_TRUE(contains(r.err, "    rank 3 exiting with 9 on purpose\n")) << r.err;
  }
}

TEST_F(LauncherTest, MissingNodeTimesOutNamingIt) {
  const int port = free_port();
  const std::string marker = path("started");
  RunResult r = run({"--nnodes", "2", "--node-rank", "0", "--master-port", std::to_string(port),
                     "--rdzv-timeout", "1", kWorker, "--touch", marker});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_GE(r.elapsed, 0.9);
  EXPECT_LT(r.elapsed, 6.0);
  EXPECT_TRUE(contains(r.err, "node rank(s) 1 of 2 never joined")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(marker)) << "no worker may start without the whole job";
}

// --store-token: the agents and the workers of a job prove the token; an agent with another
// one fails at once with a message that says so, instead of waiting for the rendezvous.
TEST_F(LauncherTest, StoreTokenAgentsMeetAndAWrongTokenFailsAtOnce) {
  const int port = free_port();
  auto node = [&](int rank, Args token_flags) {
    Args a{"--nnodes",         "2",      "--node-rank",    std::to_string(rank),
           "--nproc-per-node", "1",      "--master-port",  std::to_string(port),
           "--rdzv-id",        "token2", "--rdzv-timeout", "30"};
    a.insert(a.end(), token_flags.begin(), token_flags.end());
    a.insert(a.end(), {kWorker, "--print-env", "--store-barrier"});
    return a;
  };
  RunOptions env_token;
  env_token.env = {"DTRAIN_STORE_TOKEN=job-secret"};
  Process& n0 = start(node(0, {}), env_token);
  RunResult wrong = run(node(1, {"--store-token", "not-the-secret"}), 20s);
  EXPECT_EQ(wrong.exit_code, 1) << wrong.err;
  EXPECT_LT(wrong.elapsed, 10.0) << "a refused token must fail the agent, not time out";
  EXPECT_TRUE(contains(wrong.err, "refused this process's store token")) << wrong.err;
  EXPECT_TRUE(contains(wrong.err, "--store-token")) << wrong.err;
  Process& n1 = start(node(1, {"--store-token", "job-secret"}));
  auto rs = finish({&n0, &n1}, 40s);
  expect_node_layout(rs[0], 0, 2, 0, 1, 2, port);
  expect_node_layout(rs[1], 1, 2, 1, 1, 2, port);
  // (The workers' store barrier passed: they proved the token they got from their agent.)
  EXPECT_TRUE(contains(rs[0].err, "sent a wrong store token")) << rs[0].err;
}

// --store-token - on a stdin that stays open and silent (a terminal, a pipe whose writer never
// writes) is not waited on for ever: within 60 s, or a shorter --rdzv-timeout, it is refused.
TEST_F(LauncherTest, StoreTokenOnASilentStdinIsRefusedInTime) {
  const std::string fifo = path("silent-stdin"), marker = path("started");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opened read-write, the FIFO has a writer (this shell, then dtrain itself) that never writes.
  RunResult r = Process::start({"/bin/sh", "-c", "exec 0<>\"$1\"; shift; exec \"$@\"", "sh", fifo,
                                kDtrain, "run", "--store-token", "-", "--rdzv-timeout", "1",
                                kWorker, "--touch", marker})
                    .finish(20s);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--store-token -: no token line arrived on stdin within 1 s"))
      << r.err;
  EXPECT_LT(r.elapsed, 5.0);
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the program ran without a token";
}

// A client without the token cannot touch a protected job's store: the connection is
// closed at its first request and the agent names it.
TEST_F(LauncherTest, AStrangerCannotUseAProtectedJobsStore) {
  const int port = free_port();
  Process& job = start({"--master-port", std::to_string(port), "--store-token", "job-secret",
                        kWorker, "--print-env", "--sleep", "3"});
  ASSERT_TRUE(wait_for_count(job, "LOCAL_RANK=", 1));
  store::StoreClient::Options o;
  o.connect_timeout = 5s;
  o.timeout = 5s;
  auto stranger = store::StoreClient::connect("127.0.0.1", static_cast<std::uint16_t>(port), o);
  // SET has no reply: the client learns of the closed connection at its next request.
  try {
    stranger->set("forged", "x");
  } catch (const NetworkError&) {
  }
  EXPECT_THROW(stranger->check({"forged"}), NetworkError);
  o.token = "guess";
  EXPECT_THROW(store::StoreClient::connect("127.0.0.1", static_cast<std::uint16_t>(port), o),
               store::StoreAuthError);
  o.token = "job-secret";
  auto member = store::StoreClient::connect("127.0.0.1", static_cast<std::uint16_t>(port), o);
  EXPECT_FALSE(member->check({"forged"})) << "a stranger's SET reached the store";
  RunResult r = job.finish(20s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "did not prove the store token")) << r.err;
  EXPECT_TRUE(contains(r.err, "sent a wrong store token")) << r.err;
}

TEST_F(LauncherTest, DuplicateNodeRankIsRefused) {
  const int port = free_port();
  const Args program{kWorker, "--pid", "--sleep", "30"};
  Process& n0 = start(static_node(2, 0, 1, port, "dup", program));
  Process& n1 = start(static_node(2, 1, 1, port, "dup", program));
  // Both ranks are taken once their workers run.
  ASSERT_TRUE(wait_for_count(n0, "]:pid=", 1));
  ASSERT_TRUE(wait_for_count(n1, "]:pid=", 1));
  const std::string marker = path("started");
  RunResult r = run(static_node(2, 1, 1, port, "dup", {kWorker, "--touch", marker}), 20s);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "dtrain run: error: rendezvous: node rank 1 was already taken"))
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(marker));
  // The job itself is unharmed by the refused agent.
  EXPECT_FALSE(process_dead(n0.pid()));
  EXPECT_FALSE(process_dead(n1.pid()));
}

// ---------------------------------------------------------------------------------------
// Bad input: exit 2 at once, a message naming the flag and the value, nothing started.

struct BadInput {
  std::string name;
  Args args;                          // {WORKER}, {MARKER}, {TMP}, {PORT} are filled in by the test
  std::vector<std::string> expected;  // substrings of stderr
};

void PrintTo(const BadInput& c, std::ostream* os) { *os << c.name; }

class BadInputTest : public LauncherTest, public ::testing::WithParamInterface<BadInput> {};

const Args kMarkedWorker{"{WORKER}", "--touch", "{MARKER}"};

Args with_worker(Args flags) {
  flags.insert(flags.end(), kMarkedWorker.begin(), kMarkedWorker.end());
  return flags;
}

std::vector<BadInput> bad_inputs() {
  const std::string run_error = "dtrain run: error: ";
  return {
      {"NprocZero",
       with_worker({"--nproc-per-node", "0"}),
       {run_error + "--nproc-per-node: got '0', expected a positive integer"}},
      {"NprocNegative",
       with_worker({"--nproc-per-node", "-1"}),
       {run_error + "--nproc-per-node: got '-1', expected a positive integer"}},
      {"BindCoreListWithoutBinding",
       with_worker({"--bind-core-list", "0"}),
       {run_error + "--bind-core-list '0' shares CPUs out only with --bind-cores-to-rank"}},
      {"BindCoreListReversed",
       with_worker({"--bind-cores-to-rank", "--bind-core-list", "1-0"}),
       {run_error + "--bind-core-list: '1-0' in '1-0' is a range whose end is below its start"}},
      {"BindCoreListOverlapping",
       with_worker({"--bind-cores-to-rank", "--bind-core-list", "0-1,1"}),
       {run_error + "--bind-core-list: '0-1,1' repeats or reorders CPUs"}},
      {"BindCoreListNotCpus",
       with_worker({"--bind-cores-to-rank", "--bind-core-list", "0-x"}),
       {run_error + "--bind-core-list: '0-x' is not a CPU list"}},
      {"BindCoreListCpuNotAllowed",
       with_worker({"--bind-cores-to-rank", "--bind-core-list", "4000"}),
       {run_error + "--bind-core-list: CPU 4000 is not one this node may run on"}},
      {"BindCoreListTooShortForTheRanks",
       with_worker({"--bind-cores-to-rank", "--bind-core-list", "0", "--nproc-per-node", "2"}),
       {run_error + "--bind-cores-to-rank: --bind-core-list has 1 CPU(s) for 2 local ranks"}},
      {"NprocNotANumber",
       with_worker({"--nproc-per-node", "abc"}),
       {run_error + "--nproc-per-node: got 'abc', expected a positive integer"}},
      {"NnodesZero",
       with_worker({"--nnodes", "0"}),
       {run_error + "--nnodes: got '0', expected a positive integer"}},
      {"NodeRankNotBelowNnodes",
       with_worker({"--nnodes", "2", "--node-rank", "2"}),
       {run_error + "--node-rank: got '2', expected 0..1"}},
      {"MissingProgram", {"--nproc-per-node", "2"}, {run_error + "missing PROGRAM"}},
      {"NonExecutableFile",
       {"{TMP}/data.txt", "--touch", "{MARKER}"},
       {run_error + "PROGRAM '{TMP}/data.txt' is not an executable file"}},
      {"Directory",
       {"{TMP}", "--touch", "{MARKER}"},
       {run_error + "PROGRAM '{TMP}' is not an executable file"}},
      {"ProgramNotFound",
       {"{TMP}/nope", "--touch", "{MARKER}"},
       {run_error + "PROGRAM '{TMP}/nope': no such file"}},
      {"EndpointWithoutPortNumber",
       with_worker({"--rdzv-endpoint", "127.0.0.1:"}),
       {run_error + "--rdzv-endpoint: got '127.0.0.1:', expected HOST:PORT"}},
      {"EndpointPortTooLarge",
       with_worker({"--rdzv-endpoint", "127.0.0.1:70000"}),
       {run_error + "--rdzv-endpoint: got '127.0.0.1:70000', expected HOST:PORT"}},
      {"EndpointPortNotANumber",
       with_worker({"--rdzv-endpoint", "host:abc"}),
       {run_error + "--rdzv-endpoint: got 'host:abc', expected HOST:PORT"}},
      {"MasterPortInUse",
       with_worker({"--master-port", "{PORT}"}),
       {run_error + "--master-port/--rdzv-endpoint: port {PORT} is already in use"}},
      // The port came from --rdzv-endpoint: the message must not name --master-port alone.
      {"RdzvEndpointPortInUse",
       with_worker({"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:{PORT}"}),
       {run_error + "--master-port/--rdzv-endpoint: port {PORT} is already in use"}},
      {"StoreTokenForAPythonProgram",
       {"--store-token", "secret", "{TMP}/train.py"},
       {run_error + "--store-token / DTRAIN_STORE_TOKEN: '{TMP}/train.py' runs in Python"}},
      {"MasterPortZeroOnTwoNodes",
       with_worker({"--nnodes", "2", "--master-port", "0"}),
       {run_error + "--master-port: port 0"}},
      {"RdzvBackendEtcd",
       with_worker({"--rdzv-backend", "etcd"}),
       {run_error + "--rdzv-backend: got 'etcd'"}},
      {"RedirectsOutOfRange",
       with_worker({"--redirects", "4"}),
       {run_error + "--redirects: got '4', expected 0-3"}},
      {"TeeBadRank", with_worker({"--tee", "x:1"}), {run_error + "--tee: got 'x:1', expected 0-3"}},
      {"EnvWithoutEquals",
       with_worker({"--env", "NOEQUALS"}),
       {run_error + "--env: got 'NOEQUALS', expected KEY=VALUE"}},
      {"MaxRestartsNegative",
       with_worker({"--max-restarts", "-1"}),
       {run_error + "--max-restarts: got '-1', expected a non-negative integer"}},
      // Bound as an int, so CLI11 rejects it in its own words; still exit 2, flag and value named.
      {"MaxRestartsNotANumber", with_worker({"--max-restarts", "abc"}), {"--max-restarts", "abc"}},
      {"TermTimeoutNotANumber",
       with_worker({"--term-timeout", "soon"}),
       {run_error + "--term-timeout: got 'soon', expected a non-negative number of seconds"}},
      {"StartMethodUnknown",
       with_worker({"--start-method", "threads"}),
       {run_error + "--start-method: got 'threads', expected auto, spawn, forkserver or fork"}},
      {"StartMethodForkserverForAScript",
       {"--start-method", "forkserver", "{TMP}/script.sh", "{MARKER}"},
       {run_error + "--start-method forkserver: PROGRAM '{TMP}/script.sh' is not a dynamically "
                    "linked ELF program"}},
      {"RdzvTimeoutNegative",
       with_worker({"--rdzv-timeout", "-3"}),
       {run_error + "--rdzv-timeout: got '-3', expected a non-negative number of seconds"}},
      // CLI11 took the next argument as the value: the worker became the role and its first
      // argument the program.
      {"EmptyValueAfterEquals",
       with_worker({"--term-timeout="}),
       {run_error +
        "--term-timeout=: an empty value; give one (--term-timeout=VALUE) or leave the flag out"}},
      // torchrun 2.11 stops on these too (ParseRunArgs.EmptyFlagValuesAsUnderTorchrun).
      {"EmptyValueWhereTorchrunStops",
       with_worker({"--nnodes="}),
       {run_error + "--nnodes=: an empty value; torchrun 2.11 stops on it too (ValueError: "
                    "invalid literal for int() with base 10: ''): give one (--nnodes=VALUE)"}},
      {"LogDirThatCannotBeMade",
       with_worker({"--log-dir", "{TMP}/data.txt/logs"}),
       {run_error + "--log-dir {TMP}/data.txt/logs: cannot create {TMP}/data.txt/logs/",
        "give a directory this user can write"}},
  };
}

std::string fill(std::string s, const std::map<std::string, std::string>& vars) {
  for (const auto& [key, value] : vars) {
    for (size_t pos = s.find(key); pos != std::string::npos;
         pos = s.find(key, pos + value.size())) {
      s.replace(pos, key.size(), value);
    }
  }
  return s;
}

TEST_P(BadInputTest, ExitsTwoNamingFlagAndValueWithoutStarting) {
  const BadInput& c = GetParam();
  HeldPort held;  // for MasterPortInUse, RdzvEndpointPortInUse: a port some other program is
                  // listening on
  std::ofstream(path("data.txt")) << "not a program\n";
  ::chmod(path("data.txt").c_str(), 0644);
  std::ofstream(path("script.sh")) << "#!/bin/sh\ntouch \"$1\"\n";
  ::chmod(path("script.sh").c_str(), 0755);
  const std::string marker = path("started");
  const std::map<std::string, std::string> vars = {{"{WORKER}", kWorker},
                                                   {"{MARKER}", marker},
                                                   {"{TMP}", tmp_},
                                                   {"{PORT}", std::to_string(held.port())}};
  Args args;
  for (const auto& a : c.args) args.push_back(fill(a, vars));
  RunResult r = run(args, 10s);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  for (const auto& e : c.expected) EXPECT_TRUE(contains(r.err, fill(e, vars))) << r.err;
  EXPECT_LT(r.elapsed, 1.0) << "bad input must be refused before anything waits";
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the program ran despite bad input";
}

INSTANTIATE_TEST_SUITE_P(Table, BadInputTest, ::testing::ValuesIn(bad_inputs()),
                         [](const auto& info) { return info.param.name; });

// A bad value from a PET_ variable (torchrun's fallback for an option not typed) is named by its
// variable, through the real command.
TEST(DtrainCommand, ABadPetVariableIsNamed) {
  RunOptions o;
  o.env = {"PET_NPROC_PER_NODE=abc"};
  RunResult r = Process::start({kDtrain, "run", "/bin/true"}, o).finish(10s);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--nproc-per-node: got 'abc'")) << r.err;
  EXPECT_TRUE(contains(r.err, "(the value came from the environment variable PET_NPROC_PER_NODE)"))
      << r.err;
}

TEST(DtrainCommand, AnUnknownCommandIsNamedWithTheCommandsThereAre) {
  RunResult r = Process::start({kDtrain, "frobnicate", "--nproc-per-node", "2"}).finish(10s);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "dtrain: error: unknown command 'frobnicate'; the commands are run, launch, "
                       "zero, horovodrun and deepspeed"))
      << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace dtrain::test
