// The REST client (over tracking/http.h) and the file-store writer behind dtrain::mlflow::Run.
#include "tracking/store.h"

#include "tracking/http.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;

namespace dtrain::mlflow::detail {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

nlohmann::json metric_value_json(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return value;
}

std::string url_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

namespace {

int status_code(RunStatus s) {  // MLflow's RunStatus enum
  switch (s) {
    case RunStatus::Running:
      return 1;
    case RunStatus::Finished:
      return 3;
    case RunStatus::Failed:
      return 4;
    case RunStatus::Killed:
      return 5;
  }
  return 3;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string yaml_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string new_id() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(now_ms()));
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(g()),
                static_cast<unsigned long long>(g()));
  return buf;
}

// A file-store key may hold '/', which makes subdirectories; nothing may climb out.
fs::path key_path(const fs::path& dir, const std::string& key) {
  if (key.empty() || key.find("..") != std::string::npos || key.front() == '/') {
    throw UsageError("mlflow: invalid key '" + key + "' (empty, absolute or containing '..')");
  }
  return dir / key;
}

// `response` parsed, then walked down `path`; a string at the end.
std::string string_at(const std::string& response, const std::string& endpoint,
                      std::initializer_list<const char*> path, bool optional = false) {
  std::string where;
  for (const char* key : path) where += std::string(where.empty() ? "" : ".") + key;
  try {
    json j = json::parse(response);
    const json* at = &j;
    for (const char* key : path) {
      if (!at->is_object() || !at->contains(key)) {
        if (optional) return "";
        throw NetworkError("");
      }
      at = &(*at)[key];
    }
    if (!at->is_string()) throw NetworkError("");
    return at->get<std::string>();
  } catch (const std::exception&) {
    throw NetworkError("mlflow: the server's answer to " + endpoint + " has no string '" + where +
                       "' (is the tracking URI an MLflow server?): " + response.substr(0, 200));
  }
}

// mlflow.tracking.fluent._get_experiment_id_from_env's checks, with the remedy.
void check_experiment_id(const std::string& name, const std::string& expected_id,
                         const std::string& id) {
  if (expected_id.empty() || expected_id == id) return;
  throw UsageError("mlflow: the experiment id '" + expected_id +
                   "' (MLFLOW_EXPERIMENT_ID or StartOptions::experiment_id) is not the id '" + id +
                   "' of the experiment '" + name +
                   "' (MLFLOW_EXPERIMENT_NAME or StartOptions::experiment); give one of them, or "
                   "both of the same experiment");
}

std::string no_experiment(const std::string& id, const std::string& where) {
  return "mlflow: the experiment id '" + id +
         "' (MLFLOW_EXPERIMENT_ID or StartOptions::experiment_id) names no experiment at " + where +
         "; give an existing experiment's id, or its name in MLFLOW_EXPERIMENT_NAME (created when "
         "missing)";
}

}  // namespace

std::string experiment_id_of_created(const std::string& response) {
  return string_at(response, "experiments/create", {"experiment_id"});
}

std::string experiment_id_of_found(const std::string& response) {
  return string_at(response, "experiments/get-by-name", {"experiment", "experiment_id"});
}

RunInfo run_info_of(const std::string& response, const std::string& endpoint,
                    const std::string& experiment_id) {
  RunInfo info;
  info.run_id = string_at(response, endpoint, {"run", "info", "run_id"});
  info.experiment_id = string_at(response, endpoint, {"run", "info", "experiment_id"}, true);
  if (info.experiment_id.empty()) info.experiment_id = experiment_id;
  info.artifact_uri = string_at(response, endpoint, {"run", "info", "artifact_uri"}, true);
  info.status = string_at(response, endpoint, {"run", "info", "status"}, true);
  return info;
}

// ---------------------------------------------------------------------------------------
RestStore::RestStore(std::string base_url, std::chrono::milliseconds timeout)
    : base_(std::move(base_url)), timeout_(timeout) {
  while (!base_.empty() && base_.back() == '/') base_.pop_back();
}

