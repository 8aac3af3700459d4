// The launcher's in-process pieces: `dtrain run` flag parsing and validation
// (parse_run_args, validate_launch_options), the output fan-in (launch::OutputStream) and the
// rank layout and rendezvous (launch/rendezvous.h). The end-to-end behaviour through real
// processes is in tests/launcher/launcher_test.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "dtrain/store.h"
#include "launch/deepspeed_cli.h"
#include "launch/fork_server.h"
#include "launch/gpus.h"
#include "launch/options_internal.h"
#include "launch/output.h"
#include "launch/rendezvous.h"
#include "launch/string_template.h"
#include "support/paths.h"
#include "support/scoped_env.h"

namespace dtrain {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string>;

// parse_run_args with a program appended, so each test only spells the flags it is about.
LaunchOptions parse(Args flags) {
  flags.push_back("prog");
  return parse_run_args(flags);
}

// The UsageError message of parsing (and, if that passes, validating) `args`; fails the
// test when nothing throws.
std::string usage_error(const Args& args) {
  try {
    LaunchOptions o = parse_run_args(args);
    validate_launch_options(o);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError for: " << ::testing::PrintToString(args);
  return "";
}

unsigned cpu_count() { return std::max(1u, std::thread::hardware_concurrency()); }

// Python for the venv's torchrun 2.11: verdict(argv) is what its main makes of `argv` before it
// starts a worker (its parser, config_from_args, the rendezvous handler, the event log handler,
// with logs_specs its logs-specs class): "ok", or "error WHAT" where it stops.
constexpr const char* kTorchrunVerdict =
    "import contextlib, io\n"
    "from torch.distributed.run import parse_args, config_from_args, _get_logs_specs_class\n"
    "from torch.distributed.elastic.rendezvous import RendezvousParameters, registry\n"
    "from torch.distributed.elastic.events.handlers import get_logging_handler\n"
    "def verdict(argv, logs_specs=False):\n"
    "    err = io.StringIO()\n"
    "    try:\n"
    "        with contextlib.redirect_stderr(err):\n"
    "            args = parse_args(argv + ['--no-python', 'true'])\n"
    "        c, _, _ = config_from_args(args)\n"
    "        registry.get_rendezvous_handler(RendezvousParameters(\n"
    "            backend=c.rdzv_backend, endpoint=c.rdzv_endpoint, run_id=c.run_id,\n"
    "            min_nodes=c.min_nodes, max_nodes=c.max_nodes, local_addr=c.local_addr,\n"
    "            **c.rdzv_configs))\n"
    "        get_logging_handler(c.event_log_handler)\n"
    "        if logs_specs:\n"
    "            _get_logs_specs_class(args.logs_specs)\n"
    "        return 'ok'\n"
    "    except SystemExit:\n"
    "        return 'error ' + err.getvalue().strip().splitlines()[-1]\n"
    "    except Exception as e:\n"
    "        return 'error %s %s' % (type(e).__name__, str(e).replace('\\n', ' '))\n";

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "launch_options_test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name, mode_t mode, const std::string& content = "") const {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << content;
    ::chmod(p.c_str(), mode);
    return p;
  }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------
// parse_run_args: defaults and flags

TEST(ParseRunArgs, DefaultsMatchTorchrun) {
  LaunchOptions o = parse({});
  EXPECT_EQ(o.program, "prog");
  EXPECT_TRUE(o.args.empty());
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, -1);  // resolved by validate_launch_options
  EXPECT_EQ(o.rdzv_backend, "static");
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, -1);
  EXPECT_EQ(o.rdzv_id, "none");
  EXPECT_EQ(o.rdzv_timeout, 900s);
  EXPECT_FALSE(o.standalone);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.monitor_interval, 100ms);
  EXPECT_EQ(o.term_timeout, 5s);
  EXPECT_EQ(o.role, "default");
  EXPECT_EQ(o.log_dir, "");
  EXPECT_EQ(o.redirects, (std::map<int, int>{{-1, 0}}));
  EXPECT_EQ(o.tee, (std::map<int, int>{{-1, 0}}));
  EXPECT_TRUE(o.extra_env.empty());
  EXPECT_FALSE(o.module);
  EXPECT_FALSE(o.no_python);
  EXPECT_EQ(o.stderr_tail_lines, 20);
  EXPECT_EQ(o.start_method, "auto");
}

// One flag, its two spellings, a value, and what it must set.
struct FlagCase {
  std::string dashed;
  std::string underscored;          // empty: the flag has one spelling
  std::vector<std::string> values;  // empty for boolean flags
  std::function<void(const LaunchOptions&)> check;
};

std::vector<FlagCase> flag_cases() {
  return {
      {"--nproc-per-node",
       "--nproc_per_node",
       {"3"},
       [](auto& o) { EXPECT_EQ(o.nproc_per_node, 3); }},
      {"--nnodes", "", {"2"}, [](auto& o) { EXPECT_EQ(o.nnodes, 2); }},
      {"--node-rank", "--node_rank", {"1"}, [](auto& o) { EXPECT_EQ(o.node_rank, 1); }},
      {"--master-addr",
       "--master_addr",
       {"10.1.2.3"},
       [](auto& o) { EXPECT_EQ(o.master_addr, "10.1.2.3"); }},
      {"--master-port",
       "--master_port",
       {"29555"},
       [](auto& o) { EXPECT_EQ(o.master_port, 29555); }},
      {"--rdzv-endpoint",
       "--rdzv_endpoint",
       {"node7:1234"},
       [](auto& o) {
         EXPECT_EQ(o.master_addr, "node7");
         EXPECT_EQ(o.master_port, 1234);
       }},
      {"--rdzv-backend",
       "--rdzv_backend",
       {"c10d"},
       [](auto& o) { EXPECT_EQ(o.rdzv_backend, "c10d"); }},
      {"--rdzv-id", "--rdzv_id", {"job42"}, [](auto& o) { EXPECT_EQ(o.rdzv_id, "job42"); }},
      {"--rdzv-timeout",
       "--rdzv_timeout",
       {"2.5"},
       [](auto& o) { EXPECT_EQ(o.rdzv_timeout, 2500ms); }},
      {"--rdzv-conf",
       "--rdzv_conf",
       {"join_timeout=7,read_timeout=60"},
       [](auto& o) { EXPECT_EQ(o.rdzv_timeout, 7s); }},
      {"--max-restarts", "--max_restarts", {"4"}, [](auto& o) { EXPECT_EQ(o.max_restarts, 4); }},
      {"--monitor-interval",
       "--monitor_interval",
       {"0.25"},
       [](auto& o) { EXPECT_EQ(o.monitor_interval, 250ms); }},
      {"--term-timeout",
       "--term_timeout",
       {"0.5"},
       [](auto& o) { EXPECT_EQ(o.term_timeout, 500ms); }},
      {"--log-dir", "--log_dir", {"/tmp/logs"}, [](auto& o) { EXPECT_EQ(o.log_dir, "/tmp/logs"); }},
      {"--redirects",
       "-r",
       {"3"},
       [](auto& o) {
         EXPECT_EQ(o.redirects, (std::map<int, int>{{-1, 3}}));
       }},
      {"--tee",
       "-t",
       {"2"},
       [](auto& o) {
         EXPECT_EQ(o.tee, (std::map<int, int>{{-1, 2}}));
       }},
      {"--role", "", {"trainer"}, [](auto& o) { EXPECT_EQ(o.role, "trainer"); }},
      {"--env", "", {"A=1"}, [](auto& o) { EXPECT_EQ(o.extra_env.at("A"), "1"); }},
      {"--no-python", "--no_python", {}, [](auto& o) { EXPECT_TRUE(o.no_python); }},
      {"--module", "-m", {}, [](auto& o) { EXPECT_TRUE(o.module); }},
      {"--standalone", "", {}, [](auto& o) { EXPECT_TRUE(o.standalone); }},
      // torchrun's "fork" is the fork server here.
      {"--start-method",
       "--start_method",
       {"fork"},
       [](auto& o) { EXPECT_EQ(o.start_method, "forkserver"); }},
      {"--start-method", "", {"spawn"}, [](auto& o) { EXPECT_EQ(o.start_method, "spawn"); }},
      {"--failure-store",
       "--failure_store",
       {"10.0.0.1:4000//distributor/x/failure"},
       [](auto& o) {
         EXPECT_EQ(o.failure_store_host, "10.0.0.1");
         EXPECT_EQ(o.failure_store_port, 4000);
         EXPECT_EQ(o.failure_store_key, "/distributor/x/failure");
       }},
      {"--start-method",
       "",
       {"forkserver"},
       [](auto& o) { EXPECT_EQ(o.start_method, "forkserver"); }},
      // A flag, as in torchrun 2.x: PROGRAM is a Python file whatever its name.
      {"--run-path",
       "--run_path",
       {},
       [](auto& o) {
         EXPECT_TRUE(o.run_path);
         EXPECT_EQ(o.program, "prog");
       }},
      {"--local-ranks-filter",
       "--local_ranks_filter",
       {"0,2"},
       [](auto& o) {
         EXPECT_EQ(o.local_ranks_filter, (std::set<int>{0, 2}));
         EXPECT_TRUE(o.redirects.at(-1) == 0);  // the others' streams still reach their files
       }},
      {"--numa-binding",
       "--numa_binding",
       {"socket"},
       [](auto& o) {
         ASSERT_EQ(o.notes.size(), 1u);
         EXPECT_NE(o.notes[0].find("--numa-binding socket"), std::string::npos);
       }},
      {"--signals-to-handle",
       "--signals_to_handle",
       {"SIGTERM,SIGUSR1"},
       [](auto& o) { EXPECT_EQ(o.notes.size(), 1u); }},
      {"--virtual-local-rank",
       "--virtual_local_rank",
       {},
       [](auto& o) {
         EXPECT_TRUE(o.virtual_local_rank);
         EXPECT_TRUE(o.notes.empty());
       }},
      {"--event-log-handler",
       "--event_log_handler",
       {"console"},
       [](auto& o) { EXPECT_EQ(o.notes.size(), 1u); }},
      {"--local-addr",
       "--local_addr",
       {"10.0.0.5"},
       [](auto& o) { EXPECT_EQ(o.notes.size(), 1u); }},
      {"--logs-specs",
       "--logs_specs",
       {"my_specs"},
       [](auto& o) { EXPECT_EQ(o.notes.size(), 1u); }},
      {"--duplicate-stdout-filters",
       "--duplicate_stdout_filters",
       {"loss,,x,acc"},
       [](auto& o) {
         EXPECT_EQ(o.duplicate_stdout_filters, (std::vector<std::string>{"loss,x", "acc"}));
         EXPECT_TRUE(o.notes.empty());
       }},
      {"--duplicate-stderr-filters",
       "--duplicate_stderr_filters",
       {"error"},
       [](auto& o) { EXPECT_EQ(o.duplicate_stderr_filters, (std::vector<std::string>{"error"})); }},
  };
}

