// Artifact URIs resolved as MLflow resolves them (mlflow.artifacts / RunsArtifactRepository /
// MlflowArtifactsRepository), for reading one file back.
#include "tracking/artifacts.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtrain/error.h"
#include "tracking/http.h"
#include "tracking/store.h"

namespace fs = std::filesystem;

namespace dtrain::mlflow::detail {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

std::string join(const std::string& dir, const std::string& rest) {
  std::string d = dir;
  while (!d.empty() && d.back() == '/') d.pop_back();
  std::string r = rest;
  while (!r.empty() && r.front() == '/') r.erase(0, 1);
  if (r.empty()) return d;
  return d + "/" + r;
}

bool is_http(const std::string& uri) {
  return starts_with(uri, "http://") || starts_with(uri, "https://");
}

std::string read_local(const std::string& uri, const std::string& path, const std::string& name) {
  const fs::path file = fs::path(path) / name;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    throw UsageError("mlflow: no " + name + " in the artifact directory " + uri + " (" +
                     file.string() +
                     " is not a file): give the artifact path the file was logged under");
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in && !in.eof()) throw UsageError("mlflow: cannot read " + file.string());
  return s.str();
}

// mlflow-artifacts:/<path> or mlflow-artifacts://host:port/<path>, through the server's proxy.
std::string read_proxied(const std::string& uri, const std::string& name,
                         const std::string& tracking_uri, std::chrono::milliseconds timeout) {
  std::string rest = uri.substr(std::string("mlflow-artifacts:").size());
  std::string base;
  if (starts_with(rest, "//")) {
    const auto slash = rest.find('/', 2);
    // That server, with the tracking URI's scheme as MLflow takes it (http when it has none).
    base = (starts_with(tracking_uri, "https://") ? "https://" : "http://") +
           rest.substr(2, slash == std::string::npos ? std::string::npos : slash - 2);
    rest = slash == std::string::npos ? "" : rest.substr(slash);
  } else {
    if (!is_http(tracking_uri)) {
      throw UsageError("mlflow: the artifact URI " + uri +
                       " is served by a tracking server, and the tracking URI '" + tracking_uri +
                       "' is not one: set MLFLOW_TRACKING_URI to the server's http(s)://host:port");
    }
    base = tracking_uri;
    while (!base.empty() && base.back() == '/') base.pop_back();
  }
  std::string path = join(rest, name);
  while (!path.empty() && path.front() == '/') path.erase(0, 1);
  const std::string url = base + "/api/2.0/mlflow-artifacts/artifacts/" + url_escape(path);
  HttpResponse reply = http_request("GET", url, "", timeout);
  if (reply.status == 404) {
    throw UsageError("mlflow: no " + name + " in the artifact directory " + uri + " (GET " + url +
                     ": 404): give the artifact path the file was logged under");
  }
  if (reply.status != 200) {
    throw NetworkError("mlflow: HTTP " + std::to_string(reply.status) + " from GET " + url + ": " +
                       reply.body.substr(0, 300));
  }
  return std::move(reply.body);
}

}  // namespace

std::string read_artifact_file(const std::string& uri, const std::string& name,
                               const std::string& tracking_uri, std::chrono::milliseconds timeout) {
  if (starts_with(uri, "runs:")) {
    // RunsArtifactRepository.parse_runs_uri: runs:/<run id>[/<path>]
    const std::string path = uri.substr(5);
    if (!starts_with(path, "/") || starts_with(path, "//") || path.size() < 2) {
      throw UsageError("mlflow: '" + uri +
                       "' is not a runs:/ URI (runs:/<run id>/<artifact path>, as MLflow writes "
                       "it)");
    }
    const auto slash = path.find('/', 1);
    const std::string run_id =
        path.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
    const std::string artifact_path = slash == std::string::npos ? "" : path.substr(slash + 1);
    if (tracking_uri.empty()) {
      throw UsageError("mlflow: " + uri +
                       " names a run, and no tracking URI is set: set MLFLOW_TRACKING_URI (or "
                       "the tracking_uri option) to the server or file store that holds it");
    }
    RunInfo run;
    try {
      run = make_store(tracking_uri, timeout)->get_run(run_id);
    } catch (const RejectedError&) {  // RESOURCE_DOES_NOT_EXIST, or an id of the wrong form
      throw UsageError("mlflow: no run '" + run_id + "' at " + tracking_uri + " (" + uri +
                       "): give the id of a run there");
    }
    if (run.artifact_uri.empty()) {
      throw NetworkError("mlflow: the run " + run_id + " at " + tracking_uri +
                         " has no artifact_uri");
    }
    if (starts_with(run.artifact_uri, "runs:")) {
      throw UsageError("mlflow: the run " + run_id + " has the artifact location " +
                       run.artifact_uri + ", which names another run");
    }
    return read_artifact_file(join(run.artifact_uri, artifact_path), name, tracking_uri, timeout);
  }
  if (starts_with(uri, "mlflow-artifacts:")) return read_proxied(uri, name, tracking_uri, timeout);
  if (starts_with(uri, "file://")) return read_local(uri, uri.substr(7), name);
  if (starts_with(uri, "file:")) return read_local(uri, uri.substr(5), name);
  const auto colon = uri.find(':');
  const auto slash = uri.find('/');
  if (colon != std::string::npos && (slash == std::string::npos || colon < slash)) {
    throw UsageError("mlflow: the artifact URI '" + uri +
                     "' has a scheme dtrain's client does not read; use runs:/<run id>/<path>, "
                     "mlflow-artifacts:/<path> or a local path");
  }
  return read_local(uri, uri, name);
}

}  // namespace dtrain::mlflow::detail