std::string RestStore::call(const std::string& method, const std::string& endpoint,
                            const std::string& body, bool allow_not_found, long* status) {
  const std::string url = base_ + endpoint;
  HttpResponse reply = http_request(method, url, body, timeout_);
  const long code = reply.status;
  const std::string& response = reply.body;
  if (status) *status = code;
  if (code == 404 && allow_not_found) return response;
  if (code >= 400 && code < 500 && code != 429 && code != 408) {
    throw RejectedError("HTTP " + std::to_string(code) + " from " + method + " " + url + ": " +
                        response.substr(0, 500));
  }
  if (code >= 300 || code == 0) {
    throw NetworkError("HTTP " + std::to_string(code) + " from " + method + " " + url + ": " +
                       response.substr(0, 300));
  }
  return response;
}

std::string RestStore::experiment_id_by_name(const std::string& name,
                                             const std::string& expected_id) {
  const std::string by_name =
      "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + url_escape(name);
  long code = 0;
  auto got = call("GET", by_name, "", true, &code);
  if (code != 404) {
    std::string id = experiment_id_of_found(got);
    check_experiment_id(name, expected_id, id);
    return id;
  }
  try {
    return experiment_id_of_created(
        call("POST", "/api/2.0/mlflow/experiments/create", json{{"name", name}}.dump()));
  } catch (const RejectedError&) {  // created by someone else meanwhile
    return experiment_id_of_found(call("GET", by_name, ""));
  }
}

RunInfo RestStore::create_run(const std::string& experiment, const std::string& experiment_id,
                              const std::string& run_name,
                              const std::map<std::string, std::string>& tags) {
  std::string exp_id;
  if (!experiment.empty() || experiment_id.empty()) {
    exp_id = experiment_id_by_name(experiment.empty() ? "Default" : experiment, experiment_id);
  } else {
    long code = 0;
    std::string got;
    try {
      got =
          call("GET", "/api/2.0/mlflow/experiments/get?experiment_id=" + url_escape(experiment_id),
               "", true, &code);
    } catch (const RejectedError& e) {  // not an id the server could have (not an integer)
      throw UsageError(no_experiment(experiment_id, base_) + ": " + e.what());
    }
    if (code == 404) throw UsageError(no_experiment(experiment_id, base_));
    exp_id = string_at(got, "experiments/get", {"experiment", "experiment_id"});
  }
  json t = json::array();
  for (const auto& [k, v] : tags) t.push_back({{"key", k}, {"value", v}});
  json req{{"experiment_id", exp_id}, {"start_time", now_ms()}, {"tags", t}};
  if (!run_name.empty()) req["run_name"] = run_name;
  auto info =
      run_info_of(call("POST", "/api/2.0/mlflow/runs/create", req.dump()), "runs/create", exp_id);
  info.experiment_id = exp_id;
  return info;
}

RunInfo RestStore::get_run(const std::string& run_id) {
  auto info = run_info_of(call("GET", "/api/2.0/mlflow/runs/get?run_id=" + url_escape(run_id), ""),
                          "runs/get", "");
  if (info.experiment_id.empty()) {
    throw NetworkError("mlflow: the server's answer to runs/get has no run.info.experiment_id");
  }
  info.run_id = run_id;
  return info;
}

int64_t RestStore::max_metric_step(const std::string& run_id, const std::string& prefix) {
  // runs/get carries each key's latest value at its largest step (run.data.metrics), as
  // MLflow's SystemMetricsMonitor reads it to resume.
  const std::string body = call("GET", "/api/2.0/mlflow/runs/get?run_id=" + url_escape(run_id), "");
  int64_t best = -1;
  try {
    const json j = json::parse(body);
    const json* metrics = nullptr;
    if (j.contains("run") && j["run"].contains("data") && j["run"]["data"].contains("metrics"))
      metrics = &j["run"]["data"]["metrics"];
    if (metrics == nullptr) return -1;
    for (const auto& m : *metrics) {
      const std::string key = m.value("key", "");
      if (key.rfind(prefix, 0) != 0) continue;
      const auto& step = m.value("step", json(0));
      // protobuf's JSON writes int64 as a string
      int64_t s = step.is_string() ? std::stoll(step.get<std::string>()) : step.get<int64_t>();
      best = std::max(best, s);
    }
  } catch (const std::exception& e) {
    throw NetworkError(std::string("mlflow: cannot read the metrics in the server's answer to "
                                   "runs/get: ") +
                       e.what());
  }
  return best;
}

