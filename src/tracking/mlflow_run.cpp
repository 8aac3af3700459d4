// dtrain::mlflow::Run: a queue, a sender thread, a disk spool, and a fallback file store.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/params.h"
#include "core/python_repr.h"
#include "core/thread_annotations.h"
#include "dtrain/error.h"
#include "dtrain/mlflow.h"
#include "tracking/signal_flush.h"
#include "tracking/store.h"
#include "tracking/system_metrics.h"

namespace fs = std::filesystem;

namespace dtrain::mlflow {

const char* to_string(RunStatus s) {
  switch (s) {
    case RunStatus::Running:
      return "RUNNING";
    case RunStatus::Finished:
      return "FINISHED";
    case RunStatus::Failed:
      return "FAILED";
    case RunStatus::Killed:
      return "KILLED";
  }
  return "FINISHED";
}

namespace {

void warn(const std::string& msg) { std::cerr << "dtrain mlflow: warning: " << msg << std::endl; }

}  // namespace

struct Run::Impl {
  StartOptions options;
  std::unique_ptr<detail::Store> store;
  detail::RunInfo info;
  std::string uri;  // where the run really is

  Mutex mu;
  std::condition_variable wake;  // sender: new work, flush, close
  std::condition_variable done;  // flush(): the queue drained
  std::deque<detail::Entry> queue DTRAIN_GUARDED_BY(mu);
  size_t spooled_upto DTRAIN_GUARDED_BY(mu) = 0;  // entries at the front already in the spool
  bool flush_asked DTRAIN_GUARDED_BY(mu) = false;
  bool closing DTRAIN_GUARDED_BY(mu) = false;
  bool abort DTRAIN_GUARDED_BY(mu) = false;
  bool warned_down DTRAIN_GUARDED_BY(mu) = false;
  bool in_flight DTRAIN_GUARDED_BY(mu) = false;
  bool ended DTRAIN_GUARDED_BY(mu) = false;
  RunStats stats DTRAIN_GUARDED_BY(mu);
  std::string spool_path;
  std::thread sender;
  int signal_token = 0;
  std::unique_ptr<detail::SystemMonitor> system;  // when system metrics are logged

