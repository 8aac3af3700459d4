// The launcher against real clients nobody here wrote: an unchanged PyTorch DDP script under
// `dtrain run`, PyTorch's @record error files, and a dtrain C++ worker under PyTorch's own
// torchrun. The Python tests run with Debian's PyTorch 1.13 and the venv's PyTorch 2.x (each
// TCPStore client speaks its own protocol to the launcher's store); both are required
// components: without them these tests fail.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "launcher/subprocess.h"
#include "support/free_port.h"
#include "support/paths.h"

namespace {

using dtrain::test::run_command;
using dtrain::test::RunOptions;
using namespace std::chrono_literals;

const std::string kInterop = std::string(DTRAIN_SOURCE_DIR) + "/tests/interop";

void require_python_torch(const std::string& python) {
  auto r = run_command({python, "-c", "import torch, torch.distributed; print(torch.__version__)"},
                       {.timeout = 60s});
  ASSERT_EQ(r.exit_code, 0) << "PyTorch is required at " << python
                            << " (scripts/setup.sh installs python3-torch and the venv): " << r.err;
}

RunOptions python_env(const std::string& python) {
  return {.env = {"DTRAIN_PYTHON=" + python}, .timeout = 180s};
}

// Debian's python3 (PyTorch 1.13) and the venv's (PyTorch 2.x).
class PythonLauncherInterop : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Versions, PythonLauncherInterop,
                         ::testing::Values("/usr/bin/python3", DTRAIN_VENV_PYTHON),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "Debian_torch1" : "Venv_torch2");
                         });

// Lines "[defaultN]:{json}" -> json by rank.
std::map<int, nlohmann::json> json_lines(const std::string& out) {
  std::map<int, nlohmann::json> by_rank;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    auto brace = line.find("]:{");
    if (brace == std::string::npos) continue;
    auto j = nlohmann::json::parse(line.substr(brace + 2));
    by_rank[j.at("rank").get<int>()] = j;
  }
  return by_rank;
}