void RestStore::log_batch(const std::string& run_id, const std::vector<Entry>& entries) {
  json metrics = json::array(), params = json::array(), tags = json::array();
  for (const auto& e : entries) {
    if (e.kind == Entry::Metric) {
      metrics.push_back({{"key", e.key},
                         {"value", metric_value_json(e.number)},
                         {"timestamp", e.timestamp},
                         {"step", e.step}});
    } else {
      (e.kind == Entry::Param ? params : tags).push_back({{"key", e.key}, {"value", e.text}});
    }
  }
  call("POST", "/api/2.0/mlflow/runs/log-batch",
       json{{"run_id", run_id}, {"metrics", metrics}, {"params", params}, {"tags", tags}}.dump());
}

void RestStore::update_run(const std::string& run_id, RunStatus status) {
  json req{{"run_id", run_id}, {"status", to_string(status)}};
  if (status != RunStatus::Running) req["end_time"] = now_ms();
  call("POST", "/api/2.0/mlflow/runs/update", req.dump());
}

void RestStore::upload_artifact(const RunInfo& run, const std::string& local_file,
                                const std::string& artifact_path) {
  const std::string& uri = run.artifact_uri;
  const std::string proxied = "mlflow-artifacts:";
  if (uri.rfind(proxied, 0) == 0) {
    // mlflow-artifacts:/<path> or mlflow-artifacts://host:port/<path>: the server's proxy.
    std::string rest = uri.substr(proxied.size());
    if (rest.rfind("//", 0) == 0) {
      auto slash = rest.find('/', 2);
      rest = slash == std::string::npos ? "" : rest.substr(slash);
    }
    while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
    call(
        "PUT",
        "/api/2.0/mlflow-artifacts/artifacts/" + url_escape(rest) + "/" + url_escape(artifact_path),
        read_file(local_file));
    return;
  }
  std::string path = uri.rfind("file://", 0) == 0 ? uri.substr(7)
                     : uri.rfind("file:", 0) == 0 ? uri.substr(5)
                                                  : uri;
  if (path.empty() || path.find("://") != std::string::npos) {
    throw UsageError("mlflow: cannot upload to artifact location '" + uri +
                     "' (dtrain uploads through the server's artifact proxy, `mlflow server` with "
                     "--serve-artifacts, or to a local path)");
  }
  fs::path dest = key_path(path, artifact_path);
  fs::create_directories(dest.parent_path());
  fs::copy_file(local_file, dest, fs::copy_options::overwrite_existing);
}

// ---------------------------------------------------------------------------------------
FileStore::FileStore(std::string root, bool adopt_experiment_ids)
    : root_(fs::absolute(root).string()), adopt_experiment_ids_(adopt_experiment_ids) {}

