// ElasticState: a restarted job resumes by itself, at any world size.
//
// torchrun restarts the workers of a failed job (--max-restarts, --nnodes MIN:MAX) and leaves
// resuming to user code. ElasticState does it: it owns the training position (epoch, the
// ElasticSampler's offset in the epoch, optimizer steps, samples seen, user metadata) and
// commits it together with the model's parameters and buffers, the optimizer's state and
// param-group options (lr...) and the CPU RNG state (dtrain/checkpoint.h). When the job is
// restarted (TORCHELASTIC_RESTART_COUNT > 0, as `dtrain run` and torchrun set it), restore()
// loads the newest complete commit on every rank, and the sampler splits the epoch's remaining
// samples over the new ranks: every sample of the epoch is trained on exactly once across the
// restart (the steps after the last commit are redone; nothing before it is repeated).
//
//   dtrain::ElasticState es(*model, &optimizer, train_set_size,
//                           {.checkpoint_dir = "ckpt", .batch_size = 64, .commit_every = 50});
//   es.restore();                                    // collective; a no-op on a fresh job
//   for (; es.epoch() < epochs; es.end_epoch()) {    // end_epoch() commits
//     while (auto batch = es.next_batch()) {         // this rank's indices, or nullopt
//       set_lr(schedule(es.progress(epochs)));       // progress survives a world-size change
//       ... forward, backward (DDP), optimizer.step() ...
//       es.step_done();                              // commits every commit_every steps
//     }
//   }
//   es.finish();
//
// Commits. Disk (checkpoint_dir): rank 0 writes DIR/<prefix><step>.pt atomically (write,
// fsync, rename: a file with that name is complete) and keeps the newest `keep`. In memory
// (in_memory = true; Horovod elastic's commit()): local rank 0 of every node writes the
// commit to node-local memory (tmpfs, /dev/shm) without fsync - it outlives the worker
// processes the agent restarts, not the node; disk commits are then written every
// disk_every steps and at each epoch's end. restore() takes the newest commit any rank can
// see (disk or memory) and broadcasts it from that rank, so no shared filesystem is needed.
//
// Requirements: every rank holds the same replica (DDP, or any data-parallel scheme whose
// replicas agree after each step), so rank 0's state is the job's. The RNG state restored is
// rank 0's, on every rank. A learning-rate schedule resumes exactly when it is a function of
// step() or progress() (restored), or lives in the optimizer's param-group options (restored);
// a torch::optim::LRScheduler's private step count is not saved. Not thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/elastic_sampler.h"

namespace dtrain {

class ProcessGroup;
namespace zero {
template <typename ModuleType>
class Engine;
namespace detail {
class EngineCore;
}  // namespace detail
}  // namespace zero

enum class ResumePolicy {
  kOnRestart,  // resume when TORCHELASTIC_RESTART_COUNT > 0; a fresh job (count 0) starts
               // over and removes the <prefix>*.pt commits of an earlier job from the directory
  kAlways,     // resume from any commit found (e.g. a job started again by hand)
  kNever,      // never resume
};

struct ElasticStateOptions {
  // Disk commits go here (created if missing). May be empty only with in_memory.
  std::string checkpoint_dir;
  std::string prefix = "elastic_";  // Default: "elastic_" (files <prefix><step>.pt)
  int64_t batch_size = 1;           // per rank; REQUIRED in practice (Default: 1)
  bool shuffle = true;              // Default: true
  uint64_t seed = 0;                // the sampler's seed. Default: 0
  // step_done() commits after every commit_every steps. Default: 0 = at epoch ends only
  // (end_epoch()) and when commit() is called.
  int64_t commit_every = 0;
  // Commit to node-local memory (see above). Default: false.
  bool in_memory = false;
  // With in_memory and a checkpoint_dir: also write to disk every disk_every steps.
  // Default: 0 = at epoch ends only.
  int64_t disk_every = 0;
  int keep = 2;  // disk commits kept (the newest). Default: 2
  ResumePolicy resume = ResumePolicy::kOnRestart;
  // Where in_memory commits go. Default: /dev/shm/dtrain-elastic-<uid>-<run id>-<prefix>.
  std::string memory_dir;
  // The group. Default: the default group (init_process_group() must have run).
  std::shared_ptr<ProcessGroup> group;
  bool verbose = true;  // rank 0 prints one line when it resumes. Default: true
};

class ElasticState {
 public:
  // Keeps references to model and optimizer (the caller owns them; they must outlive this).
  // optimizer may be null. Throws UsageError for bad options (naming the field).
  ElasticState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, int64_t dataset_size,
               ElasticStateOptions options);

