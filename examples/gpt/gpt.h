// A small decoder-only transformer (GPT) for character-level language modelling, built from
// dtrain's tensor-parallel layers and laid out as a torch::nn::Sequential so the pipeline can
// split it: [Embedding, Block x n_layers, Head]. Trained in 3D: data parallel over the mesh's
// "dp" dimension, pipeline over "pp", tensor parallel over "tp".
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "dtrain/mesh.h"
#include "dtrain/pipeline.h"

namespace gpt {

struct Config {
  int64_t d_model = 64;
  int64_t n_heads = 4;
  int64_t n_layers = 2;
  int64_t block = 32;  // context length (characters)
  int64_t batch = 16;  // global batch (sequences per step, over all dp ranks)
  int64_t steps = 20;
  double lr = 3e-3;  // Adam
  uint64_t seed = 1;
  dtrain::Schedule schedule = dtrain::Schedule::kOneFOneB;
  int micro_batches = 4;
  int virtual_stages = 1;
};

// The corpus as token ids, and the vocabulary (its distinct bytes), padded to a multiple of
// 8 so any tp in {1, 2, 4, 8} divides it (padding ids never occur).
struct Corpus {
  torch::Tensor ids;  // int64 [n]
  int64_t vocab = 0;  // padded
  int64_t distinct = 0;
};
// Reads a text file; UsageError when it is missing or shorter than block + 1 bytes.
Corpus load_corpus(const std::string& path, int64_t block);

// The model, every stage of it, with the tensor-parallel layers over `tp` (a null or size-1
// group gives the plain model). Uses torch's global RNG: seed it alike on every rank first.
torch::nn::Sequential make_model(const Config& cfg, int64_t vocab,
                                 const std::shared_ptr<dtrain::ProcessGroup>& tp);

struct Result {
  std::vector<double> losses;  // the global mean loss of every step, on every rank
  double seconds = 0;
  int64_t parameters_here = 0;  // parameters this rank holds
};

// Trains cfg.steps steps on `mesh` (dims "dp", "pp", "tp") and returns the loss curve. Step
// s's global batch is the same for every mesh shape (drawn from cfg.seed + s); dp rank d
// trains on its d-th slice, so every mesh shape follows the same curve up to float rounding.
Result train(const Config& cfg, const Corpus& corpus, const dtrain::DeviceMesh& mesh);

}  // namespace gpt