TEST(ParseRunArgs, EveryFlagInBothSpellingsAndWithEquals) {
  for (const auto& c : flag_cases()) {
    for (const auto& name : {c.dashed, c.underscored}) {
      if (name.empty()) continue;
      SCOPED_TRACE(name);
      Args separate{name};
      separate.insert(separate.end(), c.values.begin(), c.values.end());
      c.check(parse(separate));
      // --flag=value is the other form scripts use (long names only; -r=3 is not a form).
      if (!c.values.empty() && name.rfind("--", 0) == 0) {
        SCOPED_TRACE("with =");
        c.check(parse({name + "=" + c.values[0]}));
      }
    }
  }
}

// `dtrain run --help` says "(accepted, noted" of a torchrun flag that dtrain takes without
// acting on it; such a flag prints that note when given. --virtual-local-rank's help said so
// after the flag was implemented (it prints no note: it does what torchrun's does).
TEST(ParseRunArgs, AFlagWhoseHelpSaysNotedPrintsANote) {
  CLI::App app;
  RunArgs a;
  add_run_options(app, a);
  int noted = 0;
  for (const auto& c : flag_cases()) {
    SCOPED_TRACE(c.dashed);
    if (app.get_option(c.dashed)->get_description().find("(accepted, noted") == std::string::npos)
      continue;
    ++noted;
    Args args{c.dashed};
    args.insert(args.end(), c.values.begin(), c.values.end());
    const LaunchOptions o = parse(args);
    ASSERT_EQ(o.notes.size(), 1u);
    EXPECT_EQ(o.notes[0].rfind(c.dashed + " ", 0), 0u) << o.notes[0];
  }
  EXPECT_EQ(noted, 4);  // --event-log-handler, --local-addr, --logs-specs, --numa-binding
}

// torchrun's launch lines: --run-path is a flag (the next word is not its value), a repeated
// option's last value wins (argparse), and a bad value of a new option names it.
TEST(ParseRunArgs, TorchrunTwoLaunchLines) {
  LaunchOptions o = parse_run_args({"--run-path", "--nproc-per-node", "2", "x.py"});
  EXPECT_TRUE(o.run_path);
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.program, "x.py");
  o = parse({"--nproc-per-node", "2", "--nproc-per-node", "3", "--max-restarts=1", "--max_restarts",
             "4", "--standalone", "--standalone"});
  EXPECT_EQ(o.nproc_per_node, 3);
  EXPECT_EQ(o.max_restarts, 4);
  o = parse({"--env", "A=1", "--env", "B=2"});  // repeatable options keep every value
  EXPECT_EQ(o.extra_env.size(), 2u);
  EXPECT_THROW(parse({"--numa-binding", "gpu"}), UsageError);
  EXPECT_THROW(parse({"--signals-to-handle", "SIGKILL"}), UsageError);
  EXPECT_THROW(parse({"--local-ranks-filter", "a"}), UsageError);
  // A filter beyond this node's local ranks shows nothing (torchrun's too): a note says so.
  o = parse({"--nproc-per-node", "2", "--local-ranks-filter", "2,5"});
  ASSERT_EQ(o.notes.size(), 1u);
  EXPECT_NE(o.notes[0].find("--local-ranks-filter 2,5: names no local rank of this node (0..1)"),
            std::string::npos)
      << o.notes[0];
  EXPECT_TRUE(parse({"--nproc-per-node", "2", "--local-ranks-filter", "1,5"}).notes.empty());
}

// The lines `script` prints, run by the venv's Python (its torchrun is the peer); fails the
// test (and returns none) when it fails.
std::vector<std::string> venv_python_lines(const std::string& script, const std::string& tag) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("dtrain-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "script.py") << script; }
  const std::string cmd = std::string(DTRAIN_VENV_PYTHON) + " " + (dir / "script.py").string() +
                          " > " + (dir / "out.txt").string();
  std::vector<std::string> lines;
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << cmd << " failed (is torch in the venv?)";
  } else {
    std::ifstream in(dir / "out.txt");
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  std::filesystem::remove_all(dir);
  return lines;
}

// A value torchrun's option `name` takes (any valid one: the tests parse it both ways alike).
std::string torchrun_sample_value(const std::string& name) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (has("numa")) return "node";
  if (has("signals")) return "SIGTERM";
  if (has("nnodes") || has("nproc")) return "1";
  if (has("node")) return "0";
  if (has("port")) return "29500";
  if (has("restarts") || has("redirects") || has("tee") || name == "-r" || name == "-t") return "0";
  if (has("interval")) return "0.1";
  if (has("start")) return "spawn";
  if (has("backend")) return "static";
  if (has("endpoint")) return "127.0.0.1:29500";
  if (has("filter")) return "0";
  if (has("conf")) return "timeout=10";
  if (has("addr")) return "127.0.0.1";
  return "x";
}

// Every option of the venv's torchrun (PyTorch 2.11), in each of its spellings, is an option of
// `dtrain run`, taking a value where torchrun's does and none where it is a flag: a new
// torchrun option shows up here as a failure.
TEST(ParseRunArgs, EveryTorchrunOptionOfTheVenvIsAccepted) {
  const std::string script =
      "from torch.distributed.run import get_args_parser\n"
      "for a in get_args_parser()._actions:\n"
      "    if a.option_strings and a.dest != 'help':\n"
      "        print(('flag' if a.nargs == 0 else 'value'), *a.option_strings)\n";
  int options = 0;
  for (const std::string& line : venv_python_lines(script, "torchrun-opts")) {
    std::istringstream words(line);
    std::string kind, name;
    words >> kind;
    while (words >> name) {
      SCOPED_TRACE("torchrun " + name);
      ++options;
      if (kind == "flag") {
        EXPECT_NO_THROW(parse({name})) << "torchrun's flag " << name << " is not a dtrain flag";
        // A flag takes no value: the next word is the program.
        EXPECT_EQ(parse_run_args({name, "prog.py", "arg"}).program, "prog.py");
      } else {
        const std::string value = torchrun_sample_value(name);
        EXPECT_NO_THROW(parse({name, value})) << "torchrun's option " << name << " " << value;
      }
    }
  }
  EXPECT_GE(options, 50) << "torchrun 2.11 has ~28 options, most in two spellings";
}

// What `o` holds that a torchrun option sets (not the random run id of --standalone).
std::string describe(const LaunchOptions& o) {
  std::ostringstream d;
  auto streams = [&](const std::map<int, int>& m) {
    for (auto [r, v] : m) d << r << ":" << v << " ";
  };
  d << "nnodes " << o.nnodes << " min " << o.min_nodes << " nproc " << o.nproc_per_node
    << " node_rank " << o.node_rank << " backend " << o.rdzv_backend << " addr " << o.master_addr
    << " port " << o.master_port << " standalone " << o.standalone << " restarts " << o.max_restarts
    << " monitor " << o.monitor_interval.count() << " start " << o.start_method << " role "
    << o.role << " module " << o.module << " no_python " << o.no_python << " run_path "
    << o.run_path << " log_dir " << o.log_dir << " timeout " << o.rdzv_timeout.count()
    << " signals " << o.signals_to_handle << " redirects ";
  streams(o.redirects);
  d << "tee ";
  streams(o.tee);
  d << "shown ";
  for (int r : o.local_ranks_filter) d << r << " ";
  for (const auto& f : o.duplicate_stdout_filters) d << "out[" << f << "] ";
  for (const auto& f : o.duplicate_stderr_filters) d << "err[" << f << "] ";
  if (!o.standalone) d << "id " << o.rdzv_id;
  for (const auto& n : o.notes) d << " note " << n;
  return d.str();
}

// torchrun's argparse takes a long option by any prefix that starts only one of its option
// strings ("--nnode 2", "--nproc_per=2") and calls a prefix of several ambiguous. Every prefix of
// every option of the venv's torchrun is tried: one torchrun resolves gives dtrain the same
// options as the full name; one it calls ambiguous is an "ambiguous option" UsageError.
TEST(ParseRunArgs, AbbreviatedFlagsAsTorchrunsArgparseTakesThem) {
  const std::string script =
      "from torch.distributed.run import get_args_parser\n"
      "p = get_args_parser()\n"
      "names = [s for s in p._option_string_actions if s.startswith('--') and s != '--help']\n"
      "seen = set()\n"
      "for full in names:\n"
      "    for n in range(3, len(full)):\n"
      "        pre = full[:n]\n"
      "        if pre in seen or pre in names: continue\n"
      "        seen.add(pre)\n"
      "        m = [s for s in names if s.startswith(pre)]\n"
      "        a = p._option_string_actions[m[0]]\n"
      "        print(pre, m[0] if len(m) == 1 else '-', 'flag' if a.nargs == 0 else 'value')\n";
  int resolved = 0, ambiguous = 0;
  for (const std::string& line : venv_python_lines(script, "torchrun-abbrev")) {
    std::istringstream words(line);
    std::string prefix, full, kind;
    words >> prefix >> full >> kind;
    SCOPED_TRACE("torchrun " + prefix + " (" + full + ")");
    if (full == "-") {
      ++ambiguous;
      const std::string e = usage_error({prefix, "prog"});
      EXPECT_NE(e.find("ambiguous option: " + prefix + " could match"), std::string::npos) << e;
      continue;
    }
    ++resolved;
    const std::string value = torchrun_sample_value(full);
    const Args with = kind == "flag" ? Args{prefix} : Args{prefix, value};
    const Args spelled = kind == "flag" ? Args{full} : Args{full, value};
    try {
      EXPECT_EQ(describe(parse(with)), describe(parse(spelled)));
      if (kind == "value") {
        EXPECT_EQ(describe(parse({prefix + "=" + value})), describe(parse(spelled)));
      }
    } catch (const UsageError& e) {
      ADD_FAILURE() << e.what();
    }
  }
  EXPECT_GT(resolved, 100);
  EXPECT_GT(ambiguous, 10);
  // PROGRAM's own arguments, and what follows "--", are never spelled out.
  EXPECT_EQ(parse_run_args({"--nnode", "1", "prog", "--nnode", "--no"}).args,
            (Args{"--nnode", "--no"}));
  // dtrain's own flags are spelled out in full: a prefix of them only is named as unknown.
  const std::string e = usage_error({"--term", "3", "prog"});
  EXPECT_NE(e.find("did you mean --term-timeout?"), std::string::npos) << e;
}