TEST_P(PythonLauncherInterop, UnchangedPytorchDdpScriptTrainsUnderDtrainRun) {
  require_python_torch(GetParam());
  auto r = run_command({DTRAIN_BIN, "run", "--nproc-per-node", "2", kInterop + "/ddp_train.py"},
                       python_env(GetParam()));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto ranks = json_lines(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  EXPECT_EQ(ranks[0]["world_size"], 2);
  EXPECT_EQ(ranks[1]["local_rank"], 1);
  // DDP averaged the gradients of different data: both replicas must hold equal parameters.
  EXPECT_EQ(ranks[0]["digest"], ranks[1]["digest"]);
}

TEST_P(PythonLauncherInterop, PythonModuleModeRunsTheSameScript) {
  require_python_torch(GetParam());
  auto opts = python_env(GetParam());
  opts.env.push_back("PYTHONPATH=" + kInterop);
  auto r = run_command({DTRAIN_BIN, "run", "--nproc_per_node", "2", "-m", "ddp_train"}, opts);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto ranks = json_lines(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  EXPECT_EQ(ranks[0]["digest"], ranks[1]["digest"]);
}

TEST_P(PythonLauncherInterop, RecordErrorFileOfAFailingPythonWorkerIsInTheSummary) {
  require_python_torch(GetParam());
  auto r = run_command({DTRAIN_BIN, "run", "--nproc-per-node", "2", kInterop + "/record_fail.py"},
                       python_env(GetParam()));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  auto summary = r.err.find("root cause");
  ASSERT_NE(summary, std::string::npos) << r.err;
  std::string s = r.err.substr(summary);
  EXPECT_NE(s.find("rank       : 1"), std::string::npos) << s;
  EXPECT_NE(s.find("error file :"), std::string::npos) << s;
  EXPECT_NE(s.find("ValueError: rank 1 failed on purpose"), std::string::npos) << s;
  // Rank 0 was sleeping for 30 s: the launcher stopped it instead of waiting.
  EXPECT_LT(r.elapsed, 25.0);
}

// Under the torchrun of the PyTorch whose libtorch this build links (Debian's 1.13, or the
// venv's 2.x): each version's TCPStore client speaks its own torchrun's protocol.
TEST(LauncherInterop, DtrainCppWorkerRunsUnderTorchrun) {
  ASSERT_EQ(::access(DTRAIN_NATIVE_TORCHRUN, X_OK), 0)
      << "torchrun of PyTorch " << DTRAIN_TORCH_VERSION << " is required at "
      << DTRAIN_NATIVE_TORCHRUN
      << " (scripts/setup.sh installs it: python3-torch for 1.13, the venv for 2.x)";
  // Debian's torchrun on Python 3.11 crashes with its default --redirects 0 (IntFlag change).
  auto r =
      run_command({DTRAIN_NATIVE_TORCHRUN, "--nproc_per_node", "2", "--redirects", "9:1", "--tee",
                   "9:1", "--monitor_interval", "0.1", "--no_python", HELLO_WORKER_BIN},
                  {.timeout = 180s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("hello from rank 0 of 2: all_reduce(rank + 1) = 3 (expected 3)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("hello from rank 1 of 2: all_reduce(rank + 1) = 3 (expected 3)"),
            std::string::npos)
      << r.out;
}

// The venv's torchrun (PyTorch 2.x), as `python -m torch.distributed.run`.
std::vector<std::string> venv_torchrun() {
  return {DTRAIN_VENV_PYTHON, "-m", "torch.distributed.run"};
}

// torchrun 2.x starts each worker in a session of its own (start_new_session); so does
// `dtrain run`. Checked on both launchers with the same script, so the claim is torchrun's.
TEST(LauncherInterop, EachWorkerLeadsItsOwnSessionAsUnderTorchrun) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  const std::string script = kInterop + "/session.py";
  auto torchrun = venv_torchrun();
  for (const char* a : {"--nproc-per-node", "2", "--tee", "3", "--monitor-interval", "0.1",
                        "--no-python", DTRAIN_VENV_PYTHON, script.c_str()}) {
    torchrun.push_back(a);
  }
  const std::vector<std::vector<std::string>> launchers = {
      torchrun,
      {DTRAIN_BIN, "run", "--nproc-per-node", "2", "--no-python", DTRAIN_VENV_PYTHON, script}};
  for (const auto& argv : launchers) {
    SCOPED_TRACE(argv[0] == DTRAIN_BIN ? "dtrain run" : "torchrun");
    auto r = run_command(argv, {.timeout = 120s});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto ranks = json_lines(r.out);
    ASSERT_EQ(ranks.size(), 2u) << r.out;
    for (const auto& [rank, j] : ranks) {
      EXPECT_EQ(j["sid"], j["pid"]) << "rank " << rank << " does not lead a session: " << j;
      EXPECT_EQ(j["pgid"], j["pid"]) << "rank " << rank << " does not lead its group: " << j;
      EXPECT_NE(j["sid"], j["parent_sid"]) << "rank " << rank << " is in the launcher's: " << j;
    }
  }
}

// Every file under `dir`, by its path below the run directory (<run id>_<random>, checked
// here), with its contents.
std::map<std::string, std::string> run_files(const std::string& dir, const std::string& run_id) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const auto rel = std::filesystem::relative(e.path(), dir);
    const std::string run_dir = rel.begin()->string();
    EXPECT_TRUE(std::regex_match(run_dir, std::regex(run_id + "_[a-z0-9_]{8}"))) << rel;
    std::ifstream in(e.path());
    files[std::filesystem::relative(rel, run_dir).string()] =
        std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

// --log-dir, --tee, --local-ranks-filter, --duplicate-stdout/stderr-filters and
// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, under the venv's torchrun and `dtrain run` with the
// same flags: the same files in the same layout with the same contents (per-rank logs,
// error.json's place, the attempt's filtered logs), and the same lines on the console.
TEST(LauncherInterop, LogDirAndFilteredLinesAsUnderTorchrun) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  const std::string script = kInterop + "/log_lines.py";
  const std::string base = std::filesystem::temp_directory_path() /
                           ("dtrain-interop-logs-" + std::to_string(::getpid()));
  struct RemoveBase {  // also when an ASSERT below ends the test
    std::string path;
    ~RemoveBase() { std::filesystem::remove_all(path); }
  } remove_base{base};
  std::map<std::string, std::map<std::string, std::string>> files;
  std::map<std::string, std::multiset<std::string>> console;
  for (const std::string launcher : {"torchrun", "dtrain"}) {
    SCOPED_TRACE(launcher);
    const std::string dir = base + "/" + launcher;
    std::vector<std::string> argv =
        launcher == "torchrun" ? venv_torchrun() : std::vector<std::string>{DTRAIN_BIN, "run"};
    for (const std::string a :
         {"--nproc-per-node", "2", "--monitor-interval", "0.1", "--rdzv-id", "job5", "--log-dir",
          dir.c_str(), "--tee", "3", "--local-ranks-filter", "1", "--duplicate-stdout-filters",
          "line 1,,x,line 3", "--duplicate-stderr-filters", "err 1", "--no-python",
          DTRAIN_VENV_PYTHON, script.c_str()})
      argv.push_back(a);
    auto r = run_command(argv, {.env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=<${role_name}|"
                                        "${rank}|${local_rank}>"},
                                .timeout = 120s});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    files[launcher] = run_files(dir, "job5");
    std::istringstream out(r.out + r.err);
    for (std::string line; std::getline(out, line);)
      if (line.rfind("<default|", 0) == 0) console[launcher].insert(line);
  }
  EXPECT_EQ(files["dtrain"], files["torchrun"]);
  EXPECT_EQ(console["dtrain"], console["torchrun"]);
  // What the comparison covered: rank 1's 8 lines on the console, the 4 per-rank logs and the
  // 2 filtered ones ("line 1,,x,line 3" is the filters "line 1,x" and "line 3").
  EXPECT_EQ(console["torchrun"].size(), 8u);
  EXPECT_EQ(files["torchrun"]["attempt_0/filtered_stdout.log"], "<default|1|1>out 1 line 3\n");
  EXPECT_EQ(files["torchrun"].size(), 6u);
}

// Which streams get files: torchrun 2.11 writes LOCAL_RANK/stdout.log (stderr.log) only for a
// stream --redirects or --tee names, and --log-dir alone writes none; the duplicate filters
// copy only the teed streams of the ranks --local-ranks-filter shows; a teed stream reaches
// the console even when it is also redirected. One launch per launcher covers the cases, one
// local rank each (listed above `flags`). The console is compared line by line per stream with
// the prefixes dropped: torchrun prefixes only teed lines (it tails them from their files),
// dtrain every line.
TEST(LauncherInterop, LogDirWritesOnlyRedirectedAndTeedStreamsAsUnderTorchrun) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  const std::string script = kInterop + "/log_lines.py";
  const std::string base = std::filesystem::temp_directory_path() /
                           ("dtrain-interop-streams-" + std::to_string(::getpid()));
  struct RemoveBase {  // also when an ASSERT below ends the test
    std::string path;
    ~RemoveBase() { std::filesystem::remove_all(path); }
  } remove_base{base};
  // Local rank 0: both streams redirected (files only); 1: stdout redirected, stderr teed
  // (a file, and the console); 2: stdout teed and redirected (the console still gets it),
  // 3: nothing named (console only, no file); 4: stdout teed, but not shown by the filter
  // (a file only, and no filtered copy).
  // torchrun fails where its default port 29500 is taken (by another test's store).
  const std::string port = std::to_string(dtrain::test::free_port());
  const std::vector<std::string> flags = {"--master-port",
                                          port,
                                          "--nproc-per-node",
                                          "5",
                                          "--monitor-interval",
                                          "0.1",
                                          "--rdzv-id",
                                          "job6",
                                          "--redirects",
                                          "0:3,1:1,2:1",
                                          "--tee",
                                          "1:2,2:1,4:1",
                                          "--local-ranks-filter",
                                          "0,1,2,3",
                                          "--duplicate-stdout-filters",
                                          "line 1",
                                          "--duplicate-stderr-filters",
                                          "line 2"};
  std::map<std::string, std::map<std::string, std::string>> files;
  std::map<std::string, std::multiset<std::string>> out, err;
  for (const std::string launcher : {"torchrun", "dtrain"}) {
    SCOPED_TRACE(launcher);
    const std::string dir = base + "/" + launcher;
    std::vector<std::string> argv =
        launcher == "torchrun" ? venv_torchrun() : std::vector<std::string>{DTRAIN_BIN, "run"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    for (const std::string& a : {std::string("--log-dir"), dir, std::string("--no-python"),
                                 std::string(DTRAIN_VENV_PYTHON), script})
      argv.push_back(a);
    auto r = run_command(
        argv, {.env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=<${rank}>"}, .timeout = 120s});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    files[launcher] = run_files(dir, "job6");
    const std::regex line("^(<[0-9]>)?((out|err) [0-9] line [0-9])$");
    for (auto [text, lines] : {std::pair{&r.out, &out[launcher]}, {&r.err, &err[launcher]}}) {
      std::istringstream in(*text);
      std::smatch m;
      for (std::string l; std::getline(in, l);)
        if (std::regex_match(l, m, line)) lines->insert(m[2]);
    }
  }
  EXPECT_EQ(files["dtrain"], files["torchrun"]);
  EXPECT_EQ(out["dtrain"], out["torchrun"]);
  EXPECT_EQ(err["dtrain"], err["torchrun"]);
  // What the comparison covered (8 files): rank 0's two files, rank 1's stdout and stderr, rank 2's
  // stdout, rank 4's stdout, the filtered logs (rank 2's teed "line 1" and rank 1's teed
  // "line 2"); on the console rank 1's stderr, rank 2's both, rank 3's both.
  EXPECT_EQ(files["torchrun"].size(), 8u);
  EXPECT_EQ(files["torchrun"]["attempt_0/filtered_stdout.log"], "<2>out 2 line 1\n");
  EXPECT_EQ(files["torchrun"]["attempt_0/filtered_stderr.log"], "<1>err 1 line 2\n");
  EXPECT_EQ(files["torchrun"].count("attempt_0/3/stdout.log"), 0u);
  EXPECT_EQ(out["torchrun"].size(), 8u);
  EXPECT_EQ(err["torchrun"].size(), 12u);
}

// The worker environment is torchrun's: under the venv's torchrun and `dtrain run` with the
// same flags, every variable torchrun adds to what the launcher was given is there with the
// same value (the port and the error file's path aside, which are each launcher's own; with
// --standalone also the run id, a fresh uuid4 on both, and MASTER_ADDR, which torchrun gives
// as "localhost" and `dtrain run` as 127.0.0.1), and `dtrain run` adds nothing else but its own
// DTRAIN_* and JE_ARROW_MALLOC_CONF (a jemalloc setting for the fork server, launcher.md).
TEST(LauncherInterop, WorkerEnvironmentIsAsUnderTorchrun) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  const std::string script = kInterop + "/worker_env.py";
  const std::string python_var = "DTRAIN_PYTHON=" + std::string(DTRAIN_VENV_PYTHON);
  std::map<std::string, std::string> given;  // the launchers' own environment
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    given[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  given["DTRAIN_PYTHON"] = DTRAIN_VENV_PYTHON;
  auto added_by_rank = [&](const std::string& out) {
    std::map<int, std::map<std::string, std::string>> by_rank;
    for (const auto& [rank, j] : json_lines(out)) {
      for (const auto& [k, v] : j.at("env").items()) {
        const auto it = given.find(k);
        if (it == given.end() || it->second != v.get<std::string>())
          by_rank[rank][k] = v.get<std::string>();
      }
    }
    return by_rank;
  };
  const std::vector<std::vector<std::string>> flag_sets = {
      {},
      {"--max-restarts", "2", "--role", "trainer", "--rdzv-id", "job7", "--signals-to-handle",
       "SIGTERM,SIGUSR1"},
      {"--standalone"},
      {"--virtual-local-rank"}};  // LOCAL_RANK 0, CUDA_VISIBLE_DEVICES the local rank
  const std::regex uuid4("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  for (const auto& flags : flag_sets) {
    const bool standalone = !flags.empty() && flags[0] == "--standalone";
    SCOPED_TRACE(flags.empty() ? "no flags" : flags[0]);
    std::vector<std::string> torchrun = venv_torchrun(), dtrain = {DTRAIN_BIN, "run"};
    for (auto* argv : {&torchrun, &dtrain}) {
      for (const char* a : {"--nproc-per-node", "2", "--monitor-interval", "0.1"})
        argv->push_back(a);
      argv->insert(argv->end(), flags.begin(), flags.end());
    }
    for (const char* a : {"--tee", "3", script.c_str()}) torchrun.push_back(a);
    dtrain.push_back(script);
    auto t = run_command(torchrun, {.env = {python_var}, .timeout = 120s});
    ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
    auto d = run_command(dtrain, {.env = {python_var}, .timeout = 120s});
    ASSERT_EQ(d.exit_code, 0) << d.out << d.err;
    const auto theirs = added_by_rank(t.out), ours = added_by_rank(d.out);
    ASSERT_EQ(theirs.size(), 2u) << t.out;
    ASSERT_EQ(ours.size(), 2u) << d.out;
    for (int rank = 0; rank < 2; ++rank) {
      const auto& want = theirs.at(rank);
      const auto& got = ours.at(rank);
      EXPECT_GE(want.size(), 16u) << "torchrun's environment looks incomplete: " << t.out;
      for (const auto& [k, v] : want) {
        const auto it = got.find(k);
        if (it == got.end()) {
          ADD_FAILURE() << "rank " << rank << ": torchrun gives " << k << "=" << v
                        << ", `dtrain run` does not";
        } else if (k == "TORCHELASTIC_ERROR_FILE" || (standalone && k == "MASTER_PORT")) {
          EXPECT_FALSE(it->second.empty()) << k;
        } else if (standalone && k == "TORCHELASTIC_RUN_ID") {
          EXPECT_TRUE(std::regex_match(v, uuid4)) << "torchrun's: " << v;
          EXPECT_TRUE(std::regex_match(it->second, uuid4)) << "dtrain's: " << it->second;
          EXPECT_EQ(it->second, ours.at(0).at(k)) << "rank " << rank << "'s run id";
        } else {
          EXPECT_EQ(it->second, v) << "rank " << rank << ": " << k;
        }
      }
      for (const auto& [k, v] : got) {
        if (want.count(k) || k.starts_with("DTRAIN_") || k == "JE_ARROW_MALLOC_CONF") continue;
        ADD_FAILURE() << "rank " << rank << ": `dtrain run` gives " << k << "=" << v
                      << ", torchrun does not";
      }
    }
  }
}

// Lines "[default<local rank>]:arg=VALUE" (tests/interop/worker_args.py, test_worker's
// --print-args) -> the values by local rank, in order.
std::map<int, std::vector<std::string>> args_by_rank(const std::string& out) {
  std::map<int, std::vector<std::string>> seen;
  std::istringstream in(out);
  static const std::regex arg_line(R"(^\[default(\d+)\]:arg=(.*)$)");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, arg_line)) seen[std::stoi(m[1])].push_back(m[2]);
  }
  return seen;
}

