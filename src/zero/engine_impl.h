// The ZeRO engine's implementation of detail::EngineCore (include/dtrain/zero.h): the flat
// buffers, their partitioning by stage (zero/partitioning.h), gradient buckets, the optimizer
// on the partition (zero/partition_optimizer.h), and stage 3's fetch (zero/stage3_fetch.h).
// engine.cpp holds the training path, checkpoint_save.cpp and checkpoint_load.cpp the state out
// and in.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dtrain/collectives.h"
#include "dtrain/zero.h"
#include "dtrain/zero_init.h"
#include "parallel/grad_hooks.h"
#include "zero/grad_scaler.h"
#include "zero/overflow_rules.h"
#include "zero/partition_optimizer.h"
#include "zero/partitioning.h"
#include "zero/pickle.h"
#include "zero/throughput_timer.h"

namespace dtrain::zero::detail {

inline int64_t nbytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}
// Gloo moves no bfloat16: its bits travel as float16 (gathers and broadcasts only copy them).
inline torch::Tensor wire(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.view(torch::kHalf) : t;
}
inline torch::Tensor unwire(const torch::Tensor& t, torch::Dtype d) {
  return d == torch::kBFloat16 ? t.view(torch::kBFloat16) : t;
}

class Stage3Fetch;

class EngineImpl final : public EngineCore {
 public:
  EngineImpl(torch::nn::Module& module, Config config, InitOptions options);
  ~EngineImpl() override;

  void before_forward() override;
  bool forward_autocast(c10::DeviceType* device, c10::ScalarType* dtype) const override;
  torch::Tensor backward(const torch::Tensor& loss, const BackwardOptions& options) override;
  void step() override;
  bool is_gradient_accumulation_boundary() const override;
  int64_t global_steps() const override { return global_steps_; }
  int64_t skipped_steps() const override { return skipped_steps_; }
  int64_t micro_steps() const override { return micro_steps_; }
  double loss_scale() const override {
    return amp_scaler_ ? amp_scaler_->value() : scaler_.scale();
  }
  double lr() const override;
  std::optional<double> global_grad_norm() const override { return global_grad_norm_; }
  bool step_applied() const override { return step_applied_; }
  int64_t global_samples() const override { return global_samples_; }
  nlohmann::json mom() const override;
  void set_gradient_accumulation_boundary(bool is_boundary) override;
  void set_no_sync(bool on) override;
  void set_train_batch_size(int64_t train_batch_size) override;
  void set_train_micro_batch_size(int64_t micro_batch_size) override;
  MemoryUsage memory() const override;
  int64_t bytes_sent_last_step() const override { return bytes_last_step_; }
  const Config& config() const override { return config_; }
  ProcessGroup& group() override { return *group_; }
  void inject_overflow() override { inject_overflow_ = true; }
  void save_checkpoint(const std::string& dir, const std::string& tag,
                       const SaveCheckpointOptions& o) override;
  std::string load_checkpoint(const std::string& dir, const std::string& tag,
                              const LoadCheckpointOptions& o) override;
  const nlohmann::json& client_state() const override { return client_state_; }
  bool save_16bit_model(const std::string& dir, const std::string& filename,
                        bool exclude_frozen_parameters) override;
  int64_t num_parameters() const override { return numel_; }
  c10::IValue model_state(bool build) override;
  c10::IValue optim_state() override;
  void load_state(const c10::impl::GenericDict& model,
                  const std::vector<c10::impl::GenericDict>& optims,
                  const LoadCheckpointOptions& options, const std::string& where) override;
  torch::nn::Module& module() override { return module_; }
  int rank() const override { return rank_; }
  void set_units(const std::vector<std::shared_ptr<torch::nn::Module>>& units) override;
  bool fetches_units() const override { return fetch_ != nullptr; }
  size_t unit_of(const torch::nn::Module& m) const override;
  void begin_units() override;
  void unit_begin(size_t u) override;
  void unit_end(size_t u, const torch::Tensor* output) override;
  Stage3Stats stage3_stats() const override;
  void set_stage3_trace(std::function<void(const std::string&)> trace) override;

