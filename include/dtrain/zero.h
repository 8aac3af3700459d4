// ZeRO: data parallelism that partitions optimizer state (stage 1), gradients (stage 2) and
// parameters (stage 3) across the ranks, driven by DeepSpeed's JSON config.
//
//   auto engine = dtrain::zero::initialize(model, "ds_config.json");   // or JSON text /
//   nlohmann::json for (auto& batch : loader) {
//     auto loss = loss_fn(engine(batch.data), batch.target);
//     engine.backward(loss);       // scaled by 1/gradient_accumulation_steps (and the fp16 loss
//     scale) engine.step();               // updates only at the accumulation boundary
//   }
//   engine.save_checkpoint("ckpt", "global_step100");   // DeepSpeed's layout, every rank calls it
//
// How it works (src/zero/engine.cpp). The trainable parameters (one dtype, one device: the
// module's) are laid out in one flat buffer, padded to a multiple of the world size N; rank r
// owns elements [r*P, (r+1)*P), P = padded/N.
//   stage 0: every rank holds everything; gradients are all-reduced (averaged), every rank steps.
//   stage 1: gradients are reduced to each partition's owner at the boundary (with
//            overlap_comm: bucket by bucket during the boundary micro-step's backward, as
//            stage 2 does); each rank steps its partition of the optimizer state (1/N of it),
//            then the parameters are all-gathered.
//   stage 2: as 1, and gradients are partitioned during backward: hooks collect finished
//            gradients into buckets of reduce_bucket_size elements, at most 4M (a bucket keeps
//            its gradients alive until it is reduced; DeepSpeed's 5e8 would be a whole model)
//            (reverse registration order, roughly backward's; a parameter of the bucket size or
//            more is a bucket of its own, reduced in place in the gradient autograd made) and
//            reduce each bucket's pieces to the ranks that own them;
//            a rank keeps only its own partition's gradients (the full .grad is released).
//   stage 3: as 2, and the parameters themselves are partitioned: between steps a rank holds
//            only its 1/N. A torch::nn::Sequential is fetched per child (DeepSpeed's
//            per-submodule fetch, src/zero/stage3_fetch.h): each child's parameters are
//            gathered before its forward and again before its backward, released after each,
//            and the next children are prefetched (stage3_prefetch_bucket_size,
//            stage3_max_live_parameters, stage3_param_persistence_threshold). Any other module
//            is gathered whole before forward and released after backward, unless its parts
//            run through engine.fetch() (see Engine::fetch_units).
// Optimizers (Adam, AdamW, SGD, Lamb, Adagrad, Lion) run on the flat partitions; with fp16/bf16 the
// module holds 16-bit parameters and the optimizer an fp32 master partition. With
// offload_optimizer {device: cpu} the master partition, the optimizer state and the step live
// in CPU memory. Adam on CPU partitions (offloaded or not) runs as a vectorised,
// multi-threaded loop (cpu_adam_step below).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/collectives.h"
#include "dtrain/module_ref.h"
#include "dtrain/process_group.h"
#include "dtrain/zero_config.h"