  void run_sender() DTRAIN_EXCLUDES(mu);
  void queue_metrics(const std::map<std::string, double>& metrics, int64_t step)
      DTRAIN_EXCLUDES(mu);
  void spool_locked() DTRAIN_REQUIRES(mu);
  void ask_flush() DTRAIN_EXCLUDES(mu);
  void flush_on_signal(std::chrono::steady_clock::time_point signalled_at) DTRAIN_EXCLUDES(mu);
  void end(RunStatus status);
};

// The process was told to stop: send what is queued for up to `signal_flush`, keep the rest in
// the spool file (the batch in flight included: entries leave the queue only once delivered).
void Run::Impl::ask_flush() {
  MutexLock lk(mu);
  flush_asked = true;
  wake.notify_all();
}

void Run::Impl::flush_on_signal(std::chrono::steady_clock::time_point signalled_at) {
  MutexLock lk(mu);
  if (ended) return;
  flush_asked = true;
  wake.notify_all();
  bool delivered = done.wait_until(lk.native(), signalled_at + options.signal_flush, [&] {
    mu.assert_held();
    return queue.empty() && !in_flight;
  });
  if (delivered) return;
  spool_locked();
  warn("stopped by a signal: the tracking server at " + uri + " did not take " +
       std::to_string(queue.size()) + " logged value(s) within " +
       std::to_string(options.signal_flush.count()) + " ms; they are in " + spool_path);
}

void Run::Impl::spool_locked() {
  if (spooled_upto >= queue.size()) return;
  std::ofstream f(spool_path, std::ios::app);
  for (size_t i = spooled_upto; i < queue.size(); ++i) {
    const auto& e = queue[i];
    nlohmann::json j{{"kind", static_cast<int>(e.kind)}, {"key", e.key}};
    if (e.kind == detail::Entry::Metric) {
      j["value"] = detail::metric_value_json(e.number);
      j["timestamp"] = e.timestamp;
      j["step"] = e.step;
    } else {
      j["value"] = e.text;
    }
    f << j.dump() << "\n";
  }
  f.flush();
  stats.spooled += static_cast<int64_t>(queue.size() - spooled_upto);
  spooled_upto = queue.size();
}

void Run::Impl::run_sender() {
  std::chrono::milliseconds backoff{250};
  // A batch the server refuses (4xx) is sent again in halves until the refused entries are
  // alone: only they are dropped, not the rest of their batch. `suspect` entries at the front
  // are still being split, `cap` bounds the next request meanwhile.
  size_t cap = SIZE_MAX, suspect = 0, refusals_told = 0;
  MutexLock lk(mu);
  while (true) {
    wake.wait_for(lk.native(), options.flush_interval, [&] {
      mu.assert_held();
      return abort || closing || flush_asked || suspect > 0 || queue.size() >= detail::kMaxMetrics;
    });
    if (abort) break;
    if (queue.empty()) {
      flush_asked = false;
      done.notify_all();
      if (closing) break;
      continue;
    }
    // One runs/log-batch request's worth, in order.
    size_t n = 0, metrics = 0, params = 0, tags = 0;
    for (; n < queue.size() && n < cap; ++n) {
      const auto& e = queue[n];
      size_t& c = e.kind == detail::Entry::Metric  ? metrics
                  : e.kind == detail::Entry::Param ? params
                                                   : tags;
      size_t limit = e.kind == detail::Entry::Metric  ? detail::kMaxMetrics
                     : e.kind == detail::Entry::Param ? detail::kMaxParams
                                                      : detail::kMaxTags;
      if (c + 1 > limit || metrics + params + tags + 1 > detail::kMaxMetrics) break;
      ++c;
    }
    std::vector<detail::Entry> batch(queue.begin(), queue.begin() + static_cast<long>(n));
    in_flight = true;
    lk.unlock();
    std::string error;
    bool rejected = false;
    try {
      store->log_batch(info.run_id, batch);
    } catch (const detail::RejectedError& e) {
      rejected = true;
      error = e.what();
    } catch (const std::exception& e) {
      error = e.what();
    }
    lk.lock();
    in_flight = false;
    if (rejected && n > 1) {
      if (suspect == 0) suspect = n;
      cap = (n + 1) / 2;
      continue;
    }
    if (error.empty() || rejected) {
      if (rejected) {
        const auto& e = queue.front();
        const char* what = e.kind == detail::Entry::Metric  ? "metric"
                           : e.kind == detail::Entry::Param ? "param"
                                                            : "tag";
        if (refusals_told < 10) {
          warn("the tracking server refused " + std::string(what) + " '" + e.key + "' (" + error +
               "); it is dropped, the values logged with it are sent" +
               (refusals_told == 9 ? " (further refusals are not reported)" : ""));
        }
        ++refusals_told;
        ++stats.rejected;
      }
      suspect = suspect > n ? suspect - n : 0;
      if (suspect == 0) cap = SIZE_MAX;
      if (warned_down && error.empty()) {
        std::cerr << "dtrain mlflow: the tracking server at " << uri
                  << " is reachable again; sending what was spooled" << std::endl;
        warned_down = false;
      }
      for (size_t i = 0; i < n; ++i) {
        if (queue.front().kind == detail::Entry::Metric && !rejected) ++stats.metrics_sent;
        queue.pop_front();
      }
      spooled_upto = spooled_upto > n ? spooled_upto - n : 0;
      if (queue.empty() && !spool_path.empty()) std::remove(spool_path.c_str());
      backoff = std::chrono::milliseconds(250);
      if (queue.empty()) {
        flush_asked = false;
        done.notify_all();
      }
      continue;
    }
    ++stats.failed_requests;
    spool_locked();
    if (!warned_down) {
      warn("cannot send to the tracking server at " + uri + " (" + error +
           "); retrying with backoff, " + std::to_string(queue.size()) + " value(s) kept in " +
           spool_path);
      warned_down = true;
    }
    wake.wait_for(lk.native(), backoff, [&] {
      mu.assert_held();
      return abort;
    });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(4000));
  }
  done.notify_all();
}