 private:
  friend class Stage3Fetch;
  struct Bucket {
    std::vector<size_t> params;
    int64_t begin = 0, end = 0;  // flat range
    size_t pending = 0;
    bool launched = false;
  };
  // A partitioned construction's shards fit this engine (stage 3, rank, parameters).
  void check_partitioned(const PartitionedShards& shards) const;
  void gather_parameters();   // partitioned parameters -> full module
  void release_parameters();  // module -> empty views
  void point_params_at(const torch::Tensor& flat);
  void make_buckets();
  void on_grad_ready(size_t i);
  void launch_ready_buckets();
  // overlap_comm: a bucket's reductions run while backward goes on; each partition's segment
  // is added into grad_part_ when it is waited for (settle_in_flight, finish_backward).
  struct InFlight {
    Work work;
    torch::Tensor segment;  // keeps the staging buffer alive until the reduction is done
    int64_t offset = 0;     // into grad_part_ (this rank's segments only)
    bool mine = false;
    size_t bucket = 0;  // index into buckets_ (launched in index order)
  };
  void reduce_bucket(Bucket& b);
  // Waits for the in-flight reductions of buckets older than the one before `newest` and adds
  // them in, so that at most two buckets' staging buffers are alive (DeepSpeed's double buffer).
  void settle_in_flight(size_t newest);
  void fold(InFlight& f);  // wait for f; this rank's segment into grad_part_
  // DeepSpeed reduces gradients in its communication dtype: what a rank sends, and the sum it
  // receives, are rounded to it here (the wire carries the wider dtype).
  // Rounds `t` (the flat gradient range that starts at flat index `at`, -1: not known, stage 0)
  // to the dtype its gradients are communicated in: communication_data_type, or under
  // torch_autocast at stages 1-3 each parameter's own (autocast_ranges_).
  void round_to_comm_dtype(torch::Tensor& t, int64_t at = -1) const;
  // What a rank sends, as DeepSpeed prepares it: in the communication dtype (`source`: the
  // dtype t's values came from), and at stages 1-3 already divided by the world size there
  // (its ZeRO optimizers average before reducing, so a 16-bit sum cannot overflow where the
  // mean would not; its stage-0 engine divides after the reduction, as averaged_gradient does).
  void prepare_to_reduce(torch::Tensor& t, torch::ScalarType source, int64_t at = -1) const;
  void finish_backward();
  // fp16's overflow into the loss scaler: DeepSpeed's ZeRO optimizers' rules at stages 1-3,
  // its FP16_Optimizer's at stage 0 (no hysteresis, scaler_config; no stop at the minimum).
  void record_overflow();
  // After an optimizer step (taken or skipped): DeepSpeed's progress line on rank 0 when
  // steps_per_print and log_level call for it (progress_line in zero_config.h).
  void report_progress() const;
  // step() at an accumulation boundary: the optimizer step (or its skip) and the progress line.
  void take_model_step();
  // Its end, taken or skipped: the gradients zeroed, the step and sample counters on, the
  // progress line.
  void finish_model_step();
  // Its step 4: the optimizer's update of this rank's partition (or the fp32 master) with its
  // averaged gradient `g`.
  void update_partition(const torch::Tensor& g);
  torch::Tensor averaged_gradient();                 // step 1: this rank's, where the master is
  void reduce_to_owners(const torch::Tensor& full);  // partition r's sum lands on rank r
  // The step's small tensors combined over the ranks when each holds part of the gradient.
  void combine_step_scalar(torch::Tensor& t, ReduceOp op);
  void all_gather_params();
  // Stage 3: DeepSpeed's sub-groups (stage3.py's _create_fp16_sub_groups: parameters in order,
  // a sub-group closed once a rank's pieces of them reach sub_group_size elements, and at the
  // last parameter), as the index of each one's first parameter, then the number of parameters.
  std::vector<size_t> stage3_sub_groups() const;
  // fp16 torch_autocast at stage 3: DeepSpeed's optimizer steps each sub-group under the
  // GradScaler, which unscales it and updates itself after it (so a scale that grows on the way
  // unscales the later sub-groups by the new scale). The same for this rank's elements of each
  // sub-group's parameters in `g` (the flat range from `base`); true when one held an inf.
  bool amp_unscale_by_sub_group(torch::Tensor& g, int64_t base);
  // The module file's dict of model_state, built from the parameters as they are now (no
  // gather); without `parameters` they are empty tensors, as in DeepSpeed's stage-3 files of
  // ranks other than 0.
  c10::IValue model_dict(bool parameters);
  // This rank's optimizer file: optim_state's dict, or at stage 3 (`deepspeed_stage3`) the
  // master and each state tensor in DeepSpeed's per-parameter layout (fp32_flat_groups,
  // zero/stage3_layout.h): COLLECTIVE then.
  c10::IValue optim_dict(bool deepspeed_stage3);
  // DeepSpeed's keys of a stage 1/2 optimizer file, added to its optimizer_state_dict `o`
  // (`loss_scaler`: with DeepSpeed's loss scaler object, SaveCheckpointOptions).
  void add_deepspeed_optimizer_keys(const detail::PyPtr& o, bool loss_scaler) const;
  // DeepSpeed's stage-0 "optimizer" of the model file (fp32 training): the state_dict of the
  // optimizer class it builds for the config, stepping the module's parameters (one state per
  // parameter, in the module's order).
  detail::PyPtr deepspeed_stage0_optimizer() const;
  // DeepSpeed's stage-0 "optimizer" under fp16/bf16: the state_dict of the wrapper it builds,
  // FP16_Optimizer around FusedAdam (one flat fp32 group, the base optimizer's state of that one
  // parameter) or FP16_UnfusedOptimizer around any other optimizer (fp32 copies per parameter,
  // deepspeed_stage0_optimizer's state), with the loss-scale keys each writes.
  detail::PyPtr deepspeed_stage0_wrapper() const;
  // DeepSpeed's keys of a stage-3 optimizer file (stage3.py's _rigid_state_dict), added to `o`,
  // which optim_dict(true) made: its groups and state cut into DeepSpeed's sub-groups.
  void add_deepspeed_stage3_keys(const detail::PyPtr& o, bool loss_scaler) const;
  // The param group of the optimizer class DeepSpeed builds for the config, over `params`.
  detail::PyPtr deepspeed_param_group(std::vector<detail::PyPtr> params) const;
  // One parameter's state in that class: its step and the given tensors.
  detail::PyPtr deepspeed_param_state(
      const std::vector<std::pair<std::string, torch::Tensor>>& tensors) const;
  // DeepSpeed 0.19.8's loss scaler object for this engine's scaler.
  detail::PyPtr deepspeed_loss_scaler() const;
  // DeepSpeed's frozen_param_shapes and frozen_param_fragments (its
  // engine._common_checkpoint_state): the module's parameters that are not the engine's
  // (requires_grad false) at stages 2-3, None at stages 0-1 (as DeepSpeed's
  // zero_optimization_partition_gradients says). A fragment is the whole parameter at stage 2
  // (rank 0's one model file) and this rank's piece of it at stage 3 (DeepSpeed's ds_tensor:
  // ceil(numel / N) elements from rank x that on, the last padded with zeros).
  std::pair<detail::PyPtr, detail::PyPtr> deepspeed_frozen_params() const;
  // The module's parameters that are not the engine's: the frozen ones (requires_grad false).
  std::set<std::string> frozen_names() const;
  // The model file as DeepSpeed writes it from model_dict's `model`: its keys, the frozen
  // parameters' (left out with opts.exclude_frozen_parameters), the client_state.
  detail::PyPtr deepspeed_model_file_of(const c10::IValue& model,
                                        const SaveCheckpointOptions& opts) const;
  // The base optimizer's state_dict, and the loss-scale keys beside it in `o` (dtrain's own
  // "state" copy removed from `o`).
  detail::PyPtr deepspeed_base_optimizer(const detail::PyPtr& o, detail::PyPtr states,
                                         std::vector<detail::PyPtr> params, bool loss_scaler) const;
  // A checkpoint of dtrain's (any stage, saved at any world size) but a client optimizer's:
  // `model` is its model file (at `where`), opened, in directory `ckpt`. Of the module's
  // parameters and of every saved rank's fp32 master and optimizer state (the optimizer files
  // opened, not read whole) only what this rank holds is read, from the files into this
  // rank's parts: O(own part) memory above what the engine holds (stages 0-2 read every
  // parameter, which every rank holds, in place). Bitwise what load_state gives.
  // `deepspeed`: DeepSpeed's own files of stages 1-3 (why_not_streamed), their parameters in
  // the saved module's order placed by name, the parameters from their fp32 master as
  // from_deepspeed takes them.
  void load_own_part(TorchFile& model, const std::string& ckpt, const LoadCheckpointOptions& opts,
                     const std::string& where, bool deepspeed = false);
  // The model file's module keys against the model's (load_module_strict): "missing: ...;
  // unexpected: ..." where they differ, "" where they are the same.
  std::string module_keys_differ(const PyValue& model) const;
  // Whether the model file's module and trainable parameters (param_shapes) hold every one of
  // the engine's parameters and no other trainable one: where the keys differ, only in frozen
  // parameters (a checkpoint saved with exclude_frozen_parameters).
  bool only_frozen_keys_differ(const PyValue& model, const std::string& where) const;
  // The gradients zeroed, as after any load.
  void clear_gradients();
  // load_module_strict = false with load_module_only, for a checkpoint whose module keys are
  // not the model's (torch's load_state_dict(strict=False)): the parameters both have from the
  // module in `model` (at `where`), the others as they are, the fp32 master refreshed from them
  // (DeepSpeed's refresh_fp32_params); the saved buffers the model has. From a stage-3 file
  // (placeholders in its module) the values come from its fp32 master, read whole; a stage-3
  // engine keeps its partition's part of them.
  void load_module_subset(TorchFile& model, const std::string& where);
  // A model file's scheduler position, loss scale and step counters; the gradients zeroed.
  void load_counters(const c10::impl::GenericDict& model, const LoadCheckpointOptions& opts,
                     const std::string& where);
  // The module file's buffers and frozen parameters (requires_grad false) into the module.
  void load_buffers(const c10::impl::GenericDict& module_dict);
  void load_buffers(TorchFile& model, const PyValue& module);  // a model file's, read lazily
  // The frozen parameters a stage-3 checkpoint holds as empty placeholders in its module, from
  // its frozen_param_fragments (every saved rank's model file in `ckpt`, as DeepSpeed's load
  // and zero_to_fp32 put them together). `model` is the model file at `model_path`.
  void load_frozen_fragments(const PyValue& model, const std::string& model_path);
  // The optimizer's opaque state (the client optimizer's): only the same kind, world size.
  void load_opaque_state(const std::vector<c10::impl::GenericDict>& optims,
                         const std::string& saved_type, int saved_world, const std::string& where);
  void count(int64_t bytes) { bytes_this_step_ += bytes; }
  torch::Tensor own_slice(const torch::Tensor& full) const {
    return full.narrow(0, rank_ * part_, part_);
  }
  // What offload keeps on the host for a CUDA model, page-locked when its offload section says
  // pin_memory (DeepSpeed 0.19.8's default: true): copies between it and the device go by DMA
  // instead of through a staging buffer. Unchanged on a CPU run.
  torch::Tensor host_side(torch::Tensor t, const OffloadConfig& offload) const {
    return offload.pin_memory && device_.is_cuda() && t.device().is_cpu() ? t.pin_memory() : t;
  }
  // The parameters (model dtype) this rank updates: all, or its partition.
  torch::Tensor own_params() const;
  // What the optimizer updates: the fp32 master when there is one, else own_params().
  torch::Tensor update_target() const { return master_.defined() ? master_ : own_params(); }