// torchrun takes every option it does not find on the command line from PET_<DEST> (its
// argparse_util `env` and `check_env` actions; Kubeflow's PyTorchJob sets PET_NNODES,
// PET_NODE_RANK, PET_MASTER_ADDR...). The venv's torchrun says which options, and what its
// own parser makes of each value; dtrain must parse every one as if given as the flag, and a
// flag on the command line wins.
// An error about a value that came from a PET_ variable names the variable (the user did not
// type the flag); one typed on the command line, in either spelling, does not.
TEST(ParseRunArgs, AnErrorAboutAPetVariablesValueNamesIt) {
  auto env = [](const char* name) -> const char* {
    return std::string(name) == "PET_NPROC_PER_NODE" || std::string(name) == "PET_STANDALONE"
               ? "abc"
               : nullptr;
  };
  const std::vector<std::string> bare = {"dtrain", "run", "train"};
  EXPECT_EQ(name_env_source("--nproc-per-node: got 'abc'", bare, env),
            "--nproc-per-node: got 'abc' (the value came from the environment variable "
            "PET_NPROC_PER_NODE)");
  EXPECT_EQ(name_env_source("Could not convert: --standalone = abc", bare, env),
            "Could not convert: --standalone = abc (the value came from the environment "
            "variable PET_STANDALONE)");
  for (const auto& typed :
       {std::vector<std::string>{"dtrain", "run", "--nproc-per-node", "abc", "train"},
        std::vector<std::string>{"dtrain", "run", "--nproc_per_node=abc", "train"}})
    EXPECT_EQ(name_env_source("--nproc-per-node: got 'abc'", typed, env),
              "--nproc-per-node: got 'abc'");
  EXPECT_EQ(name_env_source("--nnodes: got 'x'", bare, env), "--nnodes: got 'x'");
  EXPECT_EQ(name_env_source("missing PROGRAM", bare, env), "missing PROGRAM");
}

// torchrun's argparse drops a "--" right after the script, and only that one.
TEST(ParseRunArgs, ADashDashRightAfterProgramIsDroppedAsByTorchrun) {
  auto args_of = [](std::vector<std::string> a) {
    a.insert(a.begin(), {"--nproc-per-node", "1"});
    return parse_run_args(a).args;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(args_of({"q.py", "--", "--x"}), (V{"--x"}));
  EXPECT_EQ(args_of({"q.py", "a", "--", "b"}), (V{"a", "--", "b"}));
  EXPECT_EQ(args_of({"--", "q.py", "--x", "a", "--", "b"}), (V{"--x", "a", "--", "b"}));
  EXPECT_EQ(args_of({"q.py", "--"}), V{});
}

TEST(ParseRunArgs, AOneLetterFlagCountsAsGivenOnTheCommandLine) {
  auto env = [](const char* name) -> const char* {
    return std::string(name) == "PET_REDIRECTS" || std::string(name) == "PET_TEE" ? "9" : nullptr;
  };
  for (const auto& typed : {std::vector<std::string>{"-r", "9"}, {"-r9"}, {"--redirects=9"}})
    EXPECT_EQ(name_env_source("--redirects: got '9'", typed, env), "--redirects: got '9'");
  EXPECT_EQ(name_env_source("--tee: got '9'", {"-t", "9"}, env), "--tee: got '9'");
  EXPECT_EQ(name_env_source("--tee: got '9'", {"--nproc-per-node", "2"}, env),
            "--tee: got '9' (the value came from the environment variable PET_TEE)");
}

TEST(ParseRunArgs, PetVariablesStandInForOptionsAsUnderTorchrun) {
  // A value for each torchrun option that differs from its default.
  const std::map<std::string, std::string> samples = {
      {"PET_NNODES", "2"},
      {"PET_NPROC_PER_NODE", "3"},
      {"PET_RDZV_BACKEND", "c10d"},
      {"PET_RDZV_ENDPOINT", "127.0.0.2:29511"},
      {"PET_RDZV_ID", "job7"},
      {"PET_RDZV_CONF", "timeout=10"},
      {"PET_MAX_RESTARTS", "2"},
      {"PET_MONITOR_INTERVAL", "0.5"},
      {"PET_START_METHOD", "spawn"},
      {"PET_EVENT_LOG_HANDLER", "console"},
      {"PET_ROLE", "trainer"},
      {"PET_LOG_DIR", "/tmp/pet-logs"},
      {"PET_REDIRECTS", "3"},
      {"PET_TEE", "0:1"},
      {"PET_LOCAL_RANKS_FILTER", "0"},
      {"PET_DUPLICATE_STDOUT_FILTERS", "loss,,x,acc,"},
      {"PET_DUPLICATE_STDERR_FILTERS", "err"},
      {"PET_NODE_RANK", "1"},
      {"PET_MASTER_ADDR", "10.1.2.3"},
      {"PET_MASTER_PORT", "29511"},
      {"PET_LOCAL_ADDR", "10.0.0.5"},
      {"PET_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR1"}};
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dtrain-torchrun-pet-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    // Each option torchrun reads from PET_<DEST>: "flag|value NAME OPTION", then for the
    // filters what torchrun's parser makes of the sample (its comma_separated_list).
    std::ofstream py(dir / "pet.py");
    py << "import os, sys\n"
          "from torch.distributed.argparse_util import env, check_env\n"
          "from torch.distributed.run import get_args_parser\n"
          "for a in get_args_parser()._actions:\n"
          "    if isinstance(a, (env, check_env)):\n"
          "        kind = 'flag' if isinstance(a, check_env) else 'value'\n"
          "        print(kind, 'PET_' + a.dest.upper(), a.option_strings[-1])\n"
          "os.environ['PET_DUPLICATE_STDOUT_FILTERS'] = sys.argv[1]\n"
          "args = get_args_parser().parse_args(['prog.py'])\n"
          "print('filters', '|'.join(args.duplicate_stdout_filters))\n"
          "del os.environ['PET_DUPLICATE_STDOUT_FILTERS']\n"
       // Each variable set but empty, through what torchrun's main runs before it starts a
       // worker (its parser, config_from_args, the rendezvous handler, the event log
       // handler): "empty VAR ok" or "empty VAR error WHAT".
       << kTorchrunVerdict
       << "for a in get_args_parser()._actions:\n"
          "    if not isinstance(a, (env, check_env)):\n"
          "        continue\n"
          "    var = 'PET_' + a.dest.upper()\n"
          "    os.environ[var] = ''\n"
          "    print('empty', var, verdict([]))\n"
          "    del os.environ[var]\n";
  }
  const std::string cmd = std::string(DTRAIN_VENV_PYTHON) + " " + (dir / "pet.py").string() + " '" +
                          samples.at("PET_DUPLICATE_STDOUT_FILTERS") + "' > " +
                          (dir / "pet.txt").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " (is torch in the venv?)";
  std::ifstream in(dir / "pet.txt");
  int options = 0, empties = 0, torchrun_stops = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string kind, var, flag;
    words >> kind >> var >> flag;
    if (kind == "empty") {
      // PET_<NAME>= (set, empty): where torchrun stops, dtrain stops too, naming the variable;
      // where torchrun runs, dtrain runs as without the variable - but for an empty role or
      // signal list, which both run with, and an empty run id, a random one on both
      // (torchrun's str(uuid4().int)).
      SCOPED_TRACE(line);
      ++empties;
      test::ScopedEnv env;
      env.set(var.c_str(), "");
      const std::string torchrun = flag;  // "ok" or "error"
      if (torchrun == "error") {
        const std::string msg = usage_error({"prog"});
        EXPECT_EQ(msg.rfind(var + " is set but empty", 0), 0u) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        ++torchrun_stops;
      } else {
        EXPECT_EQ(torchrun, "ok");
        const LaunchOptions o = parse({});
        if (var == "PET_ROLE") {
          EXPECT_EQ(o.role, "");
        } else if (var == "PET_SIGNALS_TO_HANDLE") {
          EXPECT_EQ(o.signals_to_handle, "");
        } else if (var == "PET_RDZV_ID") {
          EXPECT_GE(o.rdzv_id.size(), 30u) << o.rdzv_id;
          EXPECT_EQ(o.rdzv_id.find_first_not_of("0123456789"), std::string::npos) << o.rdzv_id;
          EXPECT_NE(parse({}).rdzv_id, o.rdzv_id) << "a fresh one per launch";
        } else {
          env.set(var.c_str(), nullptr);
          const std::string unset = describe(parse({}));
          EXPECT_EQ(describe(o), unset);
        }
      }
      continue;
    }
    if (kind == "filters") {
      std::string torchrun = line.substr(std::string("filters ").size()), ours;
      test::ScopedEnv env;
      env.set("PET_DUPLICATE_STDOUT_FILTERS", samples.at("PET_DUPLICATE_STDOUT_FILTERS").c_str());
      for (const auto& f : parse({}).duplicate_stdout_filters)
        ours += (ours.empty() ? "" : "|") + f;
      EXPECT_EQ(ours, torchrun) << "the filters torchrun's parser made of the same value";
      continue;
    }
    SCOPED_TRACE(var + " (" + flag + ")");
    ++options;
    const std::string unset = describe(parse({}));
    test::ScopedEnv env;  // gone with this option's turn, whatever happens in it
    if (kind == "flag") {
      const std::string given = describe(parse({flag}));
      env.set(var.c_str(), "1");
      EXPECT_EQ(describe(parse({})), given);
      env.set(var.c_str(), "0");
      EXPECT_EQ(describe(parse({})), unset);
    } else {
      auto it = samples.find(var);
      if (it == samples.end()) {
        ADD_FAILURE() << "torchrun reads " << var << ": add a sample value for it here";
        continue;
      }
      const std::string given = describe(parse({flag, it->second}));
      EXPECT_NE(given, unset) << "the sample value must differ from the default";
      env.set(var.c_str(), it->second.c_str());
      EXPECT_EQ(describe(parse({})), given);
      // The command line wins over the variable, as in argparse.
      if (var == "PET_ROLE") {
        EXPECT_EQ(parse({flag, "other"}).role, "other");
      }
    }
  }
  EXPECT_GE(options, 25) << "torchrun 2.11 reads ~27 options from PET_ variables";
  EXPECT_EQ(empties, options);
  EXPECT_GE(torchrun_stops, 14) << "torchrun 2.11 stops on 16 empty PET_ variables";
  std::filesystem::remove_all(dir);
}