void Run::Impl::queue_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  int64_t ts = detail::now_ms();
  MutexLock lk(mu);
  for (const auto& [k, v] : metrics) queue.push_back({detail::Entry::Metric, k, "", v, ts, step});
}

void Run::Impl::end(RunStatus status) {
  {
    MutexLock lk(mu);
    if (ended) return;
    ended = true;
  }
  if (system) system->stop();
  detail::unregister_signal_flusher(signal_token);
  bool delivered;
  {
    MutexLock lk(mu);
    closing = true;
    wake.notify_all();
    delivered = done.wait_for(lk.native(), options.flush_timeout, [&] {
      mu.assert_held();
      return queue.empty() && !in_flight;
    });
    abort = true;
    wake.notify_all();
  }
  if (sender.joinable()) sender.join();
  if (!delivered) {
    // Keep what the server never got: the same run (id, experiment) in the local file store.
    std::vector<detail::Entry> rest;
    {
      MutexLock lk(mu);  // the sender has stopped; the lock is for the analysis
      rest.assign(queue.begin(), queue.end());
    }
    std::string dir = options.fallback_dir;
    try {
      detail::FileStore fallback(dir);
      fallback.adopt_run(info, status);
      fallback.log_batch(info.run_id, rest);
      warn("the tracking server at " + uri + " did not take " + std::to_string(rest.size()) +
           " logged value(s) within " + std::to_string(options.flush_timeout.count()) +
           " ms; they are in the file store " + fs::absolute(dir).string() + " (run " +
           info.run_id + ") and in " + spool_path);
    } catch (const std::exception& e) {
      warn("could not write the undelivered values to " + dir + ": " + e.what() + "; they are in " +
           spool_path);
    }
  }
  try {
    store->update_run(info.run_id, status);
  } catch (const std::exception& e) {
    warn("could not set run " + info.run_id + " to " + to_string(status) + " at " + uri + ": " +
         e.what());
  }
}

Run::Run() = default;
Run::Run(Run&&) noexcept = default;
Run& Run::operator=(Run&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->end(RunStatus::Finished);
    impl_ = std::move(other.impl_);
  }
  return *this;
}
Run::~Run() {
  if (impl_) impl_->end(RunStatus::Finished);
}