// Runs PyTorch's launcher `theirs_cmd` and dtrain's `ours_cmd` (2 workers each, printing their
// arguments); both must succeed and give each worker the same arguments, which go to `theirs`.
void expect_same_args(const std::vector<std::string>& theirs_cmd,
                      const std::vector<std::string>& ours_cmd, const RunOptions& opts,
                      std::map<int, std::vector<std::string>>& theirs) {
  auto t = run_command(theirs_cmd, opts);
  ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
  auto d = run_command(ours_cmd, opts);
  ASSERT_EQ(d.exit_code, 0) << d.out << d.err;
  theirs = args_by_rank(t.out);
  ASSERT_EQ(theirs.size(), 2u) << t.out;
  EXPECT_EQ(args_by_rank(d.out), theirs) << d.out;
}

// torchrun's ${local_rank} macro (torch.distributed.elastic.utils.macros): each worker's
// arguments after the executable go through string.Template.safe_substitute(local_rank=...),
// so `${local_rank}` and `$local_rank` are its local rank, `$$` is `$`, and anything else stays.
// The same arguments under the venv's torchrun and `dtrain run`, for a Python worker and a C++
// one (spawned, and forked from a fork server, whose workers get their own arguments), with
// and without --virtual-local-rank (LOCAL_RANK 0, the macro still the node's local rank).
TEST(LauncherInterop, TheLocalRankMacroInArgumentsIsAsUnderTorchrun) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  const std::vector<std::string> args = {"x${local_rank}",
                                         "a$$b",
                                         "$local_rank",
                                         "${rank}",
                                         "$",
                                         "${local_rank",
                                         "q$",
                                         "$LOCAL_RANK",
                                         "$$local_rank",
                                         "$1",
                                         "${local_rank}${local_rank}",
                                         "--out=log_${local_rank}.txt",
                                         "\xc3\xa9$local_rank\xc3\xbc",
                                         "${ local_rank}",
                                         "$local_rank_x"};
  const std::string python_script = kInterop + "/worker_args.py";
  for (const std::string worker : {"python", "c++ spawn", "c++ forkserver"}) {
    for (const bool virtual_local_rank : {false, true}) {
      SCOPED_TRACE(worker + (virtual_local_rank ? ", --virtual-local-rank" : ""));
      std::vector<std::string> torchrun = venv_torchrun(), dtrain = {DTRAIN_BIN, "run"};
      for (auto* argv : {&torchrun, &dtrain}) {
        // torchrun fails where its default port 29500 is taken (by another test's store).
        const std::string port = std::to_string(dtrain::test::free_port());
        for (const std::string a :
             {"--master-port", port.c_str(), "--nproc-per-node", "2", "--monitor-interval", "0.1"})
          argv->push_back(a);
        if (virtual_local_rank) argv->push_back("--virtual-local-rank");
      }
      torchrun.insert(torchrun.end(), {"--tee", "3"});
      if (worker != "python") {
        dtrain.insert(dtrain.end(),
                      {"--start-method", worker == "c++ spawn" ? "spawn" : "forkserver"});
        for (auto* argv : {&torchrun, &dtrain})
          argv->insert(argv->end(), {"--no-python", TEST_WORKER_BIN, "--print-args"});
      } else {
        for (auto* argv : {&torchrun, &dtrain}) argv->push_back(python_script);
      }
      for (auto* argv : {&torchrun, &dtrain}) argv->insert(argv->end(), args.begin(), args.end());
      const RunOptions opts{.env = {"DTRAIN_PYTHON=" + std::string(DTRAIN_VENV_PYTHON),
                                    "PYTHON_EXEC=" + std::string(DTRAIN_VENV_PYTHON)},
                            .timeout = 120s};
      std::map<int, std::vector<std::string>> theirs;
      ASSERT_NO_FATAL_FAILURE(expect_same_args(torchrun, dtrain, opts, theirs));
      // What the comparison covered: torchrun substituted (rank 1's first argument is "x1")
      // and left `${rank}` alone.
      ASSERT_EQ(theirs.at(1).size(), args.size());
      EXPECT_EQ(theirs.at(1)[0], "x1");
      EXPECT_EQ(theirs.at(1)[1], "a$b");
      EXPECT_EQ(theirs.at(1)[3], "${rank}");
    }
  }
}

