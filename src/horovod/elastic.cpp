// hvd::elastic (dtrain/horovod_elastic.h): Horovod's TorchState and run() on ElasticState's
// in-memory commits and the elastic launcher's restarts.
#include "dtrain/horovod_elastic.h"

#include <unistd.h>

#include <cstdio>
#include <thread>

#include "dtrain/elastic_state.h"
#include "dtrain/env.h"
#include "dtrain/horovod.h"
#include "dtrain/store.h"
#include "launch/elastic_rendezvous.h"

namespace dtrain::hvd::elastic {

namespace {

constexpr const char* kFieldPrefix = "hvd.field.";

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s)
    out +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out;
}

std::unique_ptr<ElasticState> make_state(torch::nn::Module& model,
                                         torch::optim::Optimizer* optimizer,
                                         const TorchStateOptions& o, const std::string& memory_dir,
                                         ResumePolicy resume) {
  ElasticStateOptions eo;
  eo.checkpoint_dir = o.checkpoint_dir;
  eo.prefix = o.prefix;
  eo.in_memory = true;
  eo.memory_dir = memory_dir;
  eo.resume = resume;
  eo.verbose = o.verbose;
  eo.keep = 2;
  // No data position (dataset size 0): TorchState commits the model, the optimizer and fields.
  return std::make_unique<ElasticState>(model, optimizer, 0, std::move(eo));
}

}  // namespace

TorchState::TorchState(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                       std::map<std::string, int64_t> fields, TorchStateOptions options)
    : model_(model),
      optimizer_(optimizer),
      fields_(std::move(fields)),
      options_(std::move(options)) {
  if (!hvd::is_initialized()) {
    throw UsageError("hvd::elastic::TorchState: call dtrain::hvd::init() before constructing it");
  }
  if (options_.disk_every < 0) {
    throw UsageError("TorchStateOptions::disk_every must be >= 0, got " +
                     std::to_string(options_.disk_every));
  }
  std::string run_id = "none";
  if (auto env = WorkerEnv::from_environ()) run_id = env->run_id;
  memory_dir_ = "/dev/shm/dtrain-hvd-elastic-" + std::to_string(::getuid()) + "-" +
                sanitize(run_id) + "-" + sanitize(options_.prefix);
  es_ = make_state(model_, optimizer_, options_, memory_dir_, ResumePolicy::kOnRestart);
}

TorchState::~TorchState() = default;

int64_t TorchState::commits() const { return es_->step(); }

void TorchState::save() {
  for (auto it = es_->metadata().begin(); it != es_->metadata().end();) {
    it = it->first.rfind(kFieldPrefix, 0) == 0 ? es_->metadata().erase(it) : std::next(it);
  }
  for (const auto& [k, v] : fields_) es_->metadata()[kFieldPrefix + k] = std::to_string(v);
  es_->step_done();  // counts commits (no data position); commits nothing by itself
  const bool disk = !options_.checkpoint_dir.empty() && options_.disk_every > 0 &&
                    es_->step() % options_.disk_every == 0;
  es_->commit(disk);
}

void TorchState::commit() {
  save();
  if (check_host_updates()) {
    throw HostsUpdatedInterrupt("a host waits to join the job: commit " +
                                std::to_string(commits()) +
                                " is saved; the workers restart from it");
  }
}

void TorchState::load_fields() {
  for (const auto& [k, v] : es_->metadata()) {
    if (k.rfind(kFieldPrefix, 0) == 0)
      fields_[k.substr(std::string(kFieldPrefix).size())] = std::stoll(v);
  }
}

bool TorchState::restore() {
  auto fresh = make_state(model_, optimizer_, options_, memory_dir_, ResumePolicy::kAlways);
  if (!fresh->restore()) return false;
  es_ = std::move(fresh);
  resumed_from_ = es_->resumed_from();
  load_fields();
  return true;
}

void TorchState::sync() {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : model_.named_parameters())
    tensors.emplace_back("param." + p.key(), p.value());
  for (const auto& b : model_.named_buffers()) tensors.emplace_back("buffer." + b.key(), b.value());
  broadcast_parameters(tensors, 0);
  if (optimizer_) broadcast_optimizer_state(*optimizer_, 0);
  fields_ = broadcast_object(fields_, 0, "hvd.elastic.fields");
}

bool TorchState::check_host_updates() {
  auto env = WorkerEnv::from_environ();
  if (!env) return false;
  try {
    store::StoreClient::Options copts;
    copts.connect_timeout = std::chrono::seconds(10);
    copts.timeout = std::chrono::seconds(10);
    copts.token = store::job_store_token();
    auto client = store::StoreClient::connect(env->master_addr,
                                              static_cast<std::uint16_t>(env->master_port), copts);
    return launch::late_agents(*client, env->run_id, env->restart_count) > 0;
  } catch (const Error& e) {
    std::fprintf(stderr,
                 "hvd::elastic: check_host_updates could not reach the job's store (%s): %s\n",
                 (env->master_addr + ":" + std::to_string(env->master_port)).c_str(), e.what());
    return false;
  }
}

void TorchState::register_reset_callbacks(std::vector<std::function<void()>> callbacks) {
  for (auto& c : callbacks) reset_callbacks_.push_back(std::move(c));
}

void TorchState::finish() {
  // Another rank of this host may still be writing its last commit (several ranks of one
  // machine share the directory when the "hosts" are local): wait for every rank first.
  hvd::barrier();
  es_->finish();
}

bool TorchState::on_start() {
  const bool restored = es_->restore();
  if (restored) {
    resumed_from_ = es_->resumed_from();
    load_fields();
    for (auto& c : reset_callbacks_) c();
  } else {
    sync();
  }
  return restored;
}

namespace detail {

void wait_for_restart(std::chrono::milliseconds limit, const std::string& why) {
  std::fprintf(stderr,
               "hvd::elastic: rank %d: %s; waiting for the launcher to restart the workers\n",
               hvd::rank(), why.c_str());
  std::this_thread::sleep_for(limit);
  throw TimeoutError(
      "hvd::elastic::run: " + why + ", but the launcher did not restart this worker within " +
      std::to_string(limit.count() / 1000) +
      " s; is the job running under `dtrain horovodrun --min-np` / `dtrain run --nnodes MIN:MAX`?");
}

}  // namespace detail

}  // namespace dtrain::hvd::elastic