// `--FLAG=` for every torchrun option: the venv's torchrun 2.11 parses it (argparse hands ""
// to the option's type) and runs what its main runs before it starts a worker (config_from_args,
// the rendezvous handler, the event log handler, the logs specs); `dtrain run` stops where it
// stops (exit 2 from the CLI, one line naming the flag) and goes on where it goes on, with the
// same meaning: the flag's default, an empty role name or signal list, a random run id.
TEST(ParseRunArgs, EmptyFlagValuesAsUnderTorchrun) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dtrain-torchrun-empty-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream py(dir / "empty.py");
    py << kTorchrunVerdict
       << "from torch.distributed.run import get_args_parser\n"
          "for a in get_args_parser()._actions:\n"
          "    longs = [o for o in a.option_strings if o.startswith('--') and o != '--help']\n"
          "    if not longs:\n"
          "        continue\n"
          "    opt = longs[0]\n"
          "    spellings = [('empty', [opt + '='])]\n"
          "    if a.nargs != 0:\n"
          "        spellings.append(('space', [opt, '']))\n"
          "    for kind, flag in spellings:\n"
          "        print(kind, opt, verdict(flag, logs_specs=True))\n";
  }
  const std::string cmd = std::string(DTRAIN_VENV_PYTHON) + " " + (dir / "empty.py").string() +
                          " > " + (dir / "empty.txt").string() + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " (is torch in the venv?)";
  std::ifstream in(dir / "empty.txt");
  int flags = 0, stops = 0, spaced = 0, spaced_stops = 0;
  std::set<std::string> torchruns;
  const std::string unset = describe(parse({}));
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string kind, opt, outcome;
    words >> kind >> opt >> outcome;
    // "empty": `--FLAG=`; "space": `--FLAG ''` (a flag that takes a value).
    if (kind != "empty" && kind != "space") continue;
    SCOPED_TRACE(line);
    const Args flag = kind == "empty" ? Args{opt + "="} : Args{opt, ""};
    ++(kind == "empty" ? flags : spaced);
    torchruns.insert(opt);
    if (outcome == "error") {
      ++(kind == "empty" ? stops : spaced_stops);
      Args args = flag;
      args.push_back("prog");
      const std::string msg = usage_error(args);
      EXPECT_EQ(msg.rfind(opt + "=: an empty value; torchrun 2.11 stops on it too (", 0), 0u)
          << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      continue;
    }
    ASSERT_EQ(outcome, "ok");
    // The next argument stays PROGRAM (CLI11 alone would take it as the value).
    const LaunchOptions o = parse(flag);
    EXPECT_EQ(o.program.substr(o.program.rfind('/') + 1), "prog") << o.program;
    if (opt == "--role") {
      EXPECT_EQ(o.role, "");
    } else if (opt == "--signals-to-handle") {
      EXPECT_EQ(o.signals_to_handle, "");
    } else if (opt == "--rdzv-id") {
      EXPECT_GE(o.rdzv_id.size(), 30u) << o.rdzv_id;
      EXPECT_NE(parse(flag).rdzv_id, o.rdzv_id) << "a fresh one per launch";
    } else {
      EXPECT_EQ(describe(o), unset);
    }
  }
  EXPECT_GE(flags, 28) << "torchrun 2.11 has 29 options besides --help";
  EXPECT_GE(stops, 18) << "torchrun 2.11 stops on 19 of them";
  // The flags that take a value, spelt `--FLAG ''`: argparse's verdict is the `=` one's.
  EXPECT_GE(spaced, 24) << "torchrun 2.11 has 24 options that take a value";
  EXPECT_GE(spaced_stops, 14) << "torchrun 2.11 stops on 14 of them";
  // dtrain's own flags (no torchrun to follow): an empty value is refused, naming the flag.
  for (const char* own : {"--term-timeout", "--rdzv-timeout", "--hostfile", "--ifname",
                          "--bind-core-list", "--failure-file", "--env"}) {
    const std::string msg = usage_error({std::string(own) + "=", "prog"});
    EXPECT_EQ(msg.rfind(std::string(own) + "=: an empty value; give one", 0), 0u) << msg;
  }
  std::filesystem::remove_all(dir);
}

TEST(ParseRunArgs, NprocCpuIsTheCoreCount) {
  EXPECT_EQ(parse({"--nproc-per-node", "cpu"}).nproc_per_node, static_cast<int>(cpu_count()));
}