// `dtrain launch` against `python -m torch.distributed.launch` (the venv's): without --use-env
// each worker gets --local-rank=N before its arguments (and LOCAL_RANK, as with it), a module
// too; --no-python without --use-env is refused by both.
TEST(LauncherInterop, LaunchIsAsTorchDistributedLaunch) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  const std::string script = kInterop + "/worker_args.py";
  const RunOptions opts{
      .env = {"DTRAIN_PYTHON=" + std::string(DTRAIN_VENV_PYTHON), "PYTHONPATH=" + kInterop},
      .timeout = 120s};
  const std::vector<std::vector<std::string>> cases = {{script, "a", "--lr=1"},
                                                       {"--use-env", script, "a"},
                                                       {"--use_env", "-m", "worker_args", "b"},
                                                       {"-m", "worker_args", "--", "c"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const std::string port = std::to_string(dtrain::test::free_port());
    std::vector<std::string> torch = {DTRAIN_VENV_PYTHON, "-m", "torch.distributed.launch"},
                             dtrain = {DTRAIN_BIN, "launch"};
    for (auto* argv : {&torch, &dtrain}) {
      argv->insert(argv->end(),
                   {"--master-port", port, "--nproc-per-node", "2", "--monitor-interval", "0.1"});
    }
    torch.insert(torch.end(), {"--tee", "3"});
    for (auto* argv : {&torch, &dtrain}) argv->insert(argv->end(), c.begin(), c.end());
    std::map<int, std::vector<std::string>> theirs;
    ASSERT_NO_FATAL_FAILURE(expect_same_args(torch, dtrain, opts, theirs));
    const bool use_env = c[0].starts_with("--use");
    EXPECT_EQ(theirs.at(1).at(0) == "--local-rank=1", !use_env) << "what was compared";
  }
  for (auto argv : {std::vector<std::string>{DTRAIN_VENV_PYTHON, "-m", "torch.distributed.launch"},
                    std::vector<std::string>{DTRAIN_BIN, "launch"}}) {
    argv.insert(argv.end(), {"--no-python", "/bin/true"});
    auto r = run_command(argv, opts);
    EXPECT_NE(r.exit_code, 0) << argv[0];
    EXPECT_NE(r.err.find("When using the '--no-python' flag, you must also set the '--use-env' "
                         "flag."),
              std::string::npos)
        << r.err;
  }
}

