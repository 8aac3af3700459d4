// The Distributor's driver side: options and devices, the call's own store (arguments out,
// results and exceptions back), and run() in function and program mode. Its parts: code.cpp
// (the function by build id and offset), launcher_job.cpp (the job's command on its engine),
// root_cause.cpp (what a failed job reports), worker.cpp (the worker side, dtrain::init).
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "core/owned_dir.h"
#include "core/params.h"
#include "distributor/internal.h"
#include "dtrain/distributor.h"
#include "dtrain/store.h"
#include "launch/string_template.h"

namespace dtrain {

using distributor::attempt_prefix;
using distributor::Job;
using distributor::kTaskVariable;
using distributor::Outcome;
using json = nlohmann::json;

namespace detail {

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

std::vector<std::string> Distributor::run_function(const void* fn, const void* trampoline,
                                                   std::string args, bool all_ranks) {
  if (distributor::in_worker()) {
    throw UsageError(
        "Distributor::run was called inside a Distributor worker; nested runs are "
        "not supported: run the inner work in the same workers instead");
  }
  if (const char* task = std::getenv(kTaskVariable)) distributor::fail_uninitialised_worker(task);
  const std::vector<std::string> self_args = distributor::init_argv();
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
  const std::string run_id = distributor::unique_id();
  const std::string prefix = "/distributor/" + run_id + "/";
  client->set(prefix + "call", json{{"fn", distributor::to_json(fn_ref)},
                                    {"trampoline", distributor::to_json(tramp_ref)},
                                    {"all_ranks", all_ranks}}
                                   .dump());
  client->set(prefix + "args", args);
  std::string().swap(args);

  detail::OwnedTempDir tmp(distributor::kTempDirStem);
  const std::string failure_file = tmp.path() + "/failure.json";
  const std::string task = addr + ":" + std::to_string(server->port()) + ":" + run_id;
  const bool agents = engines::for_job(options_).runs_agents();
  Job job = distributor::make_job(options_, engines::Placement{nproc_per_node_, hosts_, elastic_},
                                  run_id, failure_file, cuda_visible_devices_, task);
  if (agents) job.argv.push_back("--no-python");
  job.argv.push_back(distributor::self_executable());
  // `dtrain run` substitutes torchrun's ${local_rank} in a program's arguments; the workers
  // re-execute this program with its own, as they are.
  for (auto a = self_args.begin() + 1; a != self_args.end(); ++a)
    job.argv.push_back(agents ? launch::escape_substitution(*a) : *a);
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

  Outcome out = distributor::run_launcher(job, failure_file, options_);
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
  if (out.timed_out || out.exit_code != 0) {
    // An elastic job's rounds also go up when nodes join or leave (not counted as restarts).
    const int last = options_.max_restarts + (elastic_.elastic ? 2 * elastic_.max_nodes : 0);
    distributor::throw_call_failure(std::move(out), *client, prefix, last, options_);
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
  if (std::getenv(kTaskVariable) && !distributor::in_worker())
    distributor::fail_uninitialised_worker(std::getenv(kTaskVariable));
  if (program.empty())
    throw UsageError("Distributor::run: the program is empty; give a path or a name on PATH");
  detail::OwnedTempDir tmp(distributor::kTempDirStem);
  const std::string failure_file = tmp.path() + "/failure.json";
  const bool agents = engines::for_job(options_).runs_agents();
  Job job =
      distributor::make_job(options_, engines::Placement{nproc_per_node_, hosts_, elastic_},
                            distributor::unique_id(), failure_file, cuda_visible_devices_, "");
  if (program[0] == '-') {
    throw UsageError("Distributor::run('" + program +
                     "'): a program name cannot start with '-'; "
                     "use ./" +
                     program);
  }
  if (!agents && program.size() > 3 && program.ends_with(".py")) {
    // What the launcher does for a .py: the MPI launcher would execute the script itself.
    job.argv.insert(job.argv.end(), {param::kPython.get(), "-u"});
  }
  job.argv.push_back(program);
  job.argv.insert(job.argv.end(), args.begin(), args.end());
  Outcome out = distributor::run_launcher(job, failure_file, options_);
  if (out.exit_code == 2 && !out.failure && !out.timed_out && agents) {
    throw UsageError("Distributor::run('" + program +
                     "'): the launcher rejected the job (exit code 2; its message is above on "
                     "stderr): is the program path right and executable?");
  }
  if (out.timed_out || out.exit_code != 0) distributor::throw_failure(out, options_, std::nullopt);
}

}  // namespace dtrain