namespace dtrain::zero {

// Bytes this rank holds of each kind of model state.
struct MemoryUsage {
  int64_t params_device = 0, grads_device = 0, optimizer_device = 0;
  int64_t params_cpu = 0, grads_cpu = 0, optimizer_cpu = 0;
  int64_t params() const { return params_device + params_cpu; }
  int64_t grads() const { return grads_device + grads_cpu; }
  int64_t optimizer() const { return optimizer_device + optimizer_cpu; }
};

struct LoadCheckpointOptions {
  bool load_optimizer_states = true;
  bool load_lr_scheduler_states = true;
  // DeepSpeed's load_module_only: only the module's parameters and buffers (and the fp32
  // master from them); the optimizer state, scheduler, steps and loss scale stay as they are.
  bool load_module_only = false;
  // DeepSpeed's load_module_strict (torch's load_state_dict(strict)): true refuses a checkpoint
  // whose module lacks one of the model's parameters or holds a key the model has neither as a
  // parameter nor as a buffer (UsageError naming them). false loads the parameters both have
  // and leaves the others as they are (fine-tuning with a new head); where the keys differ that
  // needs load_module_only (the optimizer state of other parameters has no place, and DeepSpeed
  // fails there). At stage 3 the values come from the checkpoint's fp32 master, which every
  // rank then reads whole (DeepSpeed 0.19.8 loads none of them there). Where only frozen parameters
  // differ (requires_grad false: a checkpoint saved with exclude_frozen_parameters) everything
  // loads at every stage, the optimizer state too, and the frozen parameters the file lacks keep
  // their values, as with DeepSpeed's. A shape that differs is refused either way, as by torch.
  bool load_module_strict = true;
};

// DeepSpeed's engine.backward(loss, retain_graph=False, scale_wrt_gas=True) arguments.
struct BackwardOptions {
  bool retain_graph = false;  // keep the graph for another backward through it
  bool scale_wrt_gas = true;  // divide the loss by gradient_accumulation_steps first
};

struct SaveCheckpointOptions {
  // DeepSpeed's client_state: the caller's own values (step, epoch, data position, ...), written
  // at the top level of the model file as DeepSpeed writes them, so Python's
  // engine.load_checkpoint returns them in its client_state, and Engine::client_state() after a
  // load here. A JSON object; a key DeepSpeed or dtrain writes itself ("module",
  // "global_steps", ...) is refused (UsageError). Default: none.
  nlohmann::json client_state = nlohmann::json::object();
  // DeepSpeed's save_latest: point DIR/latest at this tag. Default: true.
  bool save_latest = true;
  // Also write DeepSpeed's loss scaler object (an instance of DeepSpeed 0.19.8's LossScaler or
  // DynamicLossScaler class) into every optimizer file, as DeepSpeed's own files hold it: its
  // load_checkpoint then resumes the loss scale (stages 1-2) and, at stage 3, can load the
  // optimizer state at all (without the object it loads the module only:
  // load_optimizer_states=False). Such files need Python's torch.load(weights_only=False), as
  // DeepSpeed's own do; dtrain reads them either way. Default: false (every file loads with
  // torch.load's default, weights_only=True).
  bool deepspeed_loss_scaler = false;
  // DeepSpeed's exclude_frozen_parameters: leave the frozen parameters (requires_grad false: a
  // fine-tuning's base weights, which come from the pretrained model anyway) out of the
  // module, and write no frozen_param_fragments. Load such a checkpoint with
  // LoadCheckpointOptions::load_module_strict = false, as DeepSpeed's (Hugging Face's Trainer
  // does so for PEFT models). Default: false.
  bool exclude_frozen_parameters = false;
};

// Stage 3's per-submodule fetch, measured (EngineCore::stage3_stats()).
struct Stage3Stats {
  int64_t units = 0, persistent_units = 0;  // units with parameters; those kept gathered
  int64_t partition_bytes = 0;              // this rank's 1/N
  int64_t persistent_bytes = 0;             // the persistent units, gathered
  int64_t max_live_bytes = 0;               // stage3_max_live_parameters, in bytes
  // The most parameter bytes alive at a unit boundary: the partition plus every gathered
  // buffer whose storage still exists (held by the engine, or by anything else).
  int64_t peak_resident_bytes = 0;
  int64_t fetches = 0, prefetches = 0, fetches_on_demand = 0;
  int64_t kept_for_reuse =
      0;  // releases skipped: the unit is used again within stage3_max_reuse_distance
};

struct PartitionedShards;  // dtrain/zero_init.h

struct InitOptions {
  std::shared_ptr<ProcessGroup>
      group;  // Default: the default group (a group of 1 if there is none).
  // Your own optimizer (DeepSpeed's client optimizer, `deepspeed.initialize(optimizer=...)`),
  // instead of the config's "optimizer" section (give one of the two): any
  // torch::optim::Optimizer with one parameter group, fresh (no state yet), e.g.
  // std::make_shared<torch::optim::RMSprop>(model->parameters(), RMSpropOptions(1e-3)).
  // The engine re-points its group at this rank's flat fp32 partition (the master copy) and
  // calls its step() there with the partition's averaged gradient; its options (lr, betas,
  // weight decay) apply, a config "scheduler" sets the group's lr each step. Checkpoints save
  // its state per rank (torch::serialize) and load it at the same world size.
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  // This rank's shards of a model built by build_partitioned (dtrain/zero_init.h; its
  // initialize() overloads set this): the engine starts from them instead of broadcasting rank
  // 0's whole parameters. REQUIRES zero_optimization.stage 3 and the group they were built for.
  std::shared_ptr<const PartitionedShards> partitioned;
  // Refuse every unknown key of the config, also those DeepSpeed 0.19.8 ignores and dtrain
  // otherwise accepts with a note (ParseOptions::strict, dtrain/zero_config.h). Default: false.
  bool strict_config = false;
};

// DeepSpeed's DynamicLossScaler rules (fp16/loss_scaler.py, 0.19.8): scale =
// 2^initial_scale_power; an overflow lowers the hysteresis counter, and once it is used up
// halves the scale (not below min_loss_scale); the scale doubles at the updates where the
// clean steps since the last overflow, less one, are a positive multiple of loss_scale_window
// (so the first doubling comes after window + 1 clean steps). An overflow once the scale is at
// min_loss_scale and the hysteresis is used up ends the run, as DeepSpeed's does.
class LossScaler {
 public:
  explicit LossScaler(const Fp16Config& c);
  double scale() const { return scale_; }
  // Throws Error (state unchanged) on an overflow the scale cannot absorb any more: already at
  // min_loss_scale with the hysteresis used up (DeepSpeed raises "Current loss scale already at
  // minimum" there).
  void update(bool overflow);
  bool dynamic() const { return dynamic_; }
  // State for checkpoints: scale, iteration, last overflow iteration, hysteresis.
  std::vector<double> state() const {
    return {scale_, double(iter_), double(last_overflow_), double(hysteresis_)};
  }
  void set_state(const std::vector<double>& s);