  torch::nn::Module& module_;
  Config config_;
  std::shared_ptr<ProcessGroup> group_;
  int rank_ = 0, world_ = 1;
  Partitioning policy_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> offsets_, numels_;
  int64_t numel_ = 0, padded_ = 0, part_ = 0;
  torch::Dtype model_dtype_, master_dtype_;
  torch::Dtype comm_dtype_, accum_dtype_;  // communication_data_type, data_types.grad_accum_dtype
  // torch_autocast at stages 1-3: DeepSpeed reduces each parameter's gradient in its own comm
  // dtype, the autocast dtype for the lower_precision_safe_modules' parameters (these flat
  // ranges, merged) and the parameter's dtype for the rest (comm_dtype_ then).
  bool per_param_comm_ = false;
  std::vector<std::pair<int64_t, int64_t>> autocast_ranges_;
  torch::Dtype autocast_comm_dtype_ = torch::kBFloat16;
  torch::Device device_{torch::kCPU};
  bool mixed_ = false, offload_opt_ = false, offload_param_ = false, gathered_ = false;
  torch::Tensor flat_params_;  // unless parameters are partitioned: the module's are views of it
  torch::Tensor param_part_;   // partitioned parameters: this rank's partition (model dtype)
  torch::Tensor flat_grads_;   // unless gradients are partitioned: the .grad are views of it
  torch::Tensor grad_part_;    // partitioned gradients: this rank's reduced ones (sum over ranks,
                               // over micro-batches in accum_dtype_)
  // Stage 1 with a grad_accum_dtype wider than the model's (fp32 under fp16/bf16): the
  // micro-batches' gradients added up in it (flat_grads_ then holds one micro-batch's).
  torch::Tensor grad_acc_;
  torch::Tensor master_;  // fp32 master (what this rank updates); undefined = the params
  nlohmann::json client_state_ = nlohmann::json::object();  // of the last load_checkpoint
  std::unique_ptr<PartitionOptimizer> optimizer_;
  int64_t opt_step_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<InFlight> in_flight_;
  torch::Tensor staging_;  // synchronous buckets' staging buffer, reused (largest bucket)
  // This backward reduces buckets (partitioned gradients; stage 1 at the boundary).
  bool reduce_in_backward_ = false;
  // Stage 1: the boundary backward reduced flat_grads_ to the owners.
  bool grads_reduced_ = false;
  std::vector<size_t> bucket_of_;
  std::vector<bool> ready_;
  size_t next_bucket_ = 0;
  bool in_backward_ = false;
  int64_t bucket_peak_bytes_ = 0;
  ::dtrain::detail::GradHooks hooks_;
  LossScaler scaler_;
  // fp16 torch_autocast: DeepSpeed's torch.amp.GradScaler (its stage-0 engine's, its ZeRO
  // optimizers' at stages 1-3); null otherwise. Not saved in checkpoints, as DeepSpeed's is not.
  std::unique_ptr<AmpGradScaler> amp_scaler_;
  LRScheduler scheduler_;
  ThroughputTimer tput_{ThroughputTimer::Options{}};  // DeepSpeed's, set up in the constructor
  // DeepSpeed's counters: micro_steps_ moves at the end of every step(), global_samples_ with
  // each optimizer step (global_samples()).
  int64_t micro_steps_ = 0, global_steps_ = 0, skipped_steps_ = 0, global_samples_ = 0;
  std::optional<bool> boundary_override_;  // set_gradient_accumulation_boundary()
  bool no_sync_ = false;                   // inside Engine::no_sync()
  bool running_step_ = false;              // inside step() (the unmanaged boundary)
  int64_t unmanaged_backwards_ = 0;  // managed_gradient_accumulation false: backwards since step()
  bool skips_nonfinite_ = false;     // skips_nonfinite_steps(config_)
  int64_t bytes_this_step_ = 0, bytes_last_step_ = 0;
  double last_grad_norm_ = 0;  // the clipping's global norm of the last step
  GradNormReport grad_norm_report_ = GradNormReport::kNone;  // grad_norm_report(config_)
  std::optional<double> global_grad_norm_;                   // DeepSpeed's get_global_grad_norm()
  bool step_applied_ = false;                                // DeepSpeed's was_step_applied()
  bool inject_overflow_ = false;
  std::vector<std::shared_ptr<torch::nn::Module>> unit_modules_;
  std::unique_ptr<Stage3Fetch> fetch_;
};

}  // namespace dtrain::zero::detail
