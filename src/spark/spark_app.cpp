// Spark engine: the kept application (one PySpark driver service per process, reused by every
// run() with the same master and settings; core/driver_service.h). See dtrain/spark.h and
// python/dtrain/spark.py.
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/driver_service.h"
#include "core/paths.h"
#include "dtrain/error.h"
#include "dtrain/spark.h"

namespace dtrain::spark {

namespace {

detail::DriverService g_app("spark");

std::string python_for(const Command& submit) {
  for (const auto& [k, v] : submit.env) {
    if (k == "PYSPARK_PYTHON") return v;
  }
  if (const char* p = std::getenv("PYSPARK_PYTHON"); p && *p) {
    if (std::string(p).find('/') != std::string::npos) return p;
    if (auto found = find_in_path(p); !found.empty()) return found;
  }
  auto found = find_in_path("python3");
  if (found.empty()) {
    throw UsageError(
        "engine \"spark\": no Python for the job client (PYSPARK_PYTHON unset, no "
        "python beside spark-submit, no python3 on PATH)");
  }
  return found;
}

// The kept application's socket for `o` and `plan` (started when none fits); `submit` is
// the spark-submit base command it runs.
std::string ensure_app(const SubmitOptions& o, const Plan& plan, std::chrono::seconds idle_timeout,
                       std::chrono::seconds start_timeout, Command& submit) {
  submit = submit_base(o, plan);  // validates the master and spark-submit
  std::string key;
  for (const auto& part : submit.argv) key += part + '\n';
  for (const auto& [k, v] : submit.env) key += k + "=" + v + '\n';
  detail::DriverService::Start start;
  start.argv = submit.argv;
  start.argv.push_back(driver_script());
  start.extra = {"--idle-timeout", std::to_string(idle_timeout.count())};
  start.env = submit.env;
  start.timeout = start_timeout;
  start.what =
      "the PySpark driver (" + submit.argv[0] + " --master " + o.master + " ... spark.py --serve)";
  start.hint =
      "Check that pyspark and Java work there, or set ClusterOptions::spark_keep_app = false to "
      "submit each run() on its own";
  return g_app.ensure(key, start);
}

}  // namespace

Command app_job_command(const SubmitOptions& o, const Plan& plan, std::chrono::seconds idle_timeout,
                        std::chrono::seconds start_timeout) {
  Command submit;
  const std::string socket = ensure_app(o, plan, idle_timeout, start_timeout, submit);
  Command c;
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", o.slot_timeout_s);
  c.argv = {python_for(submit),
            "-u",
            driver_script(),
            "--client",
            socket,
            "--tasks",
            std::to_string(plan.tasks),
            "--slot-timeout",
            timeout,
            "--"};
  return c;
}

std::optional<AppSlots> app_slots(const SubmitOptions& o, const Plan& plan,
                                  std::chrono::seconds idle_timeout,
                                  std::chrono::seconds start_timeout) {
  Command submit;
  ensure_app(o, plan, idle_timeout, start_timeout, submit);
  // The service waits for the executors to register (at most slot_timeout) before it counts.
  const auto wait = std::chrono::milliseconds(static_cast<long>(o.slot_timeout_s * 1000) + 30000);
  const auto answer =
      g_app.query(nlohmann::json{{"tasks", plan.tasks}, {"wait", o.slot_timeout_s}}.dump(), wait);
  if (!answer) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(*answer);
    if (!j.contains("total_slots")) return std::nullopt;
    return AppSlots{j.at("total_slots").get<int>(), j.at("free_slots").get<int>()};
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string app_id() { return g_app.id(); }

void stop_app() { g_app.stop(); }

}  // namespace dtrain::spark
