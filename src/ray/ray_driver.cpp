// Engine "ray", its Ray side: placement and the commands of python/dtrain/ray.py (see
// ray_driver.h).
#include "ray/ray_driver.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/driver_service.h"
#include "core/params.h"
#include "core/paths.h"
#include "dtrain/error.h"

namespace dtrain::ray {

namespace {

detail::DriverService g_driver("ray");

constexpr int kNoResources = 76;  // python/dtrain/ray.py's NO_RESOURCES

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::vector<std::string> job_flags(const Plan& p, const Driver& d) {
  std::vector<std::string> f = {"--bundles",
                                std::to_string(p.bundles),
                                "--per-bundle",
                                std::to_string(p.per_bundle),
                                "--cpus",
                                number(p.cpus),
                                "--gpus",
                                number(p.gpus),
                                "--strategy",
                                p.strategy,
                                "--placement-timeout",
                                std::to_string(d.placement_timeout.count()),
                                "--term-timeout",
                                number(d.term_timeout.count() / 1000.0)};
  if (!d.driver_host.empty()) f.insert(f.end(), {"--driver-host", d.driver_host});
  f.push_back("--");
  return f;
}

std::string kept_socket(const Driver& d, std::chrono::seconds idle_timeout,
                        std::chrono::seconds start_timeout) {
  detail::DriverService::Start start;
  start.argv = {d.python, "-u", detail::python_script("ray.py", param::kRayScript)};
  start.extra = {"--address", d.address, "--idle-timeout", std::to_string(idle_timeout.count())};
  start.timeout = start_timeout;
  start.what = "the Ray driver (" + d.python + " ray.py --serve --address " + d.address + ")";
  start.hint =
      "Check the address (ray status --address " + d.address + " on a cluster node) and that " +
      d.python +
      " has the cluster's ray version, or set ClusterOptions::ray.keep_driver = false to connect "
      "for each run() on its own";
  return g_driver.ensure(d.address + '\n' + d.python, start);
}

}  // namespace

Plan plan(int num_processes, bool use_gpu, int processes_per_bundle, double cpus_per_process,
          double gpus_per_process, const std::string& strategy) {
  if (num_processes < 1) {
    throw UsageError("DistributorOptions::num_processes must be at least 1, got " +
                     std::to_string(num_processes));
  }
  if (processes_per_bundle < 1 || num_processes % processes_per_bundle != 0) {
    throw UsageError(
        "ClusterOptions::ray.processes_per_bundle is " + std::to_string(processes_per_bundle) +
        ": it must be >= 1 and divide num_processes (" + std::to_string(num_processes) +
        "); each bundle of the placement group runs that many workers on one node");
  }
  Plan p;
  p.bundles = num_processes / processes_per_bundle;
  p.per_bundle = processes_per_bundle;
  p.cpus = cpus_per_process;
  p.gpus = gpus_per_process < 0 ? (use_gpu ? 1.0 : 0.0) : gpus_per_process;
  if (!(p.cpus >= 0) || !(p.gpus >= 0) || !std::isfinite(p.cpus) || !std::isfinite(p.gpus) ||
      (p.cpus == 0 && p.gpus == 0)) {
    throw UsageError("ClusterOptions::ray.num_cpus_per_process (" + number(p.cpus) +
                     ") and num_gpus_per_process (" + number(p.gpus) +
                     ") must be >= 0, and not both 0: a placement group bundle must ask for "
                     "something");
  }
  if (use_gpu && p.gpus == 0) {
    throw UsageError(
        "DistributorOptions::use_gpu is set but ClusterOptions::ray.num_gpus_per_process is 0: "
        "give each process its GPU (1, the default with use_gpu) or turn use_gpu off");
  }
  if (strategy != "PACK" && strategy != "SPREAD" && strategy != "STRICT_PACK" &&
      strategy != "STRICT_SPREAD") {
    throw UsageError("ClusterOptions::ray.strategy is '" + strategy +
                     "': expected \"PACK\", \"SPREAD\", \"STRICT_PACK\" or \"STRICT_SPREAD\" "
                     "(Ray's placement group strategies)");
  }
  p.strategy = strategy;
  return p;
}

std::string address(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("RAY_ADDRESS"); env && *env) return env;
  throw UsageError(
      "engine \"ray\" needs the Ray cluster's address: set ClusterOptions::ray.address or "
      "RAY_ADDRESS (dtrain run: --ray-address) to the head's GCS address HOST:6379 (this "
      "machine a Ray node), ray://HOST:10001 (Ray Client), or \"auto\" (the Ray node running "
      "on this machine)");
}

std::string python(const std::string& given) {
  std::string p = given;
  if (p.empty()) {
    if (auto env = param::kRayPython.get_if_set()) p = *env;
  }
  if (p.empty()) {
    // pip's `ray` command sits beside the Python that has ray (a venv's bin).
    if (auto ray = find_in_path("ray"); !ray.empty()) {
      const std::string beside = std::filesystem::path(ray).parent_path().string() + "/python";
      if (is_executable_file(beside)) p = beside;
    }
  }
  if (p.empty()) p = find_in_path("python3");
  if (!is_executable_file(p)) {
    throw UsageError(
        "engine \"ray\" needs a Python with ray (" +
        (p.empty() ? std::string("no `ray` or python3 on PATH") : "'" + p + "' is not executable") +
        "): pip install 'ray[client]' of the cluster's version and put its bin on "
        "PATH, or set ClusterOptions::ray.python or DTRAIN_RAY_PYTHON");
  }
  return p;
}