// The launcher's own TORCHELASTIC_ERROR_FILE (a scheduler's): torchrun's @record main copies
// the root cause's error.json there with its errorCode; so does `dtrain run`. With --log-dir
// alone both leave the same files there: the failed rank's error.json, no stdout.log or
// stderr.log (no stream is redirected or teed).
TEST(LauncherInterop, TheLaunchersErrorFileIsAsUnderTorchrun) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  const std::string dir =
      ::testing::TempDir() + "launcher-error-file-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::map<std::string, std::set<std::string>> logs;  // the files under --log-dir
  auto error_file_of = [&](std::vector<std::string> launcher, const std::string& name) {
    const std::string path = dir + "/" + name + ".json";
    for (const char* a : {"--nproc-per-node", "2", "--monitor-interval", "0.1"})
      launcher.push_back(a);
    launcher.insert(launcher.end(), {"--log-dir", dir + "/" + name + "-logs"});
    launcher.push_back(kInterop + "/record_fail.py");
    auto r = run_command(launcher, {.env = {"DTRAIN_PYTHON=" + std::string(DTRAIN_VENV_PYTHON),
                                            "TORCHELASTIC_ERROR_FILE=" + path},
                                    .timeout = 120s});
    EXPECT_NE(r.exit_code, 0) << r.err;
    for (const auto& [file, text] : run_files(dir + "/" + name + "-logs", "none"))
      logs[name].insert(file);
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << name << " wrote no " << path << "\n" << r.err;
    return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
  };
  const auto theirs = error_file_of(venv_torchrun(), "torchrun");
  const auto ours = error_file_of({DTRAIN_BIN, "run"}, "dtrain");
  EXPECT_EQ(logs["torchrun"], std::set<std::string>{"attempt_0/1/error.json"});
  EXPECT_EQ(logs["dtrain"], logs["torchrun"]);
  ASSERT_TRUE(theirs.contains("message")) << theirs.dump();
  ASSERT_TRUE(ours.contains("message")) << ours.dump();
  EXPECT_EQ(ours["message"]["message"], theirs["message"]["message"]);
  EXPECT_EQ(ours["message"]["errorCode"], theirs["message"]["errorCode"]);
  EXPECT_EQ(ours["message"]["extraInfo"].size(), theirs["message"]["extraInfo"].size());
  std::filesystem::remove_all(dir);
}

