// The `dtrain` command.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/engine_env.h"
#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "dtrain/spark.h"
#include "dtrain/version.h"
#include "dtrain/zero_config.h"
#include "horovod/horovodrun.h"
#include "launch/deepspeed_cli.h"
#include "launch/failure.h"
#include "launch/options_internal.h"
#include "ray/ray_driver.h"
#include "tracking/job_outcome.h"
#include "tune/warm_hosts.h"

extern char** environ;

namespace {

// An agent of a multi-node Slurm step that fails before it joins the job (a bad flag, a
// missing interface on this node) would leave the other nodes' agents waiting for it until
// the rendezvous timeout. Slurm's own cancel ends the step on every node at once instead.
void cancel_slurm_step(const dtrain::RunArgs& a) {
  if (a.no_slurm || !a.hostfile.empty() || !a.host_list.empty() || !a.nnodes.empty()) return;
  std::optional<dtrain::SlurmStep> step;
  try {
    step = dtrain::slurm_step();
  } catch (const std::exception&) {
    return;
  }
  if (!step || step->nnodes < 2) return;
  const std::string id = step->job_id + "." + step->step_id;
  std::cerr << "dtrain run: cancelling Slurm step " << id << " on every node (scancel)\n";
  std::vector<std::string> args = {"scancel", "--quiet", id};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawnp(&pid, "scancel", nullptr, nullptr, argv.data(), environ) != 0) {
    std::cerr << "dtrain run: cannot run scancel; cancel the step yourself: scancel " << id << "\n";
    return;
  }
  // scancel answers within Slurm's MessageTimeout; wait at most 15 s for it.
  for (int i = 0; i < 1500; ++i) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return;
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

const char* getenv_(const char* name) { return std::getenv(name); }

}  // namespace