TEST(ParseRunArgs, NprocGpuAndAutoWithoutCuda) {
  if (std::filesystem::exists("/dev/nvidia0")) GTEST_SKIP() << "this machine has a CUDA device";
  // 'auto' falls back to one worker per core; 'gpu' must not silently start CPU workers.
  EXPECT_EQ(parse({"--nproc-per-node", "auto"}).nproc_per_node, static_cast<int>(cpu_count()));
  std::string msg = usage_error({"--nproc-per-node", "gpu", "prog"});
  EXPECT_NE(msg.find("--nproc-per-node"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
}

TEST(ParseRunArgs, NnodesTakesNOrAnElasticRange) {
  EXPECT_EQ(parse({"--nnodes", "2:2"}).nnodes, 2);
  EXPECT_EQ(parse({"--nnodes", "2:2"}).min_nodes, 0);  // N:N is not elastic
  LaunchOptions e =
      parse({"--nnodes", "1:3", "--rdzv-backend", "c10d", "--rdzv-conf", "last_call_timeout=2.5"});
  EXPECT_EQ(e.nnodes, 3);
  EXPECT_EQ(e.min_nodes, 1);
  EXPECT_EQ(e.last_call, std::chrono::milliseconds(2500));
  std::string msg = usage_error({"--nnodes", "3:1", "prog"});
  EXPECT_NE(
      msg.find(
          "--nnodes: got '3:1', expected a positive integer N, or MIN:MAX with 1 <= MIN <= MAX"),
      std::string::npos)
      << msg;
  // Elastic needs the c10d rendezvous (ranks in join order) and takes no --node-rank.
  msg = usage_error({"--nnodes", "1:3", "prog"});
  EXPECT_NE(msg.find("(elastic) needs --rdzv-backend c10d"), std::string::npos) << msg;
  msg = usage_error({"--nnodes", "1:3", "--rdzv-backend", "c10d", "--node-rank", "0", "prog"});
  EXPECT_NE(msg.find("drop --node-rank"), std::string::npos) << msg;
}

TEST(ParseRunArgs, StandaloneIsSingleNodeC10dOnAFreeLocalPort) {
  LaunchOptions o = parse({"--standalone"});
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.rdzv_backend, "c10d");
  EXPECT_EQ(o.master_addr, "localhost");  // torchrun's endpoint localhost:0
  EXPECT_EQ(o.master_port, 0);
  // torchrun's run id under --standalone: a fresh uuid4 each time, over any --rdzv-id.
  const std::regex uuid4("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  EXPECT_TRUE(std::regex_match(o.rdzv_id, uuid4)) << o.rdzv_id;
  LaunchOptions again = parse({"--standalone", "--rdzv-id", "job7"});
  EXPECT_TRUE(std::regex_match(again.rdzv_id, uuid4)) << again.rdzv_id;
  EXPECT_NE(again.rdzv_id, o.rdzv_id);
  // It wins over an endpoint given with it: standalone never talks to another host.
  LaunchOptions e = parse({"--standalone", "--rdzv-endpoint", "farhost:1234"});
  EXPECT_EQ(e.master_addr, "localhost");
  EXPECT_EQ(e.master_port, 0);
  std::string msg = usage_error({"--standalone", "--nnodes", "2", "prog"});
  EXPECT_NE(msg.find("--standalone"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--nnodes is 2"), std::string::npos) << msg;
}

TEST(ParseRunArgs, RdzvEndpointForms) {
  LaunchOptions v4 = parse({"--rdzv-endpoint", "10.0.0.5:29400"});
  EXPECT_EQ(v4.master_addr, "10.0.0.5");
  EXPECT_EQ(v4.master_port, 29400);
  LaunchOptions v6 = parse({"--rdzv-endpoint", "[::1]:1234"});
  EXPECT_EQ(v6.master_addr, "::1");
  EXPECT_EQ(v6.master_port, 1234);
  LaunchOptions name = parse({"--rdzv-endpoint", "head-node:0"});
  EXPECT_EQ(name.master_addr, "head-node");
  EXPECT_EQ(name.master_port, 0);
  // torchrun allows a bare host; the port is then c10d's default.
  LaunchOptions bare = parse({"--rdzv-endpoint", "head-node"});
  EXPECT_EQ(bare.master_addr, "head-node");
  EXPECT_EQ(bare.master_port, 29400);
  // The endpoint overrides --master-addr/--master-port, whatever the order.
  LaunchOptions both =
      parse({"--master-addr", "a", "--master-port", "1", "--rdzv-endpoint", "b:2"});
  EXPECT_EQ(both.master_addr, "b");
  EXPECT_EQ(both.master_port, 2);
}

TEST(ParseRunArgs, BadRdzvEndpointsNameTheWholeValue) {
  for (std::string bad : {"host:", "host:abc", "host:70000", "host:-1", ":1234", "[::1]",
                          "[::1]1234", "[::1]:", "[::1]:x", "[::1:5"}) {
    SCOPED_TRACE(bad);
    std::string msg = usage_error({"--rdzv-endpoint", bad, "prog"});
    EXPECT_NE(msg.find("--rdzv-endpoint: got '" + bad + "', expected HOST:PORT"), std::string::npos)
        << msg;
  }
}

TEST(ParseRunArgs, StreamSpecsWholeAndPerRank) {
  EXPECT_EQ(parse({"--redirects", "1"}).redirects, (std::map<int, int>{{-1, 1}}));
  EXPECT_EQ(parse({"--redirects", "0:3,1:2"}).redirects, (std::map<int, int>{{0, 3}, {1, 2}}));
  EXPECT_EQ(parse({"--tee", "0:1"}).tee, (std::map<int, int>{{0, 1}}));
  EXPECT_EQ(parse({"--tee", "2:3,0:0"}).tee, (std::map<int, int>{{0, 0}, {2, 3}}));
  for (const char* flag : {"--redirects", "--tee"}) {
    for (std::string bad : {"4", "-1", "x", "0:4", "a:1", "0:1,", "-1:2", "0:", ":1", "0:1,,1:2"}) {
      SCOPED_TRACE(std::string(flag) + " " + bad);
      std::string msg = usage_error({flag, bad, "prog"});
      EXPECT_NE(msg.find(std::string(flag) + ": got '" + bad + "', expected 0-3"),
                std::string::npos)
          << msg;
    }
  }
}

TEST(ParseRunArgs, EnvIsRepeatableAndValuesMayHoldEquals) {
  LaunchOptions o = parse({"--env", "A=1", "--env", "B=x=y", "--env", "EMPTY="});
  EXPECT_EQ(o.extra_env,
            (std::map<std::string, std::string>{{"A", "1"}, {"B", "x=y"}, {"EMPTY", ""}}));
  for (std::string bad : {"NOEQUALS", "=value"}) {
    std::string msg = usage_error({"--env", bad, "prog"});
    EXPECT_NE(msg.find("--env: got '" + bad + "', expected KEY=VALUE"), std::string::npos) << msg;
  }
}

TEST(ParseRunArgs, FlagsAfterProgramGoToTheProgram) {
  LaunchOptions o = parse_run_args({"--nproc-per-node", "2", "prog", "--nproc-per-node", "5", "-m",
                                    "--help", "--lines", "3", "--", "x"});
  EXPECT_EQ(o.program, "prog");
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_FALSE(o.module);
  EXPECT_EQ(o.args, (Args{"--nproc-per-node", "5", "-m", "--help", "--lines", "3", "--", "x"}));
}

TEST(ParseRunArgs, DoubleDashSeparatesProgram) {
  LaunchOptions o = parse_run_args({"--nnodes", "1", "--", "prog", "--nnodes", "9"});
  EXPECT_EQ(o.program, "prog");
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.args, (Args{"--nnodes", "9"}));
  LaunchOptions dash_prog = parse_run_args({"--", "--weird-name"});
  EXPECT_EQ(dash_prog.program, "--weird-name");
}

TEST(ParseRunArgs, MissingProgram) {
  for (const Args& args : {Args{}, Args{"--nproc-per-node", "2"}, Args{"--"}}) {
    SCOPED_TRACE(::testing::PrintToString(args));
    std::string msg = usage_error(args);
    EXPECT_NE(msg.find("missing PROGRAM"), std::string::npos) << msg;
  }
}

// Every bad value: the message names the flag, quotes the value and says what is expected.
TEST(ParseRunArgs, UsageErrorsNameFlagValueAndForm) {
  struct Case {
    Args args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--nproc-per-node", "0"}, "--nproc-per-node: got '0', expected a positive integer"},
      {{"--nproc-per-node", "-1"}, "--nproc-per-node: got '-1', expected a positive integer"},
      {{"--nproc-per-node", "abc"}, "--nproc-per-node: got 'abc', expected a positive integer"},
      {{"--nproc-per-node", "2x"}, "--nproc-per-node: got '2x', expected a positive integer"},
      {{"--nproc_per_node", "0"}, "--nproc-per-node: got '0'"},
      {{"--nnodes", "0"}, "--nnodes: got '0', expected a positive integer"},
      {{"--nnodes", "two"}, "--nnodes: got 'two', expected a positive integer"},
      {{"--node-rank", "x"}, "--node-rank: got 'x', expected an integer"},
      {{"--master-port", "70000"}, "--master-port: got '70000', expected a port number in 0-65535"},
      {{"--master-port", "-5"}, "--master-port: got '-5', expected a port number"},
      {{"--master-port", "http"}, "--master-port: got 'http', expected a port number"},
      {{"--rdzv-backend", "etcd"}, "--rdzv-backend: got 'etcd'; dtrain hosts its own store"},
      {{"--rdzv-backend", "zookeeper"},
       "--rdzv-backend: got 'zookeeper', expected 'static' or 'c10d'"},
      {{"--rdzv-timeout", "-1"},
       "--rdzv-timeout: got '-1', expected a non-negative number of seconds"},
      {{"--rdzv-timeout", "soon"}, "--rdzv-timeout: got 'soon', expected a non-negative number"},
      // Beyond ~31 years seconds * 1000 no longer fits a duration: once a negative timeout.
      {{"--rdzv-timeout", "1e300"},
       "--rdzv-timeout: got '1e300', expected a non-negative number "
       "of seconds (at most 1e9)"},
      {{"--rdzv-timeout", "inf"}, "--rdzv-timeout: got 'inf'"},
      {{"--term-timeout", "1e16"}, "--term-timeout: got '1e16'"},
      {{"--rdzv-conf", "join_timeout=1e300"}, "--rdzv-conf join_timeout: got '1e300'"},
      {{"--node-rank", "-5"}, "--node-rank: got '-5', expected an integer in 0..nnodes-1"},
      // Once the next argument became the value: the program was `sh`, not `true`. dtrain's own
      // flags have no torchrun to follow; torchrun's: EmptyFlagValuesAsUnderTorchrun.
      {{"--term-timeout=", "true", "sh"},
       "--term-timeout=: an empty value; give one (--term-timeout=VALUE)"},
      {{"--nproc-per-node", "100000"},
       "--nproc-per-node: got '100000', at most 8192 workers run on one node"},
      {{"--start-method", "threads"},
       "--start-method: got 'threads', expected auto, spawn, forkserver or fork"},
      {{"--failure-store", "host:4000"},
       "--failure-store: got 'host:4000', expected HOST:PORT/KEY"},
      {{"--failure-store", "host:x/key"}, "--failure-store: got 'host:x'"},
      {{"--failure-store", "host:0/key"}, "expected HOST:PORT/KEY with a port above 0"},
      {{"--failure-store", "host/key"}, "--failure-store: got 'host/key', expected HOST:PORT/KEY"},
      {{"--failure-store", "fe80::1/key"}, "(an IPv6 host in brackets: [::1]:PORT/KEY)"},
      {{"--rdzv-conf", "join_timeout"}, "--rdzv-conf: got 'join_timeout', expected KEY=VALUE"},
      {{"--rdzv-conf", "timeout=x"},
       "--rdzv-conf timeout: got 'x', expected a non-negative number"},
      {{"--max-restarts", "-1"}, "--max-restarts: got '-1', expected a non-negative integer"},
      {{"--monitor-interval", "fast"},
       "--monitor-interval: got 'fast', expected a non-negative number"},
      {{"--term-timeout", "-0.5"}, "--term-timeout: got '-0.5', expected a non-negative number"},
      {{"-m", "--no-python"}, "-m/--module and --no-python: choose one"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.args));
    Args args = c.args;
    args.push_back("prog");
    std::string msg = usage_error(args);
    EXPECT_NE(msg.find(c.expected), std::string::npos) << msg;
  }
}

TEST(ParseRunArgs, NonNumericMaxRestartsIsAUsageError) {
  // Bound as an int, so CLI11 rejects it; it must still surface as a UsageError (exit 2)
  // that names the flag and the value.
  std::string msg = usage_error({"--max-restarts", "lots", "prog"});
  EXPECT_NE(msg.find("--max-restarts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lots"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------
// validate_launch_options

TEST(ValidateLaunchOptions, ResolvesNodeRankAndPortDefaults) {
  LaunchOptions single = parse_run_args({"sh"});
  validate_launch_options(single);
  EXPECT_EQ(single.node_rank, 0);
  // One node: -1 stays, and the agent takes torchrun's 29500, or a free port when it is taken.
  EXPECT_EQ(single.master_port, -1);

  LaunchOptions multi = parse_run_args({"--nnodes", "2", "--node-rank", "1", "sh"});
  validate_launch_options(multi);
  EXPECT_EQ(multi.node_rank, 1);
  EXPECT_EQ(multi.master_port, 29500);  // torchrun's default: every node must agree on it

  // c10d hands out node ranks in join order: no rank is made up here.
  LaunchOptions c10d = parse_run_args(
      {"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "sh"});
  validate_launch_options(c10d);
  EXPECT_EQ(c10d.node_rank, -1);
}

TEST(ValidateLaunchOptions, NodeRankMustBeBelowNnodes) {
  std::string msg = usage_error({"--nnodes", "2", "--node-rank", "2", "sh"});
  EXPECT_NE(msg.find("--node-rank: got '2', expected 0..1"), std::string::npos) << msg;
}

TEST(ValidateLaunchOptions, PortZeroNeedsOneNode) {
  std::string msg = usage_error({"--nnodes", "2", "--node-rank", "0", "--master-port", "0", "sh"});
  EXPECT_NE(msg.find("--master-port: port 0"), std::string::npos) << msg;
}

TEST(ValidateLaunchOptions, RejectsBadNumbersSetDirectly) {
  // run_launch() is a library call too: options built in code get the same checks.
  LaunchOptions o;
  o.program = "sh";
  o.nproc_per_node = 0;
  EXPECT_THROW(validate_launch_options(o), UsageError);
  o.nproc_per_node = 1;
  o.nnodes = 0;
  EXPECT_THROW(validate_launch_options(o), UsageError);
}

TEST(ValidateLaunchOptions, FindsProgramOnPath) {
  LaunchOptions o = parse_run_args({"sh", "-c", "true"});
  validate_launch_options(o);
  EXPECT_EQ(o.program.front(), '/') << o.program;
  EXPECT_EQ(std::filesystem::path(o.program).filename(), "sh");
  EXPECT_EQ(o.args, (Args{"-c", "true"}));

  std::string msg = usage_error({"no-such-program-dtrain-test"});
  EXPECT_NE(msg.find("PROGRAM 'no-such-program-dtrain-test' was not found on PATH"),
            std::string::npos)
      << msg;
}

TEST(ForkServer, InspectsProgramsForItsPreconditions) {
  // This test binary: dynamically linked, without libtorch.
  auto self = launch::inspect_program("/proc/self/exe");
  EXPECT_TRUE(self.dynamic_elf);
  EXPECT_FALSE(self.set_id);
  EXPECT_NE(std::find(self.needed.begin(), self.needed.end(), "libc.so.6"), self.needed.end());
  EXPECT_TRUE(launch::fork_server_can_start(self));
  EXPECT_FALSE(launch::fork_server_pays_off(self));
  // Debian's ldconfig is static-pie: no loader, so no LD_PRELOAD.
  EXPECT_FALSE(launch::inspect_program("/sbin/ldconfig").dynamic_elf);
  // A shared library is not a program; scripts and missing files are not ELF programs.
  EXPECT_FALSE(launch::inspect_program(std::string(DTRAIN_BUILD_DIR) + "/libdtrain_forkserver.so")
                   .dynamic_elf);
  TempDir dir;
  EXPECT_FALSE(launch::inspect_program(dir.file("s.sh", 0755, "#!/bin/sh\n")).dynamic_elf);
  EXPECT_FALSE(launch::inspect_program(dir.path() + "/missing").dynamic_elf);

  launch::ProgramInfo torch{true, false, {"libtorch.so.1.13", "libc.so.6"}};
  EXPECT_TRUE(launch::fork_server_pays_off(torch));
  EXPECT_TRUE(launch::fork_server_pays_off({true, false, {"libdtrain.so"}}));
  EXPECT_TRUE(launch::fork_server_pays_off({true, false, {"libc10.so"}}));
  EXPECT_FALSE(launch::fork_server_can_start({true, true, {"libtorch.so.1.13"}})) << "set-ID";
  EXPECT_FALSE(launch::fork_server_can_start({true, false, {"libasan.so.8", "libtorch.so.1.13"}}));
  EXPECT_FALSE(launch::fork_server_can_start({true, false, {"libtsan.so.2"}}));
}

TEST(ForkServer, AutoPicksItForTwoOrMoreWorkersOfALibtorchProgramOnly) {
  LaunchOptions o = parse_run_args({"--nproc-per-node", "2", "/proc/self/exe"});
  validate_launch_options(o);
  EXPECT_FALSE(uses_fork_server(o)) << "auto: this program does not link libtorch";
  o.start_method = "forkserver";
  EXPECT_TRUE(uses_fork_server(o));
  o.start_method = "spawn";
  EXPECT_FALSE(uses_fork_server(o));
  LaunchOptions py =
      parse_run_args({"--start-method", "forkserver", "--nproc-per-node", "2", "train.py"});
  EXPECT_FALSE(uses_fork_server(py)) << "Python scripts always spawn";
}

TEST(ValidateLaunchOptions, RejectsMissingNonExecutableAndDirectoryPrograms) {
  TempDir dir;
  std::string plain = dir.file("data.txt", 0644, "not a program\n");
  std::string missing = dir.path() + "/nope";
  std::string msg = usage_error({missing});
  EXPECT_NE(msg.find("PROGRAM '" + missing + "': no such file"), std::string::npos) << msg;
  msg = usage_error({plain});
  EXPECT_NE(msg.find("PROGRAM '" + plain + "' is not an executable file"), std::string::npos)
      << msg;
  msg = usage_error({dir.path()});
  EXPECT_NE(msg.find("PROGRAM '" + dir.path() + "' is not an executable file"), std::string::npos)
      << msg;
}

// Runs `body` with an environment variable set, restored afterwards however `body` ends.
void with_env(const char* name, const char* value, const std::function<void()>& body) {
  dtrain::test::ScopedEnv env;
  env.set(name, value);
  body();
}

TEST(ValidateLaunchOptions, PythonScriptsNeedAnInterpreterAndTheScript) {
  TempDir dir;
  std::string script = dir.file("train.py", 0644, "print('hi')\n");
  // The interpreter is taken from DTRAIN_PYTHON; /bin/sh stands in for one that exists.
  with_env("DTRAIN_PYTHON", "/bin/sh", [&] {
    LaunchOptions o = parse_run_args({script});
    validate_launch_options(o);
    EXPECT_EQ(o.python, "/bin/sh");
    EXPECT_EQ(o.program, script);  // a script need not be executable

    std::string msg = usage_error({dir.path() + "/missing.py"});
    EXPECT_NE(msg.find("no such script"), std::string::npos) << msg;

    // -m names a module, not a file.
    LaunchOptions m = parse_run_args({"-m", "some.module"});
    EXPECT_NO_THROW(validate_launch_options(m));
  });
  with_env("DTRAIN_PYTHON", "/nonexistent/python9", [&] {
    std::string msg = usage_error({script});
    EXPECT_NE(msg.find("needs a Python interpreter"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'/nonexistent/python9' (from DTRAIN_PYTHON)"), std::string::npos) << msg;
  });
  // torchrun's PYTHON_EXEC stands in when DTRAIN_PYTHON is unset; the error names it.
  with_env("DTRAIN_PYTHON", nullptr, [&] {
    with_env("PYTHON_EXEC", "/nonexistent/python8", [&] {
      std::string msg = usage_error({script});
      EXPECT_NE(msg.find("'/nonexistent/python8' (from PYTHON_EXEC)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("fix or unset PYTHON_EXEC"), std::string::npos) << msg;
    });
  });
  // --no-python: a .py is executed directly, so it must be executable itself.
  std::string msg = usage_error({"--no-python", script});
  EXPECT_NE(msg.find("is not an executable file"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------
// launch::OutputStream

// An unlinked temp file as the console: unlike a pipe it never fills up, so a 1 MB line
// cannot block the writer, and it reads back everything written.
class CaptureFd {
 public:
  CaptureFd() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "output_test-XXXXXX").string();
    fd_ = ::mkstemp(tmpl.data());
    if (fd_ < 0) throw std::runtime_error("mkstemp failed");
    ::unlink(tmpl.c_str());
  }
  ~CaptureFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  // A second descriptor for OutputStream to own (it closes its file fd).
  int dup() const { return ::dup(fd_); }
  std::string contents() const {
    struct stat st {};
    ::fstat(fd_, &st);
    std::string s(static_cast<size_t>(st.st_size), '\0');
    size_t got = 0;
    while (got < s.size()) {
      ssize_t n = ::pread(fd_, s.data() + got, s.size() - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    s.resize(got);
    return s;
  }

 private:
  int fd_ = -1;
};

using launch::OutputStream;

TEST(OutputStream, PrefixesEveryCompleteLine) {
  CaptureFd console;
  OutputStream s("[default3]:", console.fd(), -1, 0);
  s.write("one\ntwo\n\nthree\n");
  EXPECT_EQ(console.contents(), "[default3]:one\n[default3]:two\n[default3]:\n[default3]:three\n");
}

TEST(OutputStream, PartialLinesWaitForTheirNewline) {
  CaptureFd console;
  OutputStream s("[r0]:", console.fd(), -1, 0);
  s.write("hel");
  EXPECT_EQ(console.contents(), "") << "a partial line must not be printed yet";
  s.write("lo wor");
  s.write("ld\nsec");
  EXPECT_EQ(console.contents(), "[r0]:hello world\n");
  s.write("ond\n");
  EXPECT_EQ(console.contents(), "[r0]:hello world\n[r0]:second\n");
}

// A partial line that stays partial (a prompt, dots written one by one) goes to the console
// after OutputStream::kIdleFlush, and the rest of its line follows as it comes.
TEST(OutputStream, APartialLineThatWaitsGoesToTheConsoleAfterTheIdleWait) {
  CaptureFd console;
  OutputStream s("[default0]:", console.fd(), -1, 3);
  EXPECT_FALSE(s.flush_due()) << "nothing waits";
  s.write("(Pdb) ");
  auto due = s.flush_due();
  ASSERT_TRUE(due);
  s.flush_idle(*due - std::chrono::milliseconds(1));
  EXPECT_EQ(console.contents(), "") << "not before its time";
  s.flush_idle(*due);
  EXPECT_EQ(console.contents(), "[default0]:(Pdb) ");
  EXPECT_FALSE(s.flush_due()) << "the line is on the console: its rest follows as it comes";
  s.write("next");
  EXPECT_EQ(console.contents(), "[default0]:(Pdb) next");
  s.write(" line\nwhole\n");
  EXPECT_EQ(console.contents(), "[default0]:(Pdb) next line\n[default0]:whole\n");
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"(Pdb) next line", "whole"}));
  // Each write moves the deadline: a line written in pieces in quick succession goes out whole.
  s.write("a");
  const auto first = *s.flush_due();
  s.write("b");
  EXPECT_GE(*s.flush_due(), first);
  s.write("c\n");
  EXPECT_EQ(console.contents(), "[default0]:(Pdb) next line\n[default0]:whole\n[default0]:abc\n");
}

// A read that ends in '\r' waits for the next byte ("\r\n" or a redraw); when none comes, the
// '\r' is a carriage return of its own after the idle wait.
TEST(OutputStream, ATrailingCarriageReturnIsARedrawWhenNothingFollowsIt) {
  CaptureFd console;
  OutputStream s("[p]:", console.fd(), -1, 0);
  s.write("10%\r");
  EXPECT_EQ(console.contents(), "");
  s.flush_idle(*s.flush_due());
  EXPECT_EQ(console.contents(), "[p]:10%");
  s.write("20%\r");
  s.flush_idle(*s.flush_due());
  s.write("\n");
  EXPECT_EQ(console.contents(), "[p]:10%\r[p]:20%\n");
}

// Two ranks on one console: a whole line of the other rank while a prompt waits starts on a
// line of its own, and the prompt's line goes on below it, prefixed again.
TEST(OutputStream, AnotherRanksLineAfterAFlushedPromptGetsALineOfItsOwn) {
  CaptureFd console;
  OutputStream r0("[default0]:", console.fd(), -1, 0);
  OutputStream r1("[default1]:", console.fd(), -1, 0);
  r0.write("(Pdb) ");
  r0.flush_idle(*r0.flush_due());
  r1.write("step 3\n");
  r0.write("c\n");
  EXPECT_EQ(console.contents(), "[default0]:(Pdb) \n[default1]:step 3\n[default0]:c\n");
}

// No console (a rank whose output is only in its log): nothing to flush.
TEST(OutputStream, NoIdleFlushWithoutAConsole) {
  OutputStream s("[p]:", -1, -1, 2);
  s.write("partial");
  EXPECT_FALSE(s.flush_due());
}

TEST(OutputStream, ByteAtATime) {
  CaptureFd console;
  OutputStream s("[p]:", console.fd(), -1, 0);
  for (char c : std::string("ab\ncd\n")) s.write(std::string_view(&c, 1));
  EXPECT_EQ(console.contents(), "[p]:ab\n[p]:cd\n");
}

TEST(OutputStream, OneMegabyteLineIsNeverCut) {
  CaptureFd console;
  OutputStream s("[default0]:", console.fd(), -1, 2);
  const std::string line(1 << 20, 'x');
  // As the agent reads a pipe: in chunks, the newline in a chunk of its own.
  for (size_t pos = 0; pos < line.size(); pos += 4096)
    s.write(std::string_view(line).substr(pos, 4096));
  s.write("\nnext\n");
  EXPECT_TRUE(console.contents() == "[default0]:" + line + "\n[default0]:next\n")
      << "console holds " << console.contents().size() << " bytes";
  ASSERT_EQ(s.tail().size(), 2u);
  EXPECT_EQ(s.tail()[0].size(), line.size());
}

// A progress bar that redraws itself (tqdm: "\r" and the bar, flushed): each redraw reaches
// the console as it arrives, prefixed again after its carriage return, in one write.
TEST(OutputStream, ARedrawingProgressBarReachesTheConsoleAsItArrives) {
  CaptureFd console;
  OutputStream s("[default0]:", console.fd(), -1, 3);
  s.write("\r  0%|          |");
  EXPECT_EQ(console.contents(), "[default0]:  0%|          |");
  s.write("\r 50%|#####     |");
  EXPECT_EQ(console.contents(), "[default0]:  0%|          |\r[default0]: 50%|#####     |");
  s.write("\r100%|##########|\ndone\n");
  EXPECT_EQ(console.contents(),
            "[default0]:  0%|          |\r[default0]: 50%|#####     |\r[default0]:100%|##########|"
            "\n[default0]:done\n");
  // The tail keeps what the line showed at its end.
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"100%|##########|", "done"}));
}

TEST(OutputStream, TextBeforeTheFirstCarriageReturnIsShownWithIt) {
  CaptureFd console, file;
  OutputStream s("[p]:", console.fd(), file.dup(), 2);
  s.write("epoch 1: 10%");
  EXPECT_EQ(console.contents(), "") << "no carriage return yet: an ordinary partial line";
  s.write("\repoch 1: 20");
  s.write("%");
  EXPECT_EQ(console.contents(), "[p]:epoch 1: 10%\r[p]:epoch 1: 20%");
  s.close();
  EXPECT_EQ(console.contents(), "[p]:epoch 1: 10%\r[p]:epoch 1: 20%\n");
  EXPECT_EQ(file.contents(), "epoch 1: 10%\repoch 1: 20%");  // the log file: raw bytes
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"epoch 1: 20%"}));
}

// "\r\n" ends a line as before, also when a read splits it; the '\r' stays in the line.
TEST(OutputStream, CarriageReturnNewlineIsAnOrdinaryLineEnd) {
  CaptureFd console;
  OutputStream s("[p]:", console.fd(), -1, 3);
  s.write("a\r\nb\r");
  EXPECT_EQ(console.contents(), "[p]:a\r\n");
  s.write("\nc\r");
  s.write("\n");
  EXPECT_EQ(console.contents(), "[p]:a\r\n[p]:b\r\n[p]:c\r\n");
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"a\r", "b\r", "c\r"}));
  // A '\r' that ends a read and is followed by text is a redraw.
  s.write("x\r");
  s.write("y\n");
  EXPECT_EQ(console.contents(), "[p]:a\r\n[p]:b\r\n[p]:c\r\n[p]:x\r[p]:y\n");
}

// One console for two streams (a terminal for stdout and stderr): a line that comes while the
// other stream's bar is drawn starts a line of its own, and the bar is drawn again below it,
// as tqdm.write does; a redraw of the other stream goes over the line.
TEST(OutputStream, ALineWhileAnotherStreamsBarIsDrawnGetsALineOfItsOwn) {
  CaptureFd console;
  OutputStream bar("[default0]:", console.fd(), -1, 0);
  OutputStream out("[default0]:", console.fd(), -1, 0);
  bar.write("\r 10%");
  out.write("loss 0.5\n");
  bar.write("\r 20%");
  bar.write(" more");
  EXPECT_EQ(console.contents(), "[default0]: 10%\n[default0]:loss 0.5\n\r[default0]: 20% more");
  out.write("loss 0.4");  // a partial line: not on the console yet
  bar.write("!");
  out.write("\n");
  bar.write("\n");
  EXPECT_EQ(console.contents(),
            "[default0]: 10%\n[default0]:loss 0.5\n\r[default0]: 20% more!\n[default0]:loss 0.4\n");
  // Continuing after another stream wrote: on a new line, prefixed.
  bar.write("\r 30%");
  out.write("x\n");
  bar.write("...");
  bar.close();
  EXPECT_EQ(console.contents(),
            "[default0]: 10%\n[default0]:loss 0.5\n\r[default0]: 20% more!\n[default0]:loss 0.4\n"
            "[default0]: 30%\n[default0]:x\n[default0]:...\n");
}

TEST(OutputStream, TailKeepsTheLastLinesWithAPartialOne) {
  OutputStream s("[p]:", -1, -1, 3);
  for (int i = 0; i < 10; ++i) s.write("line " + std::to_string(i) + "\n");
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"line 7", "line 8", "line 9"}));
  // A trailing partial line counts as the newest line, and the window stays 3 long.
  s.write("partial");
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"line 8", "line 9", "partial"}));
}

