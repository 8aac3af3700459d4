// The worker side of a trial: report(), get_checkpoint().
//
// The Tuner starts each trial's workers with (see tuner.cpp):
//   DTRAIN_TUNE_STORE       host:port of the driver's store
//   DTRAIN_TUNE_PREFIX      this run's key prefix, "trial/<id>/run/<n>/"
//   DTRAIN_TUNE_TRIAL_ID, DTRAIN_TUNE_TRIAL_DIR
//   DTRAIN_TUNE_CHECKPOINT  the directory to start from ("" for none)
//   DTRAIN_TUNE_REPORT_TIMEOUT_MS
// Report k of a run: rank 0 copies the checkpoint into the trial directory and sets
// PREFIX + "result/k" (JSON: metrics, checkpoint path, its pid, hostname and node IP); every
// rank that calls report() waits for PREFIX + "decision/k" ("CONTINUE", "STOP" or "PAUSE").
//
// One session per worker process, created on first use: a worker runs exactly one trial,
// so this process-wide state is the trial itself (Ray's session is the same idea).
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>

#include "core/params.h"
#include "dtrain/engine_env.h"
#include "dtrain/store.h"
#include "dtrain/tune.h"
#include "engines/common.h"
#include "tune/report_wire.h"

namespace fs = std::filesystem;

