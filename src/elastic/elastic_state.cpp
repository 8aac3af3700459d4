#include "dtrain/elastic_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include "dtrain/checkpoint.h"
#include "dtrain/collectives.h"
#include "dtrain/env.h"
#include "dtrain/error.h"
#include "dtrain/process_group.h"
#include "dtrain/zero.h"
#include "elastic/commit_reader.h"
#include "parallel/checkpoint_files.h"

#include <nlohmann/json.hpp>

namespace dtrain {

namespace fs = std::filesystem;

namespace {

// Keys of TrainingState::metadata that hold ElasticState's own position.
constexpr const char* kOffset = "dtrain.elastic.offset";
constexpr const char* kSamplesSeen = "dtrain.elastic.samples_seen";
constexpr const char* kWorldSize = "dtrain.elastic.world_size";
constexpr const char* kDatasetSize = "dtrain.elastic.dataset_size";
constexpr const char* kOwnPrefix = "dtrain.elastic.";

std::shared_ptr<ProcessGroup> resolve(const std::shared_ptr<ProcessGroup>& given) {
  if (given) return given;
  try {
    return default_group();
  } catch (const UsageError&) {
    throw UsageError(
        "ElasticState: no process group: call dtrain::init_process_group() before constructing it, "
        "or pass "
        "ElasticStateOptions::group");
  }
}

std::string sanitize(const std::string& s) {
  std::string out;
  for (char c : s)
    out +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out;
}

// This directory's commits (PREFIX<step>.pt), newest first.
std::vector<std::pair<int64_t, fs::path>> commits_in(const std::string& dir,
                                                     const std::string& prefix) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (dir.empty()) return out;
  for (auto& [step, path] : detail::list_checkpoints(dir, prefix)) out.emplace_back(step, path);
  return out;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("ElasticState::restore: cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// PATH written whole or not at all: a temporary name, then rename. `durable`: fsync the file
// and the directory (a disk commit must survive a crash of the node; tmpfs needs no fsync).
void write_atomically(const fs::path& path, const std::string& bytes, bool durable) {
  const fs::path tmp = path.parent_path() / ("." + path.filename().string() + ".tmp");
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error("ElasticState: cannot create " + tmp.string() + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw Error("ElasticState: cannot write " + tmp.string() + ": " + std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  if ((durable && ::fsync(fd) != 0) || ::close(fd) != 0) {
    throw Error("ElasticState: cannot write " + tmp.string() + ": " + std::strerror(errno));
  }
  fs::rename(tmp, path);
  if (durable) {
    int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
}

}  // namespace

ElasticState::ElasticState(zero::detail::EngineCore& engine, int64_t dataset_size,
                           ElasticStateOptions options)
    : ElasticState(engine.module(), nullptr, dataset_size, std::move(options)) {
  if (group_->world_size() != engine.group().world_size() || group_->rank() != engine.rank()) {
    throw UsageError(
        "ElasticState: the ZeRO engine's group (rank " + std::to_string(engine.rank()) + " of " +
        std::to_string(engine.group().world_size()) + ") is not ElasticStateOptions::group (rank " +
        std::to_string(group_->rank()) + " of " + std::to_string(group_->world_size()) +
        "); pass the engine's group as ElasticStateOptions::group");
  }
  engine_ = &engine;
}

ElasticState::ElasticState(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                           int64_t dataset_size, ElasticStateOptions options)
    : model_(model),
      optimizer_(optimizer),
      options_(std::move(options)),
      group_(resolve(options_.group)),
      sampler_(dataset_size, std::max<int64_t>(options_.batch_size, 1),
               {.num_replicas = group_->world_size(),
                .rank = group_->rank(),
                .shuffle = options_.shuffle,
                .seed = options_.seed}) {
  if (options_.batch_size < 1) {
    throw UsageError("ElasticStateOptions::batch_size must be >= 1 (the per-rank batch), got " +
                     std::to_string(options_.batch_size));
  }
  if (options_.checkpoint_dir.empty() && !options_.in_memory) {
    throw UsageError(
        "ElasticStateOptions: set checkpoint_dir (where commits are written) or in_memory = true; "
        "with neither "
        "there is nothing to resume from");
  }
  if (options_.keep < 1)
    throw UsageError("ElasticStateOptions::keep must be >= 1, got " +
                     std::to_string(options_.keep));
  if (options_.commit_every < 0 || options_.disk_every < 0) {
    throw UsageError(
        "ElasticStateOptions: commit_every and disk_every must be >= 0 (0 = at epoch ends only)");
  }
  if (options_.prefix.empty()) throw UsageError("ElasticStateOptions::prefix must not be empty");
  rank_ = group_->rank();
  std::string run_id = "none";
  if (auto env = WorkerEnv::from_environ()) {
    local_rank_ = env->local_rank;
    run_id = env->run_id;
  }
  if (options_.in_memory && options_.memory_dir.empty()) {
    std::string key = options_.checkpoint_dir.empty()
                          ? std::string("nodir")
                          : std::to_string(std::hash<std::string>{}(
                                fs::absolute(options_.checkpoint_dir).string()));
    options_.memory_dir = "/dev/shm/dtrain-elastic-" + std::to_string(::getuid()) + "-" +
                          sanitize(run_id) + "-" + sanitize(options_.prefix) + key;
  }
}

double ElasticState::progress(int64_t epochs) const {
  const double total = static_cast<double>(epochs) * static_cast<double>(sampler_.size());
  if (total <= 0) return 1.0;
  const double done = static_cast<double>(epoch_) * static_cast<double>(sampler_.size()) +
                      static_cast<double>(sampler_.offset());
  return std::min(1.0, done / total);
}

bool ElasticState::restore() {
  const auto env = WorkerEnv::from_environ();
  const int restart_count = env ? env->restart_count : 0;
  const bool resume = options_.resume == ResumePolicy::kAlways ||
                      (options_.resume == ResumePolicy::kOnRestart && restart_count > 0);
  if (!resume) {
    // A fresh job: commits left by an earlier job must not be taken for this one's later.
    std::error_code ec;
    if (rank_ == 0) {
      for (const auto& [step, path] : commits_in(options_.checkpoint_dir, options_.prefix))
        fs::remove(path, ec);
    }
    if (options_.in_memory && local_rank_ == 0) fs::remove_all(options_.memory_dir, ec);
    return false;
  }

  // Each rank's newest commit (memory first on a tie: same state, no disk read), then the
  // newest of all, sent from the lowest rank that has it.
  int64_t best_step = -1;
  fs::path best_path;
  std::string best_kind;
  if (options_.in_memory) {
    auto mem = commits_in(options_.memory_dir, options_.prefix);
    if (!mem.empty()) best_step = mem[0].first, best_path = mem[0].second, best_kind = "memory";
  }
  auto disk = commits_in(options_.checkpoint_dir, options_.prefix);
  if (!disk.empty() && disk[0].first > best_step)
    best_step = disk[0].first, best_path = disk[0].second, best_kind = "disk";

  CollectiveOptions copts;
  copts.group = group_;
  const auto steps = all_gather_object<int64_t>(best_step, copts);
  const auto top = std::max_element(steps.begin(), steps.end());
  if (*top < 0) {
    if (options_.verbose && rank_ == 0) {
      std::fprintf(
          stderr, "dtrain: elastic: restart %d found no commit (in %s%s): starting from scratch\n",
          restart_count, options_.checkpoint_dir.empty() ? "-" : options_.checkpoint_dir.c_str(),
          options_.in_memory ? (" or " + options_.memory_dir).c_str() : "");
    }
    return false;
  }
  const int src = static_cast<int>(top - steps.begin());
  BroadcastOptions bopts;
  bopts.group = group_;
  bopts.src = src;
  std::string from =
      broadcast_object(rank_ == src ? best_kind + ":" + best_path.string() : std::string(), bopts);
  std::string bytes = broadcast_object(rank_ == src ? read_bytes(best_path) : std::string(), bopts);

  TrainingState st;
  if (engine_) {
    st.metadata = load_engine_commit(bytes, from);
    st.step = elastic::metadata_int(st.metadata, "dtrain.elastic.step", from);
    st.epoch = elastic::metadata_int(st.metadata, "dtrain.elastic.epoch", from);
  } else {
    fs::path load_path = best_path;
    fs::path temp;
    if (rank_ != src) {
      std::error_code ec;
      fs::path base =
          fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
      temp = base / ("dtrain-elastic-restore-" + std::to_string(::getpid()) + ".pt");
      std::ofstream out(temp, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      out.close();
      if (!out)
        throw Error("ElasticState::restore: cannot write the received commit to " + temp.string());
      load_path = temp;
    }
    try {
      st = load_checkpoint(load_path.string(), model_, optimizer_);
    } catch (const std::exception& e) {
      std::error_code ec;
      if (!temp.empty()) fs::remove(temp, ec);
      throw Error(std::string("ElasticState::restore: the newest commit (") + from +
                  ") does not fit: " + e.what());
    }
    if (!temp.empty()) {
      std::error_code ec;
      fs::remove(temp, ec);
    }
  }
  const int64_t dataset_size = elastic::metadata_int(st.metadata, kDatasetSize, from);
  if (dataset_size != sampler_.size()) {
    throw Error("ElasticState::restore: " + from + " was committed over a dataset of " +
                std::to_string(dataset_size) + " samples, but this run has " +
                std::to_string(sampler_.size()) +
                "; the data position cannot carry over (use another checkpoint_dir or prefix)");
  }
  const int64_t offset = elastic::metadata_int(st.metadata, kOffset, from);
  samples_seen_ = elastic::metadata_int(st.metadata, kSamplesSeen, from);
  const int64_t old_world = elastic::metadata_int(st.metadata, kWorldSize, from);
  step_ = st.step;
  epoch_ = st.epoch;
  sampler_.set_epoch(epoch_, offset);
  metadata_.clear();
  for (const auto& [k, v] : st.metadata) {
    if (k.rfind(kOwnPrefix, 0) != 0) metadata_[k] = v;
  }
  resumed_from_ = from;
  if (options_.verbose && rank_ == 0) {
    std::fprintf(stderr,
                 "dtrain: elastic: restart %d resumed from %s: epoch %lld, sample %lld of %lld, "
                 "step %lld (committed at "
                 "world size %lld, now %d)\n",
                 restart_count, from.c_str(), static_cast<long long>(epoch_),
                 static_cast<long long>(offset), static_cast<long long>(sampler_.size()),
                 static_cast<long long>(step_), static_cast<long long>(old_world),
                 group_->world_size());
  }
  return true;
}

std::optional<std::vector<int64_t>> ElasticState::next_batch() {
  const int64_t before = sampler_.offset();
  auto batch = sampler_.next_batch();
  last_batch_global_ = sampler_.offset() - before;
  return batch;
}

void ElasticState::step_done() {
  ++step_;
  samples_seen_ += last_batch_global_;
  last_batch_global_ = 0;
  if (options_.commit_every > 0 && step_ % options_.commit_every == 0) {
    commit(options_.in_memory && options_.disk_every > 0 && step_ % options_.disk_every == 0);
  } else if (options_.in_memory && options_.disk_every > 0 && step_ % options_.disk_every == 0) {
    commit(true);
  }
}

void ElasticState::end_epoch() {
  ++epoch_;
  sampler_.set_epoch(epoch_, 0);
  commit(true);
}

std::map<std::string, std::string> ElasticState::position_metadata() const {
  auto m = metadata_;
  m[kOffset] = std::to_string(sampler_.offset());
  m[kSamplesSeen] = std::to_string(samples_seen_);
  m[kWorldSize] = std::to_string(group_->world_size());
  m[kDatasetSize] = std::to_string(sampler_.size());
  return m;
}

std::string ElasticState::engine_commit(bool build) {
  // Every rank's slice of the master and the optimizer state, to every rank (all_gather is
  // what the collectives offer; the writers need them all).
  const std::vector<char> mine = torch::pickle_save(engine_->optim_state());
  CollectiveOptions copts;
  copts.group = group_;
  auto slices = all_gather_object(std::string(mine.begin(), mine.end()), copts);
  c10::IValue model = engine_->model_state(build);  // collective at stage 3
  if (!build) return "";
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", std::string(elastic::kZeroCommitFormat));
  d.insert("model", model);
  c10::impl::GenericList optims(c10::AnyType::get());
  for (auto& b : slices) {
    optims.push_back(torch::pickle_load(std::vector<char>(b.begin(), b.end())));
    std::string().swap(b);
  }
  d.insert("optim", optims);
  auto meta = position_metadata();
  meta["dtrain.elastic.step"] = std::to_string(step_);
  meta["dtrain.elastic.epoch"] = std::to_string(epoch_);
  d.insert("metadata", nlohmann::json(meta).dump());
  auto gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  d.insert("rng", rng);
  const std::vector<char> bytes = torch::pickle_save(d);
  return std::string(bytes.begin(), bytes.end());
}

std::map<std::string, std::string> ElasticState::load_engine_commit(const std::string& bytes,
                                                                    const std::string& from) {
  auto commit = elastic::read_engine_commit(bytes, from);
  std::vector<c10::impl::GenericDict> optims;
  for (const auto& o : commit.optims) optims.push_back(o.toGenericDict());
  try {
    engine_->load_state(commit.model.toGenericDict(), optims, {}, from);
  } catch (const std::exception& e) {
    throw Error(std::string("ElasticState::restore: the newest commit (") + from +
                ") does not fit the engine: " + e.what());
  }
  auto gen = at::detail::getDefaultCPUGenerator();
  try {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(commit.rng);
  } catch (const c10::Error& e) {
    throw Error("ElasticState::restore: the newest commit (" + from +
                ") has a generator state of the wrong size: " + e.what_without_backtrace());
  }
  return commit.metadata;
}

void ElasticState::write_commit(const std::string& dir, bool durable) {
  fs::create_directories(dir);
  TrainingState st;
  st.step = step_;
  st.epoch = epoch_;
  st.sampler_epoch = epoch_;
  st.metadata = position_metadata();
  SaveOptions so;
  so.writer_rank = -1;  // the caller decided who writes
  so.rank = rank_;
  so.durable = durable;  // memory commits (tmpfs): no fsync
  save_checkpoint((fs::path(dir) / (options_.prefix + std::to_string(step_) + ".pt")).string(),
                  model_, optimizer_, st, so);
}

void ElasticState::prune(const std::string& dir, int keep) {
  auto all = commits_in(dir, options_.prefix);
  std::error_code ec;
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) fs::remove(all[i].second, ec);
}

void ElasticState::commit(bool to_disk) {
  if (engine_) {
    const bool memory = options_.in_memory && local_rank_ == 0;
    const bool disk =
        (!options_.in_memory || to_disk) && !options_.checkpoint_dir.empty() && rank_ == 0;
    const std::string bytes = engine_commit(memory || disk);  // collective
    const std::string name = options_.prefix + std::to_string(step_) + ".pt";
    if (memory) {
      fs::create_directories(options_.memory_dir);
      write_atomically(fs::path(options_.memory_dir) / name, bytes, false);
      prune(options_.memory_dir, 2);
    }
    if (disk) {
      fs::create_directories(options_.checkpoint_dir);
      write_atomically(fs::path(options_.checkpoint_dir) / name, bytes, true);
      prune(options_.checkpoint_dir, options_.keep);
    }
    return;
  }
  if (options_.in_memory && local_rank_ == 0) {
    write_commit(options_.memory_dir, false);
    prune(options_.memory_dir, 2);
  }
  if ((!options_.in_memory || to_disk) && !options_.checkpoint_dir.empty() && rank_ == 0) {
    write_commit(options_.checkpoint_dir, true);
    prune(options_.checkpoint_dir, options_.keep);
  }
}

void ElasticState::finish() {
  if (options_.in_memory && local_rank_ == 0) {
    std::error_code ec;
    fs::remove_all(options_.memory_dir, ec);
  }
}

}  // namespace dtrain