int main(int argc, char** argv) {
  // `dtrain zero ...`: ZeRO config checks and checkpoint tools (src/zero/cli.cpp).
  if (argc >= 2 && std::string(argv[1]) == "zero")
    return dtrain::zero::zero_main({argv + 2, argv + argc});
  // `dtrain horovodrun ...` and its worker shim (src/horovod/horovodrun.cpp).
  if (argc >= 2 && std::string(argv[1]) == "horovodrun")
    return dtrain::hvd::horovodrun_main({argv + 2, argv + argc});
  if (argc >= 2 && std::string(argv[1]) == "horovod-exec")
    return dtrain::hvd::horovod_exec_main({argv + 2, argv + argc});
  // `dtrain deepspeed ...` (DeepSpeed's launcher) and its worker shim
  // (src/launch/deepspeed_cli.cpp).
  if (argc >= 2 && std::string(argv[1]) == "deepspeed")
    return dtrain::launch::deepspeed_main({argv + 2, argv + argc});
  if (argc >= 2 && std::string(argv[1]) == "deepspeed-exec")
    return dtrain::launch::deepspeed_exec_main({argv + 2, argv + argc});
  // A Tune search's warm fork server on this host, kept by its driver over ssh
  // (src/tune/warm_hosts.h).
  if (argc >= 2 && std::string(argv[1]) == "tune-warm-host")
    return dtrain::tune::detail::warm_host_main();
  // torchrun's abbreviated flags (`--nnode 2`), spelled out before anything reads the flags
  // (CLI11 knows no abbreviations).
  std::vector<std::string> spelled(argv, argv + argc);
  std::vector<std::string> empty_flags;  // `--FLAG=` taken out, applied after parsing
  // `dtrain launch`: `python -m torch.distributed.launch`, which is torchrun with --use-env
  // (below); read as `dtrain run` with that flag.
  const bool legacy_launch = argc >= 2 && spelled[1] == "launch";
  if (legacy_launch) spelled[1] = "run";
  const std::string command = legacy_launch ? "dtrain launch" : "dtrain run";
  if (argc >= 2 && spelled[1] == "run") {
    auto dashes = std::find(spelled.begin() + 2, spelled.end(), "--");
    try {
      auto run_part = dtrain::spell_out_abbreviations(
          {spelled.begin() + 2, dashes},
          [legacy_launch](CLI::App& app) {
            // The flags `dtrain run` takes beside add_run_options' (here and on the Spark and
            // Ray routes below), so that an abbreviation after them is spelled out too.
            for (const char* f :
                 {"--mlflow-run-id", "--spark-master", "--spark-conf", "--spark-submit",
                  "--spark-slot-timeout", "--ray-address", "--ray-strategy", "--ray-cpus",
                  "--ray-gpus", "--ray-placement-timeout", "--ray-python"})
              app.add_option(f, [](const std::vector<std::string>&) { return true; });
            if (legacy_launch) app.add_flag("--use-env,--use_env");
          },
          legacy_launch ? std::vector<std::string>{"--use-env", "--use_env"}
                        : std::vector<std::string>{});
      // torchrun's `--FLAG=` (argparse's empty string): stops, or goes on meaning "".
      empty_flags = dtrain::take_empty_values(run_part);
      spelled.erase(spelled.begin() + 2, dashes);
      spelled.insert(spelled.begin() + 2, run_part.begin(), run_part.end());
    } catch (const dtrain::UsageError& e) {
      std::cerr << command << ": error: " << e.what() << "\nRun '" << command
                << " --help' for the flags.\n";
      return 2;
    }
  }
  std::vector<char*> spelled_argv;
  for (auto& a : spelled) spelled_argv.push_back(a.data());
  spelled_argv.push_back(nullptr);
  argv = spelled_argv.data();
  argc = static_cast<int>(spelled.size());  // less the `--FLAG=` taken out
  try {
    // `dtrain run --spark-master URL ...`, `dtrain run --ray-address ADDR ...`: the agents on the
    // cluster run the same command, `dtrain launch` for `dtrain launch` (its --use-env and
    // --local-rank=N are theirs to apply).
    std::string launch_word = "launch";
    std::vector<char*> routed_argv(argv, argv + argc);
    if (legacy_launch) routed_argv[1] = launch_word.data();
    dtrain::spark::exec_cli_if_requested(argc, routed_argv.data());
    dtrain::ray::exec_cli_if_requested(argc, routed_argv.data());
  } catch (const dtrain::UsageError& e) {
    // Their messages may name the command already.
    const std::string what = e.what();
    std::cerr << (what.rfind("dtrain ", 0) == 0 ? "" : command + ": ") << what << "\n";
    return 2;
  }
  if (argc >= 2 && argv[1][0] != '-' && std::string(argv[1]) != "run") {
    std::cerr << "dtrain: error: unknown command '" << argv[1]
              << "'; the commands are run, launch, zero, horovodrun and deepspeed.\nRun 'dtrain "
                 "--help' or 'dtrain run --help'.\n";
    return 2;
  }
  CLI::App app{"dtrain: distributed training for libtorch C++ (and unchanged PyTorch scripts)"};
  app.require_subcommand(1);
  // One version for the library, the packages and this command (<dtrain/version.h>).
  app.set_version_flag("--version", std::string("dtrain ") + DTRAIN_VERSION +
                                        " (library built against libtorch " +
                                        DTRAIN_BUILT_WITH_LIBTORCH + ")");
  app.footer(
      "Run 'dtrain run --help' for the launcher's flags; 'dtrain zero --help' for ZeRO configs and "
      "checkpoints; 'dtrain deepspeed --help' and 'dtrain horovodrun --help' for DeepSpeed's and "
      "Horovod's launchers. 'dtrain launch' is torch.distributed.launch: `dtrain run` with its "
      "--use-env, and without it each worker's --local-rank=N before PROGRAM's arguments.");
  dtrain::RunArgs run_args;
  bool had_dashes = false;
  std::vector<std::string> after_dashes;
  CLI::App* run =
      app.add_subcommand("run", "Launch PROGRAM on N worker processes (torchrun-compatible)");
  dtrain::add_run_options(*run, run_args);
  bool use_env = false;
  if (legacy_launch) {
    run->add_flag("--use-env,--use_env", use_env,
                  "dtrain launch (torch.distributed.launch): workers read LOCAL_RANK from the "
                  "environment; without it each gets --local-rank=N before PROGRAM's arguments");
  }
  std::string mlflow_run_id;
  run->add_option(
      "--mlflow-run-id", mlflow_run_id,
      "MLflow run (at MLFLOW_TRACKING_URI) to continue and tag with the job's outcome; default: "
      "MLFLOW_RUN_ID when set");
  try {
    // CLI11 rejects a "--" before PROGRAM under a subcommand (`dtrain run -- prog`), so
    // parse only what precedes the first "--". Options end at PROGRAM (prefix_command), so
    // this parses the same options; what follows "--" is PROGRAM and its arguments, or, when
    // PROGRAM came before it, more of PROGRAM's arguments.
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--") {
        had_dashes = true;
        after_dashes.assign(argv + i + 1, argv + argc);
        argc = i;
        break;
      }
    }
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "dtrain: error: "
              << dtrain::name_env_source(e.what(), {argv, argv + argc}, getenv_)
              << "\nRun 'dtrain --help' or 'dtrain run --help'.\n";
    return 2;
  }
  dtrain::LaunchOptions options;
  std::vector<std::string> rest = run->remaining();
  // The options: what came before PROGRAM (argv[0] is dtrain, then the parsed part); PROGRAM's
  // own arguments may look like flags and say nothing of where a bad value came from.
  const std::vector<std::string> flags(
      argv + 1, argv + std::max<int>(1, argc - static_cast<int>(rest.size())));
  try {
    // Errors here come from the flags and the Slurm step's variables, the same on every node
    // of a step: every agent fails alike, and nobody waits for anybody.
    dtrain::refuse_empty_values(flags);
    dtrain::apply_empty_pet_variables(run_args, flags, getenv_);
    dtrain::apply_empty_values(run_args, empty_flags);
    if (had_dashes) {
      // Before PROGRAM (rest empty) run_args_to_options skips it; after, it is an argument.
      rest.push_back("--");
      rest.insert(rest.end(), after_dashes.begin(), after_dashes.end());
    }
    options = dtrain::run_args_to_options(run_args, rest);
    options.expand_local_rank = true;  // torchrun's ${local_rank} in PROGRAM's arguments
    if (legacy_launch) {
      // torch.distributed.launch's legacy default, its words.
      if (!use_env && options.no_python)
        throw dtrain::UsageError(
            "When using the '--no-python' flag, you must also set the '--use-env' flag.");
      if (!use_env) options.args.insert(options.args.begin(), "--local-rank=${local_rank}");
      std::cerr << "dtrain launch: note: torch.distributed.launch is deprecated in PyTorch; "
                   "`dtrain run` (torchrun) sets LOCAL_RANK and passes no --local-rank\n";
    }
    for (const auto& note : options.notes) std::cerr << command << ": note: " << note << "\n";
  } catch (const dtrain::UsageError& e) {
    std::cerr << command << ": error: " << dtrain::name_env_source(e.what(), flags, getenv_)
              << "\nRun '" << command << " --help' for the flags.\n";
    dtrain::launch::record_launcher_error(e);
    return 2;
  }
  try {
    dtrain::tracking::JobOutcome outcome(options,
                                         mlflow_run_id);  // MLflow: the run gets the job's outcome
    int rc = dtrain::run_launch(std::move(options));
    outcome.report(rc);
    return rc;
  } catch (const dtrain::UsageError& e) {
    std::cerr << command << ": error: " << e.what() << "\nRun '" << command
              << " --help' for the flags.\n";
    dtrain::launch::record_launcher_error(e);
    cancel_slurm_step(run_args);
    return 2;
  } catch (const std::exception& e) {
    std::cerr << command << ": error: " << e.what() << "\n";
    dtrain::launch::record_launcher_error(e);
    cancel_slurm_step(run_args);
    return 1;
  }
}