 private:
  Fp16Config c_;
  bool dynamic_;
  double scale_;
  int64_t iter_ = 0, last_overflow_ = -1;
  int hysteresis_;
};

// DeepSpeed's schedulers (runtime/lr_schedules.py, 0.19.8) as pure functions of DeepSpeed's
// `last_batch_iteration`: -1 before the first optimizer step (the value the scheduler's
// constructor puts into the optimizer: warmup_min_lr, cycle_min_lr, lr_range_test_min_lr, or
// 0 for WarmupCosineLR), then one more after every applied optimizer step (a step skipped by
// an fp16 overflow does not count). So the first two updates of a log warm-up both run at
// warmup_min_lr, as in DeepSpeed. step() advances; lr() and betas() are the values of the
// next update. OneCycle with cycle_momentum sets (beta1, 0.99) for an optimizer with betas,
// as DeepSpeed's does (its beta2 is always 0.99); every other type keeps the base betas.
//
// torch.optim.lr_scheduler's types (SchedulerConfig::is_torch) run as torch 2.11's
// scheduler.step() computes them: the recursive (chainable) formulas on the current rate, in
// double precision as Python's floats, so the rates are bitwise torch's. Their state is
// torch's: last_epoch (0 after the constructor's own step, then one more per applied update;
// last_batch_iteration() is last_epoch - 1), the current rate and, for OneCycleLR with
// cycle_momentum, the momentum it sets (beta1 for an optimizer with betas, else "momentum").
// step() throws Error where torch's raises (OneCycleLR stepped past total_steps).
class LRScheduler {
 public:
  LRScheduler(const SchedulerConfig& c, double base_lr, double base_beta1,
              double base_beta2 = 0.999);
  bool enabled() const { return !c_.type.empty(); }
  void step();
  // DeepSpeed's state_dict()["last_batch_iteration"] (checkpoints carry it).
  int64_t last_batch_iteration() const { return last_batch_iteration_; }
  void set_last_batch_iteration(int64_t i) { last_batch_iteration_ = i; }
  double lr() const;
  // beta1, or the momentum OneCycleLR sets (SGD's momentum is not cycled by DeepSpeed's OneCycle).
  double momentum() const;
  std::pair<double, double> betas() const;
  // OneCycleLR with cycle_momentum: momentum() is the next update's momentum (an optimizer's
  // "momentum", or beta1 of betas()).
  bool cycles_momentum() const;

  // torch.optim.lr_scheduler types: the state torch's state_dict() keeps beyond its arguments.
  struct TorchState {
    int64_t last_epoch = -1, step_count = 0;
    int64_t T_cur = -1, T_i = 0;  // CosineAnnealingWarmRestarts
    double lr = 0, momentum = 0;  // the group's current values (its "lr", momentum or beta1)
  };
  const TorchState& torch_state() const { return ts_; }
  // Resumes at a saved state (checkpoints); last_batch_iteration() follows last_epoch.
  void set_torch_state(const TorchState& s);
  double base_lr() const { return base_lr_; }  // torch's base_lrs[0] (OneCycleLR: initial_lr)