Run Run::start(StartOptions o) {
  Run run;
  if (!o.all_ranks && param::String{"RANK", "0"}.get() != "0") return run;
  if (o.tracking_uri.empty()) o.tracking_uri = param::String{"MLFLOW_TRACKING_URI", ""}.get();
  if (o.tracking_uri.empty()) return run;
  if (o.experiment.empty() && o.experiment_id.empty()) {
    o.experiment = param::String{"MLFLOW_EXPERIMENT_NAME", ""}.get();
    o.experiment_id = param::String{"MLFLOW_EXPERIMENT_ID", ""}.get();
  }
  if (o.parent_run_id.empty()) o.parent_run_id = param::kMlflowParentRunId.get();
  if (o.run_id.empty()) o.run_id = param::String{"MLFLOW_RUN_ID", ""}.get();
  if (o.fallback_dir.empty()) o.fallback_dir = param::kMlflowFallbackDir.get();
  const auto system_metrics = detail::system_metrics_settings(o.log_system_metrics);

  auto impl = std::make_shared<Impl>();
  impl->options = o;
  auto tags = o.tags;
  if (!o.parent_run_id.empty()) tags["mlflow.parentRunId"] = o.parent_run_id;
  if (!o.run_name.empty()) tags["mlflow.runName"] = o.run_name;
  tags.emplace("mlflow.user", param::String{"USER", "dtrain"}.get());
  tags.emplace("mlflow.source.type", "LOCAL");
  tags.emplace("mlflow.source.name", "dtrain");
  try {
    impl->store = detail::make_store(o.tracking_uri, o.request_timeout);
    impl->info = o.run_id.empty()
                     ? impl->store->create_run(o.experiment, o.experiment_id, o.run_name, tags)
                     : impl->store->get_run(o.run_id);
    impl->uri = o.tracking_uri;
    // Continuing an ended run makes it RUNNING again, as mlflow.start_run(run_id=...) does.
    if (!o.run_id.empty() && !impl->info.status.empty() && impl->info.status != "RUNNING")
      impl->store->update_run(impl->info.run_id, RunStatus::Running);
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    warn("cannot start a run at " + o.tracking_uri + " (" + e.what() +
         "); logging to the local file store " + fs::absolute(o.fallback_dir).string() +
         " instead (open it with `MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri " +
         fs::absolute(o.fallback_dir).string() + "`); training goes on");
    impl->store = std::make_unique<detail::FileStore>(o.fallback_dir, true);
    // The server's experiment id, kept locally; never a reason to stop (a name has it locally).
    impl->info = impl->store->create_run(o.experiment, o.experiment.empty() ? o.experiment_id : "",
                                         o.run_name, tags);
    impl->uri = "file:" + fs::absolute(o.fallback_dir).string();
  }
  const char* tmp = std::getenv("TMPDIR");
  fs::path spool_dir =
      fs::path(tmp && *tmp ? tmp : "/tmp") / ("dtrain-mlflow-spool-" + std::to_string(getuid()));
  std::error_code ec;
  fs::create_directories(spool_dir, ec);
  impl->spool_path = (spool_dir / (impl->info.run_id + ".jsonl")).string();
  impl->sender = std::thread([p = impl.get()] { p->run_sender(); });
  if (system_metrics.enabled) {
    // Continuing a run, after its last system step (MLflow's resume_logging).
    int64_t first_step = 0;
    if (!o.run_id.empty()) {
      try {
        first_step = impl->store->max_metric_step(impl->info.run_id, "system/") + 1;
      } catch (const std::exception& e) {
        warn("cannot read the system metrics of run " + impl->info.run_id + " (" + e.what() +
             "); its system metrics start again at step 0");
      }
    }
    // The run's store (the server's, or the local fallback's "file:" one) with a short
    // timeout: a slow server cannot hold up the run's end, which waits for the monitor.
    std::shared_ptr<detail::Store> status_store = detail::make_store(
        impl->uri, std::min<std::chrono::milliseconds>(o.request_timeout, std::chrono::seconds(2)));
    impl->system = std::make_unique<detail::SystemMonitor>(
        system_metrics, first_step,
        [p = impl.get()](const std::map<std::string, double>& m, int64_t step) {
          p->queue_metrics(m, step);
        },
        [id = impl->info.run_id, status_store] {
          // MLflow's monitor asks runs/get after every sample.
          const std::string status = status_store->get_run(id).status;
          return status.empty() || status == "RUNNING";
        });
  }
  if (o.signal_flush.count() > 0) {
    std::weak_ptr<Impl> weak = impl;
    impl->signal_token = detail::register_signal_flusher(
        {.start =
             [weak] {
               if (auto p = weak.lock()) p->ask_flush();
             },
         .finish =
             [weak](std::chrono::steady_clock::time_point signalled_at) {
               if (auto p = weak.lock()) p->flush_on_signal(signalled_at);
             }});
  }
  run.impl_ = std::move(impl);
  return run;
}

bool Run::active() const { return impl_ != nullptr; }
std::string Run::id() const { return impl_ ? impl_->info.run_id : ""; }
std::string Run::experiment_id() const { return impl_ ? impl_->info.experiment_id : ""; }
std::string Run::tracking_uri() const { return impl_ ? impl_->uri : ""; }