// torchrun 2.11 exits 1 whenever the job fails (its ChildFailedError, and the SignalException a
// SIGTERM raises in it); `dtrain run` keeps the code that says what happened: the worker's, 128+N
// for a worker killed by signal N, 128+N for the launcher's own signal. docs/launcher.md ("Exit
// code") lists the same cases; each runs under both launchers here, one worker each.
TEST(LauncherInterop, ExitCodesBesideTorchrunsAsDocumented) {
  const std::string code =
      "import os, signal, sys, time\n"
      "if sys.argv[1] == 'exit3': sys.exit(3)\n"
      "if sys.argv[1] == 'sigkill': os.kill(os.getpid(), signal.SIGKILL)\n"
      "print('ready', flush=True)\n"
      "time.sleep(60)\n";
  struct Case {
    std::string mode;
    int torchrun, dtrain;
  };
  for (const auto& c : {Case{"exit3", 1, 3}, Case{"sigkill", 1, 128 + SIGKILL},
                        Case{"sigterm", 1, 128 + SIGTERM}}) {
    for (const std::string launcher : {"torchrun", "dtrain"}) {
      SCOPED_TRACE(launcher + ", " + c.mode);
      std::vector<std::string> argv =
          launcher == "torchrun" ? venv_torchrun() : std::vector<std::string>{DTRAIN_BIN, "run"};
      for (const std::string& a :
           {std::string("--nproc-per-node"), std::string("1"), std::string("--monitor-interval"),
            std::string("0.1"), std::string("--master-port"),
            std::to_string(dtrain::test::free_port()), std::string("--no-python"),
            std::string(DTRAIN_VENV_PYTHON), std::string("-c"), code, c.mode})
        argv.push_back(a);
      auto p = dtrain::test::Process::start(argv, {.timeout = 120s});
      if (c.mode == "sigterm") {
        // The launcher's SIGTERM once its worker runs (said "ready").
        ASSERT_TRUE(
            p.wait_for([](const std::string& out,
                          const std::string&) { return out.find("ready") != std::string::npos; },
                       120s))
            << p.out() << p.err();
        p.signal(SIGTERM);
      }
      const auto r = p.finish(120s);
      EXPECT_EQ(r.exit_code, launcher == "torchrun" ? c.torchrun : c.dtrain) << r.err;
    }
  }
}

