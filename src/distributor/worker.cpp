// The Distributor's worker side: dtrain::init() in a process the Distributor started finds
// the call in the driver's store, runs the function, and sends its result or exception back.
#include <cxxabi.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <mutex>

#include "distributor/internal.h"
#include "dtrain/engine_env.h"
#include "dtrain/env.h"
#include "dtrain/process_group.h"

namespace dtrain {
namespace distributor {
namespace {

std::mutex g_argv_mutex;
std::vector<std::string> g_argv;  // set by init(); empty: init() was never called
bool g_in_worker = false;         // true while a worker runs the user's function

}  // namespace

std::vector<std::string> init_argv() {
  std::lock_guard<std::mutex> lock(g_argv_mutex);
  return g_argv;
}

bool in_worker() { return g_in_worker; }

// In a worker whose main() did not call init(): tell the driver why, and stop.
void fail_uninitialised_worker(const char* task) {
  const std::string message =
      "this program was started as a Distributor worker, but main() reached a Distributor "
      "without calling dtrain::init(argc, argv) first; add `dtrain::init(argc, argv);` as the "
      "first line of main()";
  std::cerr << "dtrain: " << message << std::endl;
  try {
    if (auto t = parse_task(task)) {
      auto client =
          store::StoreClient::connect(t->host, static_cast<std::uint16_t>(t->port),
                                      {std::chrono::seconds(10), std::chrono::seconds(10)});
      auto env = WorkerEnv::from_environ();
      if (!env) env = engine_worker_env();
      const std::string error = json{
          {"rank", env ? env->rank : 0},
          {"type", "dtrain::UsageError"},
          {"message", message}}.dump();
      const std::string p = attempt_prefix(t->prefix(), env ? env->restart_count : 0);
      client->compare_set(p + "first_error", "", error);
    }
  } catch (const std::exception&) {
  }
  std::fflush(nullptr);
  ::_exit(2);
}

namespace {

int worker_main(const std::string& spec) {
  auto task = parse_task(spec);
  if (!task) {
    std::cerr << "dtrain: " << kTaskVariable << "='" << spec
              << "' is malformed (expected HOST:PORT:ID); it is set by the Distributor only"
              << std::endl;
    return 2;
  }
  const std::string prefix = task->prefix();
  auto env = WorkerEnv::from_environ();
  if (!env) env = engine_worker_env();  // started by mpirun/srun directly
  const int rank = env ? env->rank : 0;
  const std::string attempt = attempt_prefix(prefix, env ? env->restart_count : 0);
  auto client = store::StoreClient::connect(task->host, static_cast<std::uint16_t>(task->port),
                                            {std::chrono::seconds(60), std::chrono::seconds(60)});
  auto report = [&](const std::string& type, const std::string& message) {
    std::cerr << "dtrain: rank " << rank << ": the function threw " << type << ": " << message
              << std::endl;
    try {
      // The first report of this attempt wins; compare_set answers, so it has been applied
      // before this process exits.
      client->compare_set(attempt + "first_error", "",
                          json{{"rank", rank}, {"type", type}, {"message", message}}.dump());
    } catch (const std::exception&) {
    }
  };

  const json call = json::parse(client->get(prefix + "call"));
  void* fn = nullptr;
  detail::Trampoline trampoline = nullptr;
  try {
    fn = resolve_code(code_ref_from_json(call.at("fn")));
    trampoline = reinterpret_cast<detail::Trampoline>(
        resolve_code(code_ref_from_json(call.at("trampoline"))));
  } catch (const UsageError& e) {
    report("dtrain::UsageError", e.what());
    return 2;
  }
  const bool all_ranks = call.at("all_ranks").get<bool>();
  std::string args = client->get(prefix + "args");
  Encoder result;
  g_in_worker = true;
  try {
    Decoder in(args);
    trampoline(fn, in, result);
  } catch (const std::exception& e) {
    const std::string type = demangle(typeid(e).name());
    // dtrain::tune::report()'s TrialStopped: the Tuner ended this run (a scheduler's STOP, or
    // PBT's PAUSE to free the slot). Not a failure: exit 0 without a result, so the launcher
    // prints no root cause; the Tuner knows why the run ended.
    if (type == "dtrain::tune::TrialStopped") return 0;
    report(type, e.what());
    return 1;
  } catch (...) {
    auto* type = abi::__cxa_current_exception_type();
    report(type ? demangle(type->name()) : "an unknown exception", "(not a std::exception)");
    return 1;
  }
  std::string().swap(args);
  // A group the function left behind: leave it cleanly (peers are done too).
  try {
    destroy_process_group();
  } catch (const std::exception&) {
  }
  // Results are kept per attempt (an elastic job's last attempt may have fewer ranks than
  // an earlier one, whose results must not mix in). Rank 0 names the attempt it finished in
  // and its world size; attempts run one after another, so the last one written is the last's.
  if (rank == 0 || all_ranks) {
    const std::string key = attempt + "result/" + std::to_string(rank);
    client->set(key, result.take());
    if (rank == 0) {
      client->set(prefix + "finished", json{{"attempt", env ? env->restart_count : 0},
                                            {"world_size", env ? env->world_size : 1}}
                                           .dump());
    }
  }
  // ADD answers, so everything set before it on this connection has been applied before we
  // exit (and before the driver looks).
  client->add(attempt + "done", 1);
  return 0;
}

}  // namespace
}  // namespace distributor

void init(int argc, char** argv) {
  using namespace distributor;
  {
    std::lock_guard<std::mutex> lock(g_argv_mutex);
    g_argv.assign(argv, argv + argc);
    if (g_argv.empty()) g_argv.emplace_back("program");
  }
  const char* value = std::getenv(kTaskVariable);
  if (value == nullptr) return;
  // Not inherited by anything the function starts (which could take itself for a worker).
  const std::string task = value;
  ::unsetenv(kTaskVariable);
  int code = 1;
  try {
    code = worker_main(task);
  } catch (const std::exception& e) {
    std::cerr << "dtrain: Distributor worker: " << e.what() << std::endl;
    code = 1;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  // Skip static destructors: libtorch's at exit can race its own threads; the work is done.
  ::_exit(code);
}

}  // namespace dtrain