std::vector<std::string> direct_command(const Plan& plan, const Driver& d) {
  std::vector<std::string> c = {d.python, "-u", detail::python_script("ray.py", param::kRayScript),
                                "--address", d.address};
  auto f = job_flags(plan, d);
  c.insert(c.end(), f.begin(), f.end());
  return c;
}

std::vector<std::string> kept_command(const Plan& plan, const Driver& d,
                                      std::chrono::seconds idle_timeout,
                                      std::chrono::seconds start_timeout) {
  const std::string socket = kept_socket(d, idle_timeout, start_timeout);
  std::vector<std::string> c = {d.python, "-u", detail::python_script("ray.py", param::kRayScript),
                                "--client", socket};
  auto f = job_flags(plan, d);
  c.insert(c.end(), f.begin(), f.end());
  return c;
}

std::optional<Slots> slots(const Driver& d, double cpus, double gpus,
                           std::chrono::seconds idle_timeout, std::chrono::seconds start_timeout) {
  kept_socket(d, idle_timeout, start_timeout);
  const auto answer = g_driver.query(nlohmann::json{{"cpus", cpus}, {"gpus", gpus}}.dump(),
                                     std::chrono::seconds(30));
  if (!answer) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(*answer);
    if (!j.contains("total_slots")) return std::nullopt;
    return Slots{j.at("total_slots").get<int>(), j.at("free_slots").get<int>()};
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string kept_driver() { return g_driver.id(); }

void stop_kept_driver() { g_driver.stop(); }

std::optional<std::string> explain_exit(int exit_code) {
  if (exit_code == kNoResources) {
    return "the Ray cluster cannot hold the job's placement group (what it needs and what the "
           "nodes have are above, on stderr): add nodes, ask for fewer processes or resources per "
           "process, choose another strategy, or raise ClusterOptions::ray.placement_timeout "
           "when other jobs hold the resources";
  }
  return std::nullopt;
}

void exec_cli_if_requested(int argc, char** argv) {
  const auto flags = detail::scan_run_flags(
      argc, argv,
      {"--ray-address", "--ray-strategy", "--ray-cpus", "--ray-gpus", "--ray-placement-timeout",
       "--ray-python", "--nnodes", "--nproc-per-node"},
      "--ray-address");
  if (!flags) return;
  // The route as typed: `dtrain run --ray-address` or `dtrain launch --ray-address`.
  const std::string route = "dtrain " + flags->command + " --ray-address";
  auto whole = [&](const char* flag, const std::string& text, int def) {
    if (text.empty()) return def;
    char* end = nullptr;
    const long n = std::strtol(text.c_str(), &end, 10);
    if (*end != '\0' || n < 1) {
      throw UsageError(route + ": " + flag + " must be a whole number >= 1, got '" + text + "'");
    }
    return static_cast<int>(n);
  };
  auto real = [&](const char* flag, const std::string& text, double def) {
    if (text.empty()) return def;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (*end != '\0' || !(v >= 0)) {
      throw UsageError(route + ": " + flag + " must be a number >= 0, got '" + text + "'");
    }
    return v;
  };
  // --nnodes N: N bundles (one agent each); --nproc-per-node P: P workers per bundle.
  const int nnodes = whole("--nnodes", flags->value("--nnodes"), 1);
  const int per = whole("--nproc-per-node", flags->value("--nproc-per-node"), 1);
  const double cpus = real("--ray-cpus", flags->value("--ray-cpus"), 1);
  const double gpus = real("--ray-gpus", flags->value("--ray-gpus"), 0);
  Plan p;
  try {
    p = plan(nnodes * per, false, per, cpus, gpus, flags->value("--ray-strategy", "PACK"));
  } catch (const UsageError& e) {
    // The same checks; the message names the flags, not ClusterOptions' fields.
    std::string m = e.what();
    for (const auto& [field, flag] :
         {std::pair<std::string, std::string>{"ClusterOptions::ray.strategy", "--ray-strategy"},
          {"ClusterOptions::ray.num_cpus_per_process", "--ray-cpus"},
          {"num_gpus_per_process", "--ray-gpus"}}) {
      if (auto at = m.find(field); at != std::string::npos) m.replace(at, field.size(), flag);
    }
    throw UsageError(route + ": " + m);
  }
  Driver d;
  d.address = address(flags->value("--ray-address"));
  d.python = python(flags->value("--ray-python"));
  d.placement_timeout = std::chrono::seconds(static_cast<long>(
      real("--ray-placement-timeout", flags->value("--ray-placement-timeout"), 60)));
  std::vector<std::string> command = direct_command(p, d);
  command.push_back(detail::self_path());
  command.insert(command.end(), {flags->command, "--nproc-per-node", std::to_string(per)});
  command.insert(command.end(), flags->rest.begin(), flags->rest.end());
  detail::exec_driver(command, {}, route);
}

}  // namespace dtrain::ray