void Run::log_param(const std::string& key, const std::string& value) {
  log_params({{key, value}});
}

void Run::log_params(const std::map<std::string, std::string>& params) {
  if (!impl_) return;
  MutexLock lk(impl_->mu);
  for (const auto& [k, v] : params) impl_->queue.push_back({detail::Entry::Param, k, v, 0, 0, 0});
  // Sent now, not at the next interval: MLflow's own client logs params (and tags) as it is
  // called, and a job stopped early still shows what it ran with.
  impl_->flush_asked = true;
  impl_->wake.notify_one();
}

void Run::log_metric(const std::string& key, double value, int64_t step, int64_t timestamp_ms) {
  if (!impl_) return;
  if (timestamp_ms == 0) timestamp_ms = detail::now_ms();
  MutexLock lk(impl_->mu);
  impl_->queue.push_back({detail::Entry::Metric, key, "", value, timestamp_ms, step});
  if (impl_->queue.size() >= detail::kMaxMetrics) impl_->wake.notify_one();
}

void Run::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  if (!impl_) return;
  impl_->queue_metrics(metrics, step);
}

void Run::set_tag(const std::string& key, const std::string& value) {
  if (!impl_) return;
  MutexLock lk(impl_->mu);
  impl_->queue.push_back({detail::Entry::Tag, key, value, 0, 0, 0});
  impl_->flush_asked = true;
  impl_->wake.notify_one();
}

bool Run::flush(std::chrono::milliseconds timeout) {
  if (!impl_) return true;
  MutexLock lk(impl_->mu);
  impl_->flush_asked = true;
  impl_->wake.notify_all();
  return impl_->done.wait_for(lk.native(), timeout, [&] {
    impl_->mu.assert_held();
    return impl_->queue.empty() && !impl_->in_flight;
  });
}

RunStats Run::stats() const {
  if (!impl_) return {};
  MutexLock lk(impl_->mu);
  RunStats s = impl_->stats;
  s.pending = static_cast<int64_t>(impl_->queue.size());
  return s;
}

void Run::log_artifact(const std::string& local_path, const std::string& artifact_path) {
  if (!impl_) return;
  if (!fs::exists(local_path))
    throw UsageError("mlflow log_artifact: no such file or directory: " + local_path);
  flush(impl_->options.flush_timeout);
  std::vector<std::pair<fs::path, std::string>> files;  // local file, artifact path
  fs::path root(local_path);
  std::string base = artifact_path;
  auto join = [](const std::string& a, const std::string& b) {
    return a.empty() ? b : a + "/" + b;
  };
  if (fs::is_directory(root)) {
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (!e.is_regular_file()) continue;
      fs::path rel = fs::relative(e.path(), root);
      files.emplace_back(e.path(), join(base, rel.parent_path().generic_string()));
    }
  } else {
    files.emplace_back(root, base);
  }
  for (const auto& [file, dir] : files) {
    try {
      impl_->store->upload_artifact(impl_->info, file.string(),
                                    join(dir, file.filename().string()));
    } catch (const std::exception& e) {
      warn("could not upload artifact " + file.string() + " to run " + impl_->info.run_id + " at " +
           impl_->uri + ": " + e.what());
    }
  }
}

void Run::end(RunStatus status) {
  if (!impl_) return;
  impl_->end(status);
}

std::string param_value(double value) { return dtrain::detail::python_float_repr(value); }

void set_run_outcome(const std::string& tracking_uri, const std::string& run_id, RunStatus status,
                     const std::map<std::string, std::string>& tags) {
  auto store = detail::make_store(tracking_uri, std::chrono::seconds(10));
  std::vector<detail::Entry> entries;
  for (const auto& [k, v] : tags) entries.push_back({detail::Entry::Tag, k, v, 0, 0, 0});
  if (!entries.empty()) store->log_batch(run_id, entries);
  store->update_run(run_id, status);
}

}  // namespace dtrain::mlflow
