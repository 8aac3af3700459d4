// The `dtrain` command.
#include <CLI/CLI.hpp>
#include <iostream>

#include "dtrain/error.h"
#include "dtrain/launch.h"
#include "launch/options_internal.h"

int main(int argc, char** argv) {
  CLI::App app{"dtrain: distributed training for libtorch C++ (and unchanged PyTorch scripts)"};
  app.require_subcommand(1);
  app.footer("Run 'dtrain run --help' for the launcher's flags.");
  dtrain::RunArgs run_args;
  CLI::App* run = app.add_subcommand("run", "Launch PROGRAM on N worker processes (torchrun-compatible)");
  dtrain::add_run_options(*run, run_args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "dtrain: error: " << e.what() << "\nRun 'dtrain --help' or 'dtrain run --help'.\n";
    return 2;
  }
  try {
    dtrain::LaunchOptions options = dtrain::run_args_to_options(run_args, run->remaining());
    return dtrain::run_launch(std::move(options));
  } catch (const dtrain::UsageError& e) {
    std::cerr << "dtrain run: error: " << e.what() << "\nRun 'dtrain run --help' for the flags.\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain run: error: " << e.what() << "\n";
    return 1;
  }
}