// When the launcher itself fails (here: a rendezvous no second node joins), torchrun's @record
// main writes the exception to the launcher's TORCHELASTIC_ERROR_FILE; so does `dtrain run`,
// in the same shape (the message names each launcher's own error).
TEST(LauncherInterop, TheLaunchersOwnFailureIsInItsErrorFileAsUnderTorchrun) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  const std::string dir = ::testing::TempDir() + "launcher-own-error-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto error_file_of = [&](std::vector<std::string> launcher, const std::string& name) {
    const std::string path = dir + "/" + name + ".json";
    const std::string endpoint = "127.0.0.1:" + std::to_string(dtrain::test::free_port());
    for (const std::string& a :
         {std::string("--nnodes"), std::string("2"), std::string("--rdzv-backend"),
          std::string("c10d"), std::string("--rdzv-endpoint"), endpoint, std::string("--rdzv-conf"),
          std::string("join_timeout=3"), std::string("--rdzv-id"), std::string("own-error"),
          kInterop + "/record_fail.py"})
      launcher.push_back(a);
    auto r = run_command(launcher, {.env = {"DTRAIN_PYTHON=" + std::string(DTRAIN_VENV_PYTHON),
                                            "TORCHELASTIC_ERROR_FILE=" + path},
                                    .timeout = 120s});
    EXPECT_NE(r.exit_code, 0) << name << ": " << r.err;
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << name << " wrote no " << path << "\n" << r.err;
    return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
  };
  const auto theirs = error_file_of(venv_torchrun(), "torchrun");
  const auto ours = error_file_of({DTRAIN_BIN, "run"}, "dtrain");
  for (const auto* j : {&theirs, &ours}) {
    ASSERT_TRUE(j->contains("message") && (*j)["message"].is_object()) << j->dump();
    const auto& m = (*j)["message"];
    EXPECT_TRUE(m["message"].is_string() && !m["message"].get<std::string>().empty()) << j->dump();
    ASSERT_TRUE(m.contains("extraInfo")) << j->dump();
    EXPECT_TRUE(m["extraInfo"]["py_callstack"].is_string()) << j->dump();
    const auto stamp = m["extraInfo"].value("timestamp", std::string());
    EXPECT_TRUE(!stamp.empty() && stamp.find_first_not_of("0123456789") == std::string::npos)
        << j->dump();
  }
  std::vector<std::string> their_keys, our_keys;
  for (const auto& [k, v] : theirs["message"].items()) their_keys.push_back(k);
  for (const auto& [k, v] : ours["message"].items()) our_keys.push_back(k);
  EXPECT_EQ(our_keys, their_keys);
  EXPECT_NE(ours["message"]["message"].get<std::string>().find("rendezvous"), std::string::npos)
      << ours.dump();
  std::filesystem::remove_all(dir);
}