TEST(OutputStream, TailOfZeroKeepsNothing) {
  OutputStream s("[p]:", -1, -1, 0);
  s.write("a\nb\n");
  EXPECT_TRUE(s.tail().empty());
}

TEST(OutputStream, CloseFlushesAPartialLineWithANewline) {
  CaptureFd console, file;
  OutputStream s("[default1]:", console.fd(), file.dup(), 5);
  s.write("done\nno newline at the end");
  EXPECT_EQ(console.contents(), "[default1]:done\n");
  s.close();
  EXPECT_EQ(console.contents(), "[default1]:done\n[default1]:no newline at the end\n");
  // The log file keeps the raw bytes: no prefix, and no newline made up.
  EXPECT_EQ(file.contents(), "done\nno newline at the end");
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"done", "no newline at the end"}));
  s.close();  // twice is harmless and prints nothing more
  EXPECT_EQ(console.contents(), "[default1]:done\n[default1]:no newline at the end\n");
}

TEST(OutputStream, FileGetsRawBytesWhenConsoleIsOff) {
  CaptureFd file;
  OutputStream s("[default0]:", -1, file.dup(), 2);
  s.write("a\nb");
  s.write("c\n");
  s.close();
  EXPECT_EQ(file.contents(), "a\nbc\n");
  EXPECT_EQ(s.tail(), (std::deque<std::string>{"a", "bc"}));
}