 private:
  double cycle_scale() const;
  void torch_update(bool initial);  // torch_schedulers.cpp
  SchedulerConfig c_;
  double base_lr_, base_beta1_, base_beta2_;
  int64_t last_batch_iteration_ = -1;
  TorchState ts_;
};

// Adam/AdamW on flat CPU arrays (PyTorch's formulas), vectorised by the compiler and split over
// `threads` threads (0: libtorch's intra-op thread count). step >= 1. bias_correction false:
// DeepSpeed's Adam without the 1 - beta^step corrections.
void cpu_adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                   int64_t step, double lr, double beta1, double beta2, double eps,
                   double weight_decay, bool adamw, int threads = 0, bool bias_correction = true);
void cpu_adam_step(double* param, const double* grad, double* exp_avg, double* exp_avg_sq,
                   int64_t n, int64_t step, double lr, double beta1, double beta2, double eps,
                   double weight_decay, bool adamw, int threads = 0, bool bias_correction = true);

// Reads a ZeRO checkpoint (DIR with `latest`, or DIR/TAG) and returns one consolidated state
// dict of the unwrapped model: full-precision parameters (from the optimizer's master copies)
// and buffers. `tag` "" reads DIR/latest.
torch::OrderedDict<std::string, torch::Tensor> consolidated_state_dict(const std::string& dir,
                                                                       const std::string& tag = "");
// Writes a state dict as a pickled {name: tensor} dict (torch.load() reads it in Python).
void save_state_dict(const torch::OrderedDict<std::string, torch::Tensor>& dict,
                     const std::string& path);
torch::OrderedDict<std::string, torch::Tensor> load_state_dict_file(const std::string& path);

namespace detail {

// y = x W^T + b saving W and b themselves for backward (at::linear saves W^T, a view that
// would keep stage 3's gathered weight alive until backward). at::linear's numerics (addmm).
torch::Tensor zero3_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b);

// The non-template engine shared by every Engine<M> (src/zero/engine_impl.h implements it).
// Not thread-safe: one thread drives an engine.
class EngineCore {
 public:
  virtual ~EngineCore() = default;

  virtual void before_forward() = 0;
  // torch_autocast: the engine's device type, and the dtype the forward runs under
  // torch.autocast in; false when the section is off.
  virtual bool forward_autocast(c10::DeviceType* device, c10::ScalarType* dtype) const = 0;
  virtual torch::Tensor backward(const torch::Tensor& loss, const BackwardOptions& options) = 0;
  virtual void step() = 0;
  virtual bool is_gradient_accumulation_boundary() const = 0;
  virtual int64_t global_steps() const = 0;
  virtual int64_t skipped_steps() const = 0;
  virtual int64_t micro_steps() const = 0;
  virtual double loss_scale() const = 0;
  virtual double lr() const = 0;
  virtual std::optional<double> global_grad_norm() const = 0;
  virtual bool step_applied() const = 0;
  virtual int64_t global_samples() const = 0;
  virtual nlohmann::json mom() const = 0;
  virtual void set_gradient_accumulation_boundary(bool is_boundary) = 0;  // UsageError: unmanaged
  virtual void set_no_sync(bool on) = 0;  // UsageError: stages 2-3, or entered twice
  virtual void set_train_batch_size(int64_t train_batch_size) = 0;  // UsageError: indivisible
  virtual void set_train_micro_batch_size(int64_t micro_batch_size) = 0;
  virtual MemoryUsage memory() const = 0;
  // Bytes this rank sent in the engine's collectives during the last optimizer step (from the
  // first backward after the previous boundary through the parameter all-gather), counted
  // from the collectives issued with the volume a ring algorithm sends: all_reduce
  // 2(N-1)/N*B, reduce_scatter/all_gather/reduce (N-1)/N*B (B: the full tensor's bytes).
  virtual int64_t bytes_sent_last_step() const = 0;
  virtual const Config& config() const = 0;
  virtual ProcessGroup& group() = 0;
  // Test hook: the next step's gradients are treated as overflowed (fp16), as if one were inf.
  virtual void inject_overflow() = 0;
  virtual void save_checkpoint(const std::string& dir, const std::string& tag,
                               const SaveCheckpointOptions& o) = 0;
  // Returns the tag loaded ("" when DIR/latest does not exist and no tag was given).
  virtual std::string load_checkpoint(const std::string& dir, const std::string& tag,
                                      const LoadCheckpointOptions& o) = 0;
  // The client_state of the checkpoint the last load_checkpoint read (Engine::client_state).
  virtual const nlohmann::json& client_state() const = 0;
  virtual bool save_16bit_model(const std::string& dir, const std::string& filename,
                                bool exclude_frozen_parameters) = 0;
  virtual int64_t num_parameters() const = 0;