std::string FileStore::experiment_id_for(const std::string& experiment, const std::string& id) {
  fs::create_directories(root_);
  auto write_meta = [&](const std::string& exp_id, const std::string& name) {
    fs::path dir = fs::path(root_) / exp_id;
    fs::create_directories(dir);
    std::ofstream meta(dir / "meta.yaml");
    int64_t t = now_ms();
    meta << "artifact_location: " << yaml_quote("file://" + dir.string())
         << "\ncreation_time: " << t << "\nexperiment_id: " << yaml_quote(exp_id)
         << "\nlast_update_time: " << t << "\nlifecycle_stage: active\nname: " << yaml_quote(name)
         << "\n";
    return exp_id;
  };
  if (experiment.empty() && !id.empty()) {
    if (fs::exists(fs::path(root_) / id / "meta.yaml")) return id;
    if (id.find('/') != std::string::npos || id.find("..") != std::string::npos ||
        !adopt_experiment_ids_)
      throw UsageError(no_experiment(id, "the file store " + root_));
    return write_meta(id, "dtrain-experiment-" + id);
  }
  const std::string name = experiment.empty() ? "Default" : experiment;
  int next = 1;
  for (const auto& e : fs::directory_iterator(root_)) {
    if (!e.is_directory()) continue;
    std::ifstream meta(e.path() / "meta.yaml");
    std::string line;
    while (std::getline(meta, line)) {
      if (line == "name: " + yaml_quote(name) || line == "name: " + name) {
        check_experiment_id(name, id, e.path().filename().string());
        return e.path().filename().string();
      }
    }
    try {
      next = std::max(next, std::stoi(e.path().filename().string()) + 1);
    } catch (const std::exception&) {
    }
  }
  return write_meta(name == "Default" ? "0" : std::to_string(next), name);
}

void FileStore::write_run_meta(const std::string& dir, const RunInfo& run,
                               const std::string& run_name, int status, int64_t start,
                               int64_t end) {
  std::ofstream meta(fs::path(dir) / "meta.yaml.tmp");
  meta << "artifact_uri: " << yaml_quote(run.artifact_uri)
       << "\nend_time: " << (end ? std::to_string(end) : "null")
       << "\nentry_point_name: ''\nexperiment_id: " << yaml_quote(run.experiment_id)
       << "\nlifecycle_stage: active\nrun_id: " << run.run_id
       << "\nrun_name: " << yaml_quote(run_name) << "\nrun_uuid: " << run.run_id
       << "\nsource_name: ''\nsource_type: 4\nsource_version: ''\nstart_time: " << start
       << "\nstatus: " << status << "\ntags: []\nuser_id: "
       << yaml_quote(std::getenv("USER") ? std::getenv("USER") : "dtrain") << "\n";
  meta.close();
  fs::rename(fs::path(dir) / "meta.yaml.tmp", fs::path(dir) / "meta.yaml");
}

RunInfo FileStore::create_run(const std::string& experiment, const std::string& experiment_id,
                              const std::string& run_name,
                              const std::map<std::string, std::string>& tags) {
  RunInfo run;
  run.experiment_id = experiment_id_for(experiment, experiment_id);
  run.run_id = new_id();
  fs::path dir = fs::path(root_) / run.experiment_id / run.run_id;
  for (const char* sub : {"metrics", "params", "tags", "artifacts"})
    fs::create_directories(dir / sub);
  run.artifact_uri = "file://" + (dir / "artifacts").string();
  write_run_meta(dir.string(), run, run_name.empty() ? run.run_id.substr(0, 8) : run_name, 1,
                 now_ms(), 0);
  std::vector<Entry> t;
  for (const auto& [k, v] : tags) t.push_back({Entry::Tag, k, v, 0, 0, 0});
  log_batch(run.run_id, t);
  return run;
}

std::string FileStore::run_dir(const std::string& run_id) {
  if (fs::exists(root_)) {
    for (const auto& e : fs::directory_iterator(root_)) {
      if (e.is_directory() && fs::exists(e.path() / run_id / "meta.yaml"))
        return (e.path() / run_id).string();
    }
  }
  throw UsageError("mlflow: no run " + run_id + " in the file store " + root_);
}

RunInfo FileStore::get_run(const std::string& run_id) {
  fs::path dir = run_dir(run_id);
  RunInfo info{run_id, dir.parent_path().filename().string(),
               "file://" + (dir / "artifacts").string(), ""};
  std::ifstream meta(dir / "meta.yaml");
  std::string line;
  while (std::getline(meta, line)) {
    if (line.rfind("status: ", 0) != 0) continue;
    static const char* const names[] = {"", "RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED"};
    const std::string code = line.substr(8);
    if (code.size() == 1 && code[0] >= '1' && code[0] <= '5') info.status = names[code[0] - '0'];
  }
  return info;
}