TEST(OutputStream, MovedStreamKeepsWriting) {
  // The agent keeps streams in std::optional inside a vector that may move them.
  CaptureFd console, file;
  OutputStream a("[p]:", console.fd(), file.dup(), 1);
  a.write("x");
  OutputStream b(std::move(a));
  b.write("y\n");
  b.close();
  EXPECT_EQ(console.contents(), "[p]:xy\n");
  EXPECT_EQ(file.contents(), "xy\n");
}

TEST(OutputStream, FilteredLogGetsTheConsolesMatchingLinesOfEveryStream) {
  CaptureFd console;
  const auto path = std::filesystem::temp_directory_path() /
                    ("dtrain-filtered-" + std::to_string(::getpid()) + ".log");
  auto filtered =
      std::make_shared<launch::FilteredLog>(path.string(), std::vector<std::string>{"loss", "acc"});
  OutputStream shown("[r0]:", console.fd(), -1, 0, filtered);
  OutputStream hidden("[r1]:", -1, -1, 0, filtered);  // not on the console: not filtered
  shown.write("step 1 loss 0.5\nstep 1 lr 0.1\nval acc");
  hidden.write("step 1 loss 0.7\n");
  shown.close();  // the partial last line counts once it is flushed
  hidden.close();
  filtered.reset();
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}),
            "[r0]:step 1 loss 0.5\n[r0]:val acc\n");
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------------------------------
// launch::layout and launch::rendezvous

TEST(Layout, RanksFollowNodeOrderWithUnevenNodes) {
  std::vector<launch::NodeInfo> nodes = {{"a", 2, 10}, {"b", 1, 11}, {"c", 3, 12}};
  const int offsets[] = {0, 2, 3};
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    launch::RendezvousResult r = launch::layout(4, k, nodes);
    EXPECT_EQ(r.round, 4);
    EXPECT_EQ(r.node_rank, k);
    EXPECT_EQ(r.nnodes, 3);
    EXPECT_EQ(r.world_size, 6);
    EXPECT_EQ(r.rank_offset, offsets[k]);
    ASSERT_EQ(r.nodes.size(), 3u);
    EXPECT_EQ(r.nodes[k].host, nodes[k].host);
  }
}

TEST(Layout, SingleNode) {
  launch::RendezvousResult r = launch::layout(0, 0, {{"h", 4, 1}});
  EXPECT_EQ(r.rank_offset, 0);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.nnodes, 1);
}

TEST(Layout, NodeRankOutsideTheNodesIsABug) {
  EXPECT_THROW(launch::layout(0, 2, {{"a", 1, 1}, {"b", 1, 2}}), InternalError);
  EXPECT_THROW(launch::layout(0, -1, {{"a", 1, 1}}), InternalError);
}

TEST(Layout, RoundPrefix) { EXPECT_EQ(launch::round_prefix("job", 2), "/dtrain/job/round_2/"); }

class RendezvousTest : public ::testing::Test {
 protected:
  std::unique_ptr<store::StoreClient> client() {
    store::StoreClient::Options o;
    o.connect_timeout = 5s;
    o.timeout = 10s;
    return store::StoreClient::connect("127.0.0.1", server_->port(), o);
  }
  // Joins from a thread with its own connection (clients are not thread-safe).
  std::future<launch::RendezvousResult> join(int node_rank, int nnodes, int nproc,
                                             const std::string& host,
                                             std::chrono::milliseconds timeout = 10s) {
    return std::async(std::launch::async, [=, this] {
      auto c = client();
      return launch::rendezvous(*c, "job", 0, node_rank, nnodes, {host, nproc, 100 + nproc},
                                timeout);
    });
  }
  std::unique_ptr<store::StoreServer> server_ = store::StoreServer::start({"127.0.0.1", 0});
};

TEST_F(RendezvousTest, StaticRanksLayOutByNodeNotJoinOrder) {
  auto n2 = join(2, 3, 1, "h2");
  auto n1 = join(1, 3, 3, "h1");
  auto n0 = join(0, 3, 2, "h0");
  launch::RendezvousResult r0 = n0.get(), r1 = n1.get(), r2 = n2.get();
  EXPECT_EQ(r0.rank_offset, 0);
  EXPECT_EQ(r1.rank_offset, 2);
  EXPECT_EQ(r2.rank_offset, 5);
  for (auto* r : {&r0, &r1, &r2}) {
    EXPECT_EQ(r->world_size, 6);
    ASSERT_EQ(r->nodes.size(), 3u);
    EXPECT_EQ(r->nodes[1].host, "h1");
    EXPECT_EQ(r->nodes[1].nproc, 3);
  }
}