  // The engine's whole state in save_checkpoint's layout, for dtrain::ElasticState (which
  // commits it with the training position, in memory or in one file, and restores it at any
  // world size). model_state: the module file's dict (module, steps, LR scheduler, loss
  // scaler) when `build`, else None; COLLECTIVE at stage 3 (the module is gathered).
  // optim_state: this rank's optimizer file's dict (its slice of the fp32 master and of the
  // optimizer state). load_state: a model dict and every saved rank's optimizer dict in rank
  // order (any number of them: the slices are re-cut for this world size); `where` names
  // the source in errors. Not collective.
  virtual c10::IValue model_state(bool build) = 0;
  virtual c10::IValue optim_state() = 0;
  virtual void load_state(const c10::impl::GenericDict& model,
                          const std::vector<c10::impl::GenericDict>& optims,
                          const LoadCheckpointOptions& options, const std::string& where) = 0;
  virtual torch::nn::Module& module() = 0;
  virtual int rank() const = 0;

  // Stage 3's per-submodule fetch. set_units: the units, each a submodule whose parameters
  // are contiguous in registration order (a no-op below stage 3). A pass runs
  // begin_units(), then unit_begin(u) / unit_end(u, output) around each unit's forward.
  virtual void set_units(const std::vector<std::shared_ptr<torch::nn::Module>>& units) = 0;
  virtual bool fetches_units() const = 0;
  virtual size_t unit_of(const torch::nn::Module& m) const = 0;  // throws UsageError: no unit
  virtual void begin_units() = 0;
  virtual void unit_begin(size_t u) = 0;
  virtual void unit_end(size_t u, const torch::Tensor* output) = 0;
  virtual Stage3Stats stage3_stats() const = 0;
  // Test hook: every fetch event ("launch 2", "forward 2", "end 2", "backward 2", "release 2").
  virtual void set_stage3_trace(std::function<void(const std::string&)> trace) = 0;
};

// torch.autocast around the engine's forward while it lives, as DeepSpeed's autocast_if_enabled
// runs the engine's forward (torch.autocast's __enter__ and __exit__: the thread's autocast
// state for the device set, its nesting counted, the cast cache cleared when the outermost
// scope ends, the previous state restored). With torch_autocast off, nothing - unless CUDA's
// autocast is on outside (torch.is_autocast_enabled()): then, as DeepSpeed, autocast is turned
// off on the engine's device for the forward (a note from rank 0, once).
class ForwardAutocast {
 public:
  explicit ForwardAutocast(const EngineCore& core);
  ~ForwardAutocast();
  ForwardAutocast(const ForwardAutocast&) = delete;
  ForwardAutocast& operator=(const ForwardAutocast&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_ = c10::DeviceType::CPU;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::ScalarType::Undefined;
};

// The engine over `module` (which must outlive it); throws UsageError for a config or module
// it cannot train (naming what to change). COLLECTIVE: broadcasts rank 0's parameters.
std::unique_ptr<EngineCore> make_engine_core(torch::nn::Module& module, Config config,
                                             InitOptions options);

}  // namespace detail