namespace dtrain::tune {

namespace {

struct Session {
  std::string prefix;
  std::string trial_id;
  std::string trial_dir;
  std::string driver;
  int rank = 0;
  std::chrono::milliseconds timeout{600000};
  std::unique_ptr<store::StoreClient> client;
  int reports = 0;
  std::int64_t start_iteration = 0;    // the trial's training_iteration this run started after
  std::string run;                     // this run's number (1, 2, ... after pauses and restarts)
  std::int64_t checkpoint_index = -1;  // the trial's last checkpoint's (Ray's storage index)
  std::string hostname, node_ip;       // rank 0's, for every result (Ray's hostname, node_ip)
};

// Ray's ray.util.get_node_ip_address() outside a Ray node: the address this host would reach
// the internet from (a UDP connect, nothing sent); without a route, the address its host name
// resolves to; else loopback.
std::string node_ip() {
  const std::string ip = engines::route_to("8.8.8.8").local;
  if (!ip.empty()) return ip;
  std::string by_name = "127.0.0.1";
  char name[256] = {};
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::gethostname(name, sizeof name - 1) == 0 &&
      ::getaddrinfo(name, nullptr, &hints, &res) == 0 && res != nullptr) {
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(res->ai_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr) by_name = text;
  }
  if (res != nullptr) ::freeaddrinfo(res);
  return by_name;
}

std::string host_name() {
  utsname u{};
  return ::uname(&u) == 0 ? u.nodename : "";  // Python's platform.node()
}

std::mutex g_mutex;
std::unique_ptr<Session> g_session;

Session& session(const char* who) {
  if (!in_trial()) {
    throw UsageError(std::string("dtrain::tune::") + who +
                     ": not inside a trial. Call it from the trainable a tune::Tuner runs");
  }
  if (!g_session) {
    auto s = std::make_unique<Session>();
    s->prefix = param::kTunePrefix.get();
    s->trial_id = param::kTuneTrialId.get();
    s->start_iteration = param::kTuneStartIteration.get();
    s->run = std::to_string(param::kTuneRun.get());
    s->checkpoint_index = param::kTuneCheckpointIndex.get();
    s->trial_dir = param::kTuneTrialDir.get();
    s->driver = param::kTuneStore.get();
    // RANK from the dtrain agent; under engine "mpi" (no agent) the MPI launcher's variables.
    if (auto rank = param::Int{"RANK", 0, 0}.get_if_set()) {
      s->rank = static_cast<int>(*rank);
    } else if (auto task = detect_engine_task()) {
      s->rank = task->rank;
    }
    s->timeout = std::chrono::milliseconds(param::kTuneReportTimeoutMs.get());
    const auto colon = s->driver.rfind(':');
    if (colon == std::string::npos) {
      throw UsageError("dtrain::tune: DTRAIN_TUNE_STORE is \"" + s->driver +
                       "\", expected host:port");
    }
    store::StoreClient::Options o;
    o.connect_timeout = std::chrono::seconds(30);
    o.timeout = s->timeout;
    std::string host = s->driver.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    s->client = store::StoreClient::connect(
        host, static_cast<std::uint16_t>(std::stoi(s->driver.substr(colon + 1))), o);
    g_session = std::move(s);
  }
  return *g_session;
}

// Copies a checkpoint (directory or file) into the trial's storage; returns where. Named as Ray
// 2.60's StorageContext names them: checkpoint_000000, checkpoint_000001, ... by the trial's
// count of checkpoints, which goes on across its runs (the driver passes the last index to each
// run, as Ray's Trial passes its storage's), so a restored or exploiting trial never writes over
// a checkpoint the driver has seen: PBT may have handed it to another trial.
std::string persist_checkpoint(Session& s, const std::string& from) {
  if (!fs::exists(from)) {
    throw UsageError("dtrain::tune::report: the checkpoint \"" + from + "\" does not exist");
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "checkpoint_%06lld", static_cast<long long>(++s.checkpoint_index));
  const std::string name = buf;
  const fs::path dest = fs::path(s.trial_dir) / name;
  const fs::path tmp = fs::path(s.trial_dir) / (name + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  if (fs::is_directory(from)) {
    fs::copy(from, tmp, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  } else {
    fs::copy_file(from, tmp / fs::path(from).filename(), fs::copy_options::overwrite_existing);
  }
  // Complete or absent: a driver killed mid-copy never sees half a checkpoint.
  fs::remove_all(dest);
  fs::rename(tmp, dest);
  return dest.string();
}

}  // namespace

bool in_trial() { return param::kTunePrefix.get_if_set().has_value(); }
std::string trial_id() { return param::kTuneTrialId.get(); }
std::string trial_dir() { return param::kTuneTrialDir.get(); }

std::optional<std::string> get_checkpoint() { return param::kTuneCheckpoint.get_if_set(); }

void report(const Result& metrics, const std::string& checkpoint) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Session& s = session("report");
  if (!metrics.is_object()) {
    throw UsageError("dtrain::tune::report: metrics must be a JSON object, got " + metrics.dump());
  }
  const int k = ++s.reports;
  const std::string result_key = s.prefix + "result/" + std::to_string(k);
  const std::string decision_key = s.prefix + "decision/" + std::to_string(k);
  if (s.rank == 0) {
    if (s.hostname.empty()) {
      s.hostname = host_name();
      s.node_ip = node_ip();
    }
    Result nonfinite;
    Result msg{{"metrics", detail::with_nonfinite_as_null(metrics, &nonfinite)},
               {"pid", static_cast<std::int64_t>(::getpid())},
               {"hostname", s.hostname},
               {"node_ip", s.node_ip}};
    if (!nonfinite.empty()) msg["nonfinite"] = nonfinite;  // NaN/inf: JSON has neither
    if (!checkpoint.empty()) msg["checkpoint"] = persist_checkpoint(s, checkpoint);
    s.client->set(result_key, msg.dump());
  }
  if (!s.client->wait({decision_key}, s.timeout)) {
    throw TimeoutError("dtrain::tune::report: trial " + s.trial_id + " (rank " +
                       std::to_string(s.rank) + ") got no decision for report " +
                       std::to_string(k) + " from the tune driver at " + s.driver + " within " +
                       std::to_string(s.timeout.count() / 1000) +
                       " s (TuneOptions::report_timeout); the driver is gone or stuck");
  }
  const std::string decision = s.client->get(decision_key);
  if (decision == "CONTINUE") return;
  throw TrialStopped("dtrain::tune: the scheduler ended trial " + s.trial_id + " at report " +
                     std::to_string(k) + " (" + decision + ")");
}

}  // namespace dtrain::tune