int64_t FileStore::max_metric_step(const std::string& run_id, const std::string& prefix) {
  // metrics/<key> files hold "timestamp value step" lines; keys with '/' are subdirectories.
  const fs::path metrics = fs::path(run_dir(run_id)) / "metrics";
  int64_t best = -1;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(metrics, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const std::string key = fs::relative(it->path(), metrics).generic_string();
    if (key.rfind(prefix, 0) != 0) continue;
    std::ifstream in(it->path());
    std::string ts, value;
    int64_t step = 0;
    while (in >> ts >> value >> step) best = std::max(best, step);
  }
  return best;
}

void FileStore::adopt_run(const RunInfo& run, RunStatus status) {
  std::string exp_name = "dtrain-undelivered-" + run.experiment_id;
  std::string exp = experiment_id_for(exp_name);
  fs::path dir = fs::path(root_) / exp / run.run_id;
  if (fs::exists(dir / "meta.yaml")) return;
  for (const char* sub : {"metrics", "params", "tags", "artifacts"})
    fs::create_directories(dir / sub);
  RunInfo local{run.run_id, exp, "file://" + (dir / "artifacts").string()};
  write_run_meta(dir.string(), local, run.run_id.substr(0, 8), status_code(status), now_ms(),
                 now_ms());
}

void FileStore::log_batch(const std::string& run_id, const std::vector<Entry>& entries) {
  if (entries.empty()) return;
  fs::path dir = run_dir(run_id);
  for (const auto& e : entries) {
    const char* sub = e.kind == Entry::Metric  ? "metrics"
                      : e.kind == Entry::Param ? "params"
                                               : "tags";
    fs::path p = key_path(dir / sub, e.key);
    fs::create_directories(p.parent_path());
    if (e.kind == Entry::Metric) {
      std::ofstream f(p, std::ios::app);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", e.number);
      f << e.timestamp << " " << buf << " " << e.step << "\n";
    } else {
      std::ofstream f(p, std::ios::trunc);
      f << e.text;
    }
  }
}

void FileStore::update_run(const std::string& run_id, RunStatus status) {
  fs::path dir = run_dir(run_id);
  std::ifstream meta(dir / "meta.yaml");
  std::string line, run_name;
  int64_t start = now_ms();
  while (std::getline(meta, line)) {
    if (line.rfind("start_time: ", 0) == 0) start = std::stoll(line.substr(12));
    if (line.rfind("run_name: ", 0) == 0) {
      run_name = line.substr(10);
      if (run_name.size() >= 2 && run_name.front() == '\'')
        run_name = run_name.substr(1, run_name.size() - 2);
    }
  }
  meta.close();
  RunInfo info = get_run(run_id);
  write_run_meta(dir.string(), info, run_name, status_code(status), start,
                 status == RunStatus::Running ? 0 : now_ms());
}

void FileStore::upload_artifact(const RunInfo& run, const std::string& local_file,
                                const std::string& artifact_path) {
  fs::path dest = key_path(run_dir(run.run_id) + "/artifacts", artifact_path);
  fs::create_directories(dest.parent_path());
  fs::copy_file(local_file, dest, fs::copy_options::overwrite_existing);
}

std::unique_ptr<Store> make_store(const std::string& uri, std::chrono::milliseconds timeout) {
  if (uri.rfind("http://", 0) == 0 || uri.rfind("https://", 0) == 0)
    return std::make_unique<RestStore>(uri, timeout);
  if (uri.find("://") != std::string::npos && uri.rfind("file://", 0) != 0) {
    throw UsageError(
        "MLFLOW_TRACKING_URI '" + uri +
        "' is not supported by dtrain's client: use http(s)://host:port of an `mlflow server`, "
        "or file:/path (or a plain path) for a local file store");
  }
  std::string path = uri.rfind("file://", 0) == 0 ? uri.substr(7)
                     : uri.rfind("file:", 0) == 0 ? uri.substr(5)
                                                  : uri;
  return std::make_unique<FileStore>(path);
}

}  // namespace dtrain::mlflow::detail
