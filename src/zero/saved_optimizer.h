// Reading the optimizer files of a ZeRO checkpoint: whole (full_optim: every saved rank's fp32
// master and optimizer state, put together), or a rank's own part only (for_each_saved_part,
// read_overlap): of each saved rank's master and state a rank reads only the elements of the
// flat order it holds now (at another world size too), straight from the file into its own
// part: O(own part) memory, where holding every file and putting them together took O(model).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/checkpoint_files.h"
#include "zero/pickle.h"

namespace dtrain::zero::ckpt {

// The fp32 master (concatenated over the saved ranks) and each optimizer state, unpadded.
struct FullOptim {
  torch::Tensor master;
  std::vector<std::string> state_names;
  std::vector<torch::Tensor> state;
  int64_t step = 0;
};

// Refuses a checkpoint whose optimizer keeps another number of state tensors than this one's,
// or whose one state is Adagrad's on one side only (SGD's momentum is no sum of squares).
void check_state_count(const std::vector<std::string>& saved, const std::vector<std::string>& here);

// `files`: every saved rank's optimizer file as a dict, in rank order; `where` names them;
// `numels`: the parameters' sizes in the flat order (for stage 3's per-parameter layout).
FullOptim full_optim(const std::vector<c10::impl::GenericDict>& files,
                     const std::function<fs::path(int)>& where, const std::vector<int64_t>& numels);

// A vector of elements spread over tensors of a file: the first `used` elements of each, in
// order (DeepSpeed's stage-3 sub-groups; a stage 1/2 partition without its padding).
struct Segments {
  std::vector<std::pair<const PyValue*, int64_t>> parts;
  int64_t numel() const {
    int64_t n = 0;
    for (const auto& p : parts) n += p.second;
    return n;
  }
};

// Elements [begin, end) of the flat order lie at `at` in such a vector.
struct Span {
  int64_t begin, end, at;
};

// Copies into `dest` (the flat order's elements [lo, lo + dest.numel())) what `spans` of `v`
// hold of them; the rest of dest is left as it is.
void read_overlap(const detail::TorchFile& f, const Segments& v, const std::vector<Span>& spans,
                  int64_t lo, const torch::Tensor& dest);

// One saved rank's optimizer file: where its master and state tensors are, not read yet.
struct SavedPart {
  std::unique_ptr<detail::TorchFile> file;
  fs::path path;
  std::string type;  // the optimizer's ("Adam", ..., kClientOptimizerType)
  int64_t step = 0;
  Segments master;
  std::vector<std::pair<std::string, Segments>> state;  // in the file's order
  bool per_parameter = false;  // stage 3's layout, else a contiguous slice of the flat order
  int64_t length = 0;          // contiguous: the slice's elements
  std::vector<Span> spans;     // set by the caller, who knows the other files

  // The state tensors in the order of `names` (rank 0's file's), each required.
  std::vector<const Segments*> state_in(const std::vector<std::string>& names) const {
    std::vector<const Segments*> out;
    for (const auto& n : names) {
      auto it =
          std::find_if(state.begin(), state.end(), [&](const auto& e) { return e.first == n; });
      if (it == state.end())
        throw detail::CheckpointError(path.string() + ": has no optimizer state '" + n +
                                      "' (rank 0's file has it)");
      out.push_back(&it->second);
    }
    return out;
  }
};

// Where a saved rank's file sits among the others. DeepSpeed's own files say neither their
// slice of the flat order nor the step (dtrain's say both); they follow from these, as
// from_deepspeed reads them: stage 1-2's partitions are `P` elements each (the tensor's, the
// last rank's padded), and the step is the base optimizer's first state's, else its first
// param group's, else the steps DeepSpeed applied.
struct SavedRank {
  int rank = 0;
  int64_t numel = 0;          // the flat order's
  int64_t applied_steps = 0;  // the model file's global_steps - skipped_steps
};

// The name under which DeepSpeed's files hold optimizer state `name` of a `type` optimizer:
// Adagrad's sum is "exp_avg_sq" under DeepSpeedCPUAdagrad (offload_optimizer), "sum" under
// torch.optim.Adagrad; `has(n)` says whether the file holds n.
template <typename Has>
std::string deepspeed_state_name(const std::string& name, const std::string& type, Has has) {
  if (has(name) || type != "Adagrad") return name;
  return name == "sum" ? "exp_avg_sq" : name == "exp_avg_sq" ? "sum" : name;
}

// The parameters as a checkpoint holds them, in its order: each one's elements and where they
// lie in the engine's flat order (its offset there).
struct SavedOrder {
  std::vector<int64_t> numels, engine_offsets;
};

// The saved ranks' optimizer files (`files`, in rank order), one open at a time (a checkpoint
// of thousands of ranks needs one file descriptor, not thousands): each is opened, where its
// elements lie in the engine's flat order set (its parameters in the order `saved` lists them)
// and checked, and handed to `fn`; at the end the files are checked to cover the flat order
// exactly, as full_optim checks. Throws before `fn` sees a file found bad. `applied_steps`:
// SavedRank's.
void for_each_saved_part(const std::vector<fs::path>& files, const SavedOrder& saved, int64_t numel,
                         int64_t applied_steps,
                         const std::function<void(int, const SavedPart&)>& fn);

}  // namespace dtrain::zero::ckpt