TEST_F(RendezvousTest, C10dHandsOutDistinctRanks) {
  std::vector<std::future<launch::RendezvousResult>> joins;
  for (int i = 0; i < 3; ++i)
    joins.push_back(join(-1, 3, 1,
                         std::string("h").append(std::to_string(
                             i))));  // not "h" + ...: GCC 12 -Wrestrict false positive
  std::set<int> ranks;
  for (auto& f : joins) ranks.insert(f.get().node_rank);
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

TEST_F(RendezvousTest, C10dRefusesOneAgentTooMany) {
  auto a = join(-1, 1, 1, "a");
  a.get();
  auto c = client();
  try {
    launch::rendezvous(*c, "job", 0, -1, 1, {"b", 1, 2}, 1s);
    FAIL() << "a second agent joined a one-node job";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--nnodes is 1"), std::string::npos) << e.what();
  }
}

TEST_F(RendezvousTest, DuplicateNodeRankNamesTheHolder) {
  auto first = client();
  // Claim node 0 of a two-node job; the join itself waits for node 1, so run it aside.
  auto holder = std::async(std::launch::async, [&] {
    return launch::rendezvous(*first, "job", 0, 0, 2, {"first-host", 1, 1}, 2s);
  });
  auto c = client();
  // Until the holder's claim lands, our claim could win instead: retry briefly.
  auto deadline = std::chrono::steady_clock::now() + 5s;
  std::string msg;
  while (msg.empty() && std::chrono::steady_clock::now() < deadline) {
    if (!c->check({launch::round_prefix("job", 0) + "node_0"})) {
      std::this_thread::sleep_for(5ms);
      continue;
    }
    try {
      launch::rendezvous(*c, "job", 0, 0, 2, {"second-host", 1, 2}, 1s);
    } catch (const UsageError& e) {
      msg = e.what();
    }
  }
  EXPECT_NE(msg.find("node rank 0 was already taken by an agent on first-host"), std::string::npos)
      << msg;
  EXPECT_THROW(holder.get(), TimeoutError);  // node 1 never came
}

TEST_F(RendezvousTest, TimeoutNamesTheMissingNodeRanks) {
  auto c = client();
  auto start = std::chrono::steady_clock::now();
  try {
    launch::rendezvous(*c, "job", 0, 1, 4, {"h", 1, 1}, 300ms);
    FAIL() << "rendezvous of 4 nodes completed with one";
  } catch (const TimeoutError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("node rank(s) 0, 2, 3 of 4 never joined job 'job'"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("after 0.3 s"), std::string::npos) << msg;
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
}

}  // namespace
}  // namespace dtrain

// CUDA's rule for CUDA_VISIBLE_DEVICES, which --nproc-per-node gpu applies when it counts
// device files: the list ends at the first entry that is not a present device.
TEST(GpuCount, VisibleDevicesLimitTheCount) {
  EXPECT_EQ(dtrain::launch::visible_limit(nullptr, 4), -1);
  EXPECT_EQ(dtrain::launch::visible_limit("", 4), 0);
  EXPECT_EQ(dtrain::launch::visible_limit("-1", 4), 0);
  EXPECT_EQ(dtrain::launch::visible_limit("0,1", 4), 2);
  EXPECT_EQ(dtrain::launch::visible_limit("2, 3", 4), 2);
  EXPECT_EQ(dtrain::launch::visible_limit("0,7,1", 4),
            1);  // 7 is not a device: the list ends there
  EXPECT_EQ(dtrain::launch::visible_limit("0,1,2,3,0", 4), 4);
  EXPECT_EQ(dtrain::launch::visible_limit("GPU-8f2c,1", 2), 2);
  EXPECT_EQ(dtrain::launch::visible_limit("0", 0), 0);
}

// `dtrain deepspeed`'s hostfile and --include/--exclude, as DeepSpeed 0.19.8's runner.py
// parses them (the end-to-end comparison with the real launcher is
// tests/launcher/deepspeed_launcher_test.cpp).
std::string ds_usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::UsageError& e) {
    return e.what();
  }
  return "";
}

std::string ds_hosts(const std::vector<dtrain::launch::DsHost>& hosts) {
  std::string s;
  for (auto& h : hosts) {
    s += h.name + ":";
    for (int x : h.slots) s += std::to_string(x) + ",";
    s += " ";
  }
  return s;
}

TEST(DeepSpeedHostfile, CommentsBlankLinesAndTrailingTextAsDeepSpeed) {
  auto pool = dtrain::launch::parse_ds_hostfile(
      {"# pool", "", "  worker-0 slots=4  # first", "worker-1\tslots=2 max_slots=8"});
  ASSERT_EQ(pool.size(), 2u);
  EXPECT_EQ(pool[0], (std::pair<std::string, int>{"worker-0", 4}));
  EXPECT_EQ(pool[1], (std::pair<std::string, int>{"worker-1", 2}));
  EXPECT_EQ(ds_usage_error([] {
              dtrain::launch::parse_ds_hostfile({"a slots=1", "a slots=2"});
            }),
            "Hostfile contains multiple entries for a, unable to proceed with launching");
  EXPECT_EQ(ds_usage_error([] {
              dtrain::launch::parse_ds_hostfile({"# only", ""});
            }),
            "Hostfile is empty or not formatted correctly, unable to proceed with launching.");
  EXPECT_NE(ds_usage_error([] {
              dtrain::launch::parse_ds_hostfile({"a gpus=2"});
            }).find("Hostfile contains a bad entry: a gpus=2, unable to proceed"),
            std::string::npos);
}

TEST(DeepSpeedHostfile, IncludeAndExcludeFilterInHostfileOrder) {
  using dtrain::launch::ds_resource_filter;
  const std::vector<std::pair<std::string, int>> pool = {{"w0", 4}, {"w1", 2}, {"w2", 2}};
  EXPECT_EQ(ds_hosts(ds_resource_filter(pool, "", "")), "w0:0,1,2,3, w1:0,1, w2:0,1, ");
  // Hostfile order, not the filter's; a host named twice has its slots merged and sorted.
  EXPECT_EQ(ds_hosts(ds_resource_filter(pool, "w2@w0:3,1@w0:1", "")), "w0:1,3, w2:0,1, ");
  EXPECT_EQ(ds_hosts(ds_resource_filter(pool, "", "w1@w0:0")), "w0:1,2,3, w2:0,1, ");
  EXPECT_EQ(ds_usage_error([&] { ds_resource_filter(pool, "w9:0", ""); }),
            "Hostname 'w9' not found in hostfile (--include w9:0)");
  EXPECT_EQ(ds_usage_error([&] { ds_resource_filter(pool, "", "w1:2"); }),
            "No slot '2' specified on host 'w1' (its slots: 0,1)");
  EXPECT_NE(ds_usage_error([&] { ds_resource_filter(pool, "w0", "w1"); }), "");
}

namespace dtrain {

// A worker under DeepSpeed's launcher (launch.py sets LOCAL_SIZE, CROSS_RANK and CROSS_SIZE, not
// torchrun's LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE; deepspeed_launcher_test checks
// that against the real one) reads its node's layout from DeepSpeed's names; torchrun's win
// where both are set.
TEST(WorkerEnvContract, DeepSpeedsLauncherVariablesGiveTheNodeLayout) {
  test::ScopedEnv env;
  for (const char* n : {"LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"}) env.set(n, nullptr);
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_SIZE", "2");
  env.set("CROSS_RANK", "1");
  env.set("CROSS_SIZE", "2");
  auto e = WorkerEnv::from_environ();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 2);
  EXPECT_EQ(e->group_rank, 1);
  EXPECT_EQ(e->group_world_size, 2);
  env.set("LOCAL_WORLD_SIZE", "4");
  env.set("GROUP_RANK", "0");
  env.set("GROUP_WORLD_SIZE", "1");
  e = WorkerEnv::from_environ();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->local_world_size, 4);
  EXPECT_EQ(e->group_rank, 0);
  EXPECT_EQ(e->group_world_size, 1);
  env.set("LOCAL_WORLD_SIZE", nullptr);
  env.set("LOCAL_SIZE", "two");
  EXPECT_THROW(WorkerEnv::from_environ(), UsageError);
}

// A host-file job's agents get the core binding: each binds its own local ranks (it was dropped,
// so remote workers ran unbound while `dtrain run` said nothing).
TEST(SshAgentArgs, CoreBindingReachesEveryHostsAgent) {
  LaunchOptions o =
      parse({"--hosts", "h1:2,h2:2", "--bind-cores-to-rank", "--bind-core-list", "0-1,4"});
  const auto a = agent_args(o, 1);
  auto at = std::find(a.begin(), a.end(), "--bind-cores-to-rank");
  EXPECT_NE(at, a.end()) << ::testing::PrintToString(a);
  at = std::find(a.begin(), a.end(), "--bind-core-list");
  ASSERT_NE(at, a.end()) << ::testing::PrintToString(a);
  ASSERT_NE(at + 1, a.end());
  EXPECT_EQ(*(at + 1), "0,1,4");
  // Without the flag, neither is passed.
  const auto plain = agent_args(parse({"--hosts", "h1:2,h2:2"}), 1);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "--bind-cores-to-rank"), plain.end());
}

// torchrun's ${local_rank} macro: `dtrain run` substitutes it in the arguments (the remote
// agents, `dtrain run` too, do it for their own workers, so the arguments go as given); a
// launcher that does not substitute (horovodrun -H) sends them escaped, so they arrive as given.
TEST(SshAgentArgs, ArgumentsReachTheRemoteAgentForItToSubstituteOrEscaped) {
  LaunchOptions o = parse_run_args({"--hosts", "h1:2,h2:2", "prog", "a$$b", "${local_rank}"});
  EXPECT_TRUE(o.expand_local_rank);
  auto a = agent_args(o, 1);
  ASSERT_GE(a.size(), 3u);
  EXPECT_EQ(Args(a.end() - 3, a.end()), (Args{"prog", "a$$b", "${local_rank}"}));
  o.expand_local_rank = false;
  a = agent_args(o, 1);
  EXPECT_EQ(Args(a.end() - 3, a.end()), (Args{"prog", "a$$$$b", "$${local_rank}"}));
  EXPECT_EQ(launch::substitute_local_rank(Args(a.end() - 3, a.end()), 1),
            (Args{"prog", "a$$b", "${local_rank}"}));
  // Python's string.Template.safe_substitute, torchrun's: only local_rank is known.
  EXPECT_EQ(
      launch::substitute_local_rank({"python3", "-u", "t.py", "x${local_rank}", "$local_rank_",
                                     "${rank}", "$", "${local_rank", "$$local_rank", "$9"},
                                    3),
      (Args{"python3", "-u", "t.py", "x3", "$local_rank_", "${rank}", "$", "${local_rank",
            "$local_rank", "$9"}));
}

}  // namespace dtrain