// PyTorch 2.x's env:// rendezvous no longer namespaces its keys by attempt
// (pytorch/pytorch#135712, #167288), so under a launcher that keeps one store for the job a
// restarted Gloo group may read the previous attempt's addresses: "Connection refused", or a
// hang in connectFullMesh. torchrun 2.11 has that bug; `dtrain run` clears the workers' keys
// between attempts (src/launch/worker_keys.h), so every restart must connect: 20 in a row, an
// unchanged script, rank 0 exiting 1 in each attempt but the last. Each attempt's Gloo init
// has 60 s, so a regression fails instead of hanging.
TEST(LauncherInterop, Pytorch2WorkersRestartTwentyTimesInARow) {
  require_python_torch(DTRAIN_VENV_PYTHON);
  constexpr int kRestarts = 20;
  auto r = run_command(
      {DTRAIN_BIN, "run", "--nproc-per-node", "2", "--max-restarts", std::to_string(kRestarts),
       "--monitor-interval", "0.1", kInterop + "/restart_gloo.py", std::to_string(kRestarts), "60"},
      {.env = {"DTRAIN_PYTHON=" + std::string(DTRAIN_VENV_PYTHON)}, .timeout = 600s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int attempt = 0; attempt <= kRestarts; ++attempt) {
    for (int rank = 0; rank < 2; ++rank) {
      const std::string line = "]:attempt " + std::to_string(attempt) + " rank " +
                               std::to_string(rank) + " all_reduce 3.0";
      EXPECT_NE(r.out.find(line), std::string::npos) << "missing: " << line << "\n" << r.out;
    }
  }
}

TEST(LauncherInterop, DtrainCppWorkerRunsUnderDtrainRun) {
  auto r = run_command({DTRAIN_BIN, "run", "--nproc-per-node", "3", HELLO_WORKER_BIN},
                       {.timeout = 180s});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[default" + std::to_string(rank) + "]:hello from rank " +
                       std::to_string(rank) + " of 3: all_reduce(rank + 1) = 6 (expected 6)";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

}  // namespace