  // With the ZeRO engine (dtrain/zero.h) in place of a model and an optimizer: a commit holds
  // the engine's whole state - the module, every rank's slice of the fp32 master and of the
  // optimizer state, its steps, LR scheduler and loss scaler - and restore() re-cuts the
  // slices for the new world size (as zero's load_checkpoint does for N -> M). Commits and
  // restore() are then COLLECTIVE on every rank (step_done(), end_epoch(), commit()): each
  // rank's slice is gathered to the writers (rank 0 for disk, local rank 0 for memory), so a
  // commit briefly holds the whole optimizer state there. The engine must outlive this.
  template <typename ModuleType>
  ElasticState(zero::Engine<ModuleType>& engine, int64_t dataset_size, ElasticStateOptions options)
      : ElasticState(engine.core(), dataset_size, std::move(options)) {}
  ElasticState(zero::detail::EngineCore& engine, int64_t dataset_size, ElasticStateOptions options);

  // COLLECTIVE (every rank calls it once, before training). Resumes from the newest complete
  // commit per the resume policy; returns true if it did. Throws Error when a commit exists
  // but does not fit the model (the message names the file and the first mismatch).
  bool restore();

  // The training position.
  int64_t epoch() const { return epoch_; }
  int64_t step() const { return step_; }                  // optimizer steps, all epochs
  int64_t samples_seen() const { return samples_seen_; }  // by all ranks, all epochs
  // Fraction of `epochs` epochs done, in samples (independent of the world size).
  double progress(int64_t epochs) const;
  bool resumed() const { return !resumed_from_.empty(); }
  // "disk:DIR/elastic_12.pt" or "memory:/dev/shm/.../elastic_12.pt"; empty if none.
  const std::string& resumed_from() const { return resumed_from_; }
  // User state committed and restored with the rest.
  std::map<std::string, std::string>& metadata() { return metadata_; }
  ElasticSampler& sampler() { return sampler_; }

  // This rank's indices of the next global batch; nullopt at the epoch's end (on every rank).
  std::optional<std::vector<int64_t>> next_batch();
  // Records one optimizer step over the batch next_batch() returned; commits every
  // commit_every steps. Call it on every rank after optimizer.step().
  void step_done();
  // Moves to the next epoch and commits. Call it on every rank once next_batch() ran out.
  void end_epoch();
  // Commits now (every rank calls it; rank 0 / local rank 0 write). `to_disk`: also to disk
  // when in_memory (without in_memory commits always go to disk).
  void commit(bool to_disk = false);
  // Training is over: removes this job's memory commits (disk commits stay).
  void finish();

 private:
  // `durable`: fsync (disk commits); memory commits skip it (SaveOptions::durable).
  void write_commit(const std::string& dir, bool durable);
  void prune(const std::string& dir, int keep);
  // ZeRO: the commit file's bytes (collective; empty unless `build`), and loading one.
  std::string engine_commit(bool build);
  std::map<std::string, std::string> load_engine_commit(const std::string& bytes,
                                                        const std::string& from);
  std::map<std::string, std::string> position_metadata() const;

  torch::nn::Module& model_;
  torch::optim::Optimizer* optimizer_;
  zero::detail::EngineCore* engine_ = nullptr;
  ElasticStateOptions options_;
  std::shared_ptr<ProcessGroup> group_;
  ElasticSampler sampler_;
  int rank_ = 0;
  int local_rank_ = 0;
  int64_t epoch_ = 0;
  int64_t step_ = 0;
  int64_t samples_seen_ = 0;
  int64_t last_batch_global_ = 0;  // samples in the global batch next_batch() returned last
  std::map<std::string, std::string> metadata_;
  std::string resumed_from_;
};

}  // namespace dtrain