// Wraps a module holder (torch::nn::Linear, a TORCH_MODULE type, nn::Sequential) or a
// std::shared_ptr to a module. Movable, not copyable. Every rank of the group must construct
// it with the same module architecture; rank 0's parameters are broadcast.
template <typename ModuleType>
class Engine {
 public:
  Engine(ModuleType module, Config config, InitOptions options = {})
      : module_(std::move(module)),
        core_(detail::make_engine_core(dtrain::detail::module_ref(module_), std::move(config),
                                       std::move(options))) {
    if constexpr (std::is_same_v<ModuleType, torch::nn::Sequential>) {
      std::vector<std::shared_ptr<torch::nn::Module>> units;
      for (auto& child : *module_) units.push_back(child.ptr());
      core_->set_units(units);
    }
  }

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    detail::ForwardAutocast autocast(*core_);  // torch_autocast
    if constexpr (std::is_same_v<ModuleType, torch::nn::Sequential>) {
      if (core_->fetches_units()) return forward_units(std::forward<Args>(args)...);
    }
    core_->before_forward();  // stage 3: gathers the whole module (units run through fetch())
    return module_->forward(std::forward<Args>(args)...);
  }

  // Stage 3 with a module of your own: declare the submodules that are fetched one at a time
  // (each with contiguous parameters; together they must hold every trainable parameter),
  // then run each of them inside fetch(), in the same order on every rank:
  //   engine.fetch_units({model->encoder.ptr(), model->head.ptr()});
  //   auto h = engine.fetch(*model->encoder, [&] { return model->encoder(x); });
  //   auto y = engine.fetch(*model->head, [&] { return model->head(h); });
  // fetch_units is a no-op below stage 3 (fetch then just calls fn).
  void fetch_units(const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
    core_->set_units(units);
  }
  template <typename Fn>
  decltype(auto) fetch(const torch::nn::Module& unit, Fn&& fn) {
    if (!core_->fetches_units()) return fn();
    const size_t u = core_->unit_of(unit);
    if (u == 0) core_->begin_units();
    core_->unit_begin(u);
    decltype(auto) out = fn();
    if constexpr (std::is_convertible_v<decltype(out), const torch::Tensor&>)
      core_->unit_end(u, &out);
    else
      core_->unit_end(u, nullptr);
    return out;
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }
  // Backward through `loss` (a scalar tensor: a UsageError otherwise) divided by the
  // accumulation steps, times the fp16 loss scale; returns the divided loss, as DeepSpeed's
  // engine.backward returns it. The gradients are reduced as the stage and boundary say.
  torch::Tensor backward(const torch::Tensor& loss, const BackwardOptions& options = {}) {
    return core_->backward(loss, options);
  }
  // At a gradient accumulation boundary, the optimizer step. Then the micro-step counter moves
  // on (every step() call is a micro-step, as in DeepSpeed: call backward() then step() for each
  // micro-batch). UsageError inside no_sync().
  void step() { core_->step(); }
  // DeepSpeed's: whether the current micro-batch (the one whose backward() and step() come
  // next, or are running) ends an accumulation: micro-step + 1 a multiple of
  // gradient_accumulation_steps; what set_gradient_accumulation_boundary() last set; with
  // managed_gradient_accumulation false, true only while step() runs.
  bool is_gradient_accumulation_boundary() const {
    return core_->is_gradient_accumulation_boundary();
  }
  // DeepSpeed's: overrides the micro-step counter's boundary from now on (set it before each
  // micro-batch's backward; the last one's true, then one step() updates):
  //   engine.set_gradient_accumulation_boundary(false);
  //   for (...) engine.backward(loss_of(next_batch()));        // gradient_accumulation_steps - 1
  //   engine.set_gradient_accumulation_boundary(true);
  //   engine.backward(loss_of(next_batch()));
  //   engine.step();
  // UsageError with managed_gradient_accumulation false (the caller owns the boundary there).
  void set_gradient_accumulation_boundary(bool is_boundary) {
    core_->set_gradient_accumulation_boundary(is_boundary);
  }
  // DeepSpeed's engine.no_sync(): while the guard lives, backward() accumulates gradients
  // locally, reducing nothing even at a boundary; the first backward after it at a boundary
  // reduces the sum (stages 0-1; UsageError at stages 2-3, whose partitioned gradients are
  // reduced in every backward, and for a second guard at once). step() inside is a UsageError.
  class NoSync {
   public:
    explicit NoSync(detail::EngineCore& core) : core_(core) { core_.set_no_sync(true); }
    ~NoSync() { core_.set_no_sync(false); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    detail::EngineCore& core_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*core_); }
  // DeepSpeed's engine.zero_grad(): every parameter's gradient of the module to none, as the
  // module's own zero_grad(set_to_none = true). Between the micro-batches of an accumulation it
  // drops what stages 0-1 accumulated so far; stages 2-3 keep what they already reduced.
  void zero_grad() {
    for (auto& p : core_->module().parameters()) p.mutable_grad() = torch::Tensor();
  }
  ModuleType& module() { return module_; }
  int64_t global_steps() const { return core_->global_steps(); }
  // DeepSpeed's engine.global_samples: train_batch_size per optimizer step (skipped ones too);
  // with managed_gradient_accumulation false, the micro-batches' samples each step() took.
  // Saved in checkpoints and restored from them (DeepSpeed's or dtrain's).
  int64_t global_samples() const { return core_->global_samples(); }
  int64_t skipped_steps() const { return core_->skipped_steps(); }
  MemoryUsage memory() const { return core_->memory(); }
  int64_t bytes_sent_last_step() const { return core_->bytes_sent_last_step(); }
  // The loss scale: fp16's loss scaler's, under fp16 torch_autocast its GradScaler's (torch's
  // get_scale()), else 1.
  double loss_scale() const { return core_->loss_scale(); }
  // DeepSpeed's engine.get_global_grad_norm(): the global 2-norm of the averaged gradients at the
  // last optimizer step, before clipping, as DeepSpeed 0.19.8's optimizer for this config keeps
  // it - inf after a skipped step; nullopt where DeepSpeed returns None (before the first step;
  // fp32 at stage 0, its plain torch optimizer; compute_grad_norm false at stages 1-2). Under
  // fp16 it is divided by the loss scale, except with DeepSpeed's FP16_UnfusedOptimizer (stage
  // 0 with an optimizer other than FusedAdam: the scaled norm), and at stage 3 and with its
  // FP16_Optimizer (stage 0, FusedAdam) by the scale after that step's update. Under fp16
  // torch_autocast at stages 1-3, the norm of the GradScaler's scaled gradients.
  std::optional<double> get_global_grad_norm() const { return core_->global_grad_norm(); }
  // DeepSpeed's engine.was_step_applied(): whether the last step() was an optimizer step that
  // was not skipped (false between accumulation boundaries and after an overflow; true after an
  // update fp16 torch_autocast's GradScaler skipped, which DeepSpeed's engine does not see).
  bool was_step_applied() const { return core_->step_applied(); }
  double get_lr() const { return core_->lr(); }
  // DeepSpeed's engine.get_mom(), per param group (dtrain's optimizer has one), as JSON:
  // "momentum" for SGD and RMSprop ([0.9]), "betas" for any other optimizer ([[0.9, 0.999]]:
  // Python's tuple as an array), 0.0 where the group has neither (Adagrad); an integer where
  // DeepSpeed's value is the config's integer. OneCycle's cycled momentum included.
  nlohmann::json get_mom() const { return core_->mom(); }
  const Config& config() const { return core_->config(); }
  // DeepSpeed's batch sizes (as resolved from the config, or as last set below).
  int64_t train_batch_size() const { return config().train_batch_size; }
  int64_t train_micro_batch_size_per_gpu() const { return config().train_micro_batch_size_per_gpu; }
  int64_t gradient_accumulation_steps() const { return config().gradient_accumulation_steps; }
  // DeepSpeed's engine.set_train_batch_size(n) (batch-size warm-up): the micro-batch stays, the
  // accumulation steps become n / (micro-batch x ranks) - a UsageError unless that divides, as
  // DeepSpeed raises ValueError - from the next micro-step's boundary on (the micro-step
  // counter is not reset). The throughput line keeps the batch it started with, as DeepSpeed's.
  void set_train_batch_size(int64_t train_batch_size) {
    core_->set_train_batch_size(train_batch_size);
  }
  // DeepSpeed's set_train_micro_batch_size(n): the accumulation steps stay, the train batch
  // becomes n x steps x ranks (what global_samples() counts).
  void set_train_micro_batch_size(int64_t micro_batch_size) {
    core_->set_train_micro_batch_size(micro_batch_size);
  }
  void save_checkpoint(const std::string& dir, const std::string& tag = "",
                       const SaveCheckpointOptions& o = {}) {
    core_->save_checkpoint(dir, tag.empty() ? "global_step" + std::to_string(global_steps()) : tag,
                           o);
  }
  std::string load_checkpoint(const std::string& dir, const std::string& tag = "",
                              LoadCheckpointOptions o = {}) {
    return core_->load_checkpoint(dir, tag, o);
  }
  // DeepSpeed's client_state (the second value its load_checkpoint returns) of the checkpoint
  // the last load_checkpoint read: the model file's top-level keys that are neither DeepSpeed's
  // nor dtrain's own, as JSON (None, bools, numbers, strings, lists, tuples, dicts with str or
  // int keys); values JSON cannot hold (tensors, other Python objects) are left out. An empty
  // object before a load, or when the checkpoint has none.
  const nlohmann::json& client_state() const { return core_->client_state(); }
  // DeepSpeed's save_16bit_model: the module's state dict ({name: tensor}, the parameters in
  // the model's dtype - fp16/bf16 under mixed precision - and the buffers, in torch's state_dict
  // order) as one torch.save file, DIR/FILENAME, written by rank 0; Python's torch.load (and
  // Hugging Face's from_pretrained for pytorch_model.bin) reads it. Every rank calls it (stage 3
  // gathers the parameters) and returns once the file is there. At stage 3 only with
  // zero_optimization.stage3_gather_16bit_weights_on_model_save, as DeepSpeed: without it
  // nothing is saved, rank 0 says why on stderr, and it returns false.
  // `exclude_frozen_parameters`: DeepSpeed's, the parameters with requires_grad false left out.
  bool save_16bit_model(const std::string& dir, const std::string& filename = "pytorch_model.bin",
                        bool exclude_frozen_parameters = false) {
    return core_->save_16bit_model(dir, filename, exclude_frozen_parameters);
  }
  detail::EngineCore& core() { return *core_; }

 private:
  // Stage 3 on a Sequential: each child is a unit; a torch::nn::Linear child runs through
  // zero3_linear so that its gathered weight is not kept alive until backward.
  template <typename... Args>
  torch::Tensor forward_units(Args&&... args) {
    core_->begin_units();
    auto it = module_->begin();
    if (it == module_->end())
      return module_->forward(std::forward<Args>(args)...);  // its own error
    torch::nn::AnyValue value = [&] {
      if constexpr (sizeof...(Args) == 1) {
        return run_unit(*it, 0, torch::nn::AnyValue(std::forward<Args>(args)...));
      } else {
        core_->unit_begin(0);
        auto out = it->any_forward(std::forward<Args>(args)...);
        core_->unit_end(0, out.template try_get<torch::Tensor>());
        return out;
      }
    }();
    size_t u = 1;
    for (++it; it != module_->end(); ++it, ++u) value = run_unit(*it, u, std::move(value));
    return value.template get<torch::Tensor>();
  }
  torch::nn::AnyValue run_unit(torch::nn::AnyModule& child, size_t u, torch::nn::AnyValue&& in) {
    core_->unit_begin(u);
    auto out = [&] {
      if (auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(child.ptr()))
        if (auto* x = in.template try_get<torch::Tensor>())
          return torch::nn::AnyValue(detail::zero3_linear(*x, linear->weight, linear->bias));
      return child.any_forward(std::move(in));
    }();
    core_->unit_end(u, out.template try_get<torch::Tensor>());
    return out;
  }

  ModuleType module_;
  std::unique_ptr<detail::EngineCore> core_;
};

// The world size the config is resolved for: the group's.
template <typename ModuleType>
Engine<ModuleType> initialize(ModuleType module, const nlohmann::json& config,
                              InitOptions options = {}) {
  if (!options.group) options.group = default_group();
  int world = options.group->world_size();
  return Engine<ModuleType>(std::move(module),
                            parse_config(config, world, {.strict = options.strict_config}),
                            std::move(options));
}
// `config`: a path to a JSON file, or JSON text.
template <typename ModuleType>
Engine<ModuleType> initialize(ModuleType module, const std::string& config,
                              InitOptions options = {}) {
  if (!options.group) options.group = default_group();
  int world = options.group->world_size();
  return Engine<ModuleType>(std::move(module),
                            parse_config_text(config, world, {.strict = options.strict_config}),
                            std::move(options));
}
template <typename ModuleType>
Engine<ModuleType> initialize(ModuleType module, const char* config, InitOptions options = {}) {
  return initialize(std::move(module), std::string(config), std::move(options));
}

}  // namespace dtrain::zero
